"""Where Narwhal's time goes under load: py-spy records ``narwhal serve``, and the samples summed.

``phase_profile`` (``routers.py --profile``) runs Narwhal against one producer and one consumer
under two closed loads (one-token requests, 256-token streams) and records it with py-spy for 8 s
of each; ``summarize_profile`` turns py-spy's raw collapsed stacks into self-time shares by
package and by function and inclusive shares of Narwhal's own functions. The raw stacks are kept,
gzipped, in benchmarks/results/.
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

from bench_routers import router_spec, wait_router
from bench_stack import PEERS_BIN, RESULTS, ROOT, LoadGen, Stack, start_fleet, time_wait


def phase_profile(stack: Stack, loadgen: LoadGen, workdir: Path, stamp: str) -> dict[str, Any]:
    pyspy = PEERS_BIN / "py-spy"
    if not pyspy.exists():
        raise RuntimeError(f"{pyspy} missing: run benchmarks/router/setup_peers.sh")
    fleet = start_fleet(stack, "prof", 1, 1)
    spec = router_spec("narwhal", fleet, workdir, 30.0)
    stack.start("prof-narwhal", spec.argv, router=True)
    out: dict[str, Any] = {}
    try:
        wait_router(spec, 60)
        pid = stack.procs["prof-narwhal"].pid
        for label, tokens in (("requests", 1), ("streaming", 256)):
            raw = workdir / f"narwhal-profile-{label}-{stamp}.txt"
            seconds = 8
            cmd = {
                "cmd": "throughput",
                "target": {"name": "narwhal", "kind": "router", "url": spec.url},
                "concurrency": 16,
                "duration": seconds + 1,
                "warmup": 0.5,
                "max_tokens": tokens,
                "bound": 30.0,
            }
            spy: list[subprocess.Popen[bytes]] = []

            def record(
                raw: Path = raw, spy: list[subprocess.Popen[bytes]] = spy, seconds: int = seconds
            ) -> None:
                argv = [
                    str(pyspy), "record", "--pid", str(pid), "--rate", "200",
                    "--duration", str(seconds), "--format", "raw", "--nonblocking",
                    "--output", str(raw),
                ]  # fmt: skip
                spy.append(stack.start(f"py-spy-{raw.stem}", argv))

            closed_before = time_wait(fleet.decodes[0].port)
            result = loadgen.run(cmd, on_start=record)
            closed = len(time_wait(fleet.decodes[0].port) - closed_before)
            spy[0].wait(seconds + 30)
            stack.procs.pop(f"py-spy-{raw.stem}", None)
            out[label] = summarize_profile(raw)
            out[label]["max_tokens"] = tokens
            out[label]["chunks_per_s"] = result["chunks"] / result["elapsed"]
            out[label]["requests_per_s"] = result["outcomes"].get("ok", 0) / result["elapsed"]
            out[label]["decode_conns_closed_per_100_requests"] = (
                100.0 * closed / result["all_requests"]
            )
            kept = RESULTS / (raw.name + ".gz")
            with raw.open("rb") as src, gzip.open(kept, "wb") as dst:
                shutil.copyfileobj(src, dst)
            out[label]["raw"] = str(kept.relative_to(ROOT))  # py-spy collapsed stacks
    finally:
        stack.stop("prof-narwhal")
        for engine in fleet.prefills + fleet.decodes:
            stack.stop(engine.name)
    return out


def _frame_parts(frame: str) -> tuple[str, str]:
    """'func (path/to/file.py:123)' -> ('func', 'path/to/file.py')."""
    func, _, rest = frame.partition(" (")
    path = rest.rstrip(")").rsplit(":", 1)[0]
    return func, path


def _bucket(path: str) -> str:
    for marker, name in (
        ("narwhal/core/", "narwhal.core"),
        ("narwhal/live/", "narwhal.live"),
        ("narwhal/engines/", "narwhal.engines"),
    ):
        if marker in path:
            return name
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/lib/python3" in path:
        tail = path.split("/lib/python3", 1)[1].split("/", 2)
        return "stdlib:" + (tail[1].split("/")[0].removesuffix(".py") if len(tail) > 1 else "?")
    return path or "?"


def _short(path: str) -> str:
    for marker in ("site-packages/", "/work/main/", "/lib/python3.11/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def summarize_profile(raw: Path) -> dict[str, Any]:
    """Self and inclusive samples per function and self samples per package, from py-spy raw."""
    self_fn: Counter[str] = Counter()
    incl_fn: Counter[str] = Counter()
    pkg: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack_text.split(";") if f]
        if frames and frames[0].startswith("process "):
            frames = frames[1:]
        if frames and frames[0].startswith("thread "):
            frames = frames[1:]
        if not frames:
            continue
        total += count
        func, path = _frame_parts(frames[-1])
        self_fn[f"{_short(path)}:{func}"] += count
        pkg[_bucket(path)] += count
        seen = set()
        for frame in frames:
            f, p = _frame_parts(frame)
            key = f"{_short(p)}:{f}"
            if key not in seen:
                seen.add(key)
                incl_fn[key] += count

    def share(counter: Counter[str], top: int) -> list[list[Any]]:
        return [[k, round(100.0 * v / total, 1)] for k, v in counter.most_common(top)]

    narwhal_incl = Counter({k: v for k, v in incl_fn.items() if k.startswith("narwhal/")})
    return {
        "samples": total,
        "self_by_package_pct": share(pkg, 15),
        "self_by_function_pct": share(self_fn, 25),
        "inclusive_narwhal_functions_pct": share(narwhal_incl, 25),
    }
