"""The routers a benchmark compares, and how each is started: one ``RouterSpec`` per router.

``router_spec`` turns a router's name (``ROUTERS``, and the Narwhal variants ``EXTRA`` and
``COMPILED``) into the command line that starts it against a fleet, with the fault-handling
settings of every router set to the closest equivalent of Narwhal's (``narwhal_config``,
``PEER_RESILIENCE``). ``wait_router`` says a router is ready only once a real completion through
it comes back with the expected text. ``NARWHAL_BIN`` (``--narwhal-bin``), ``NARWHAL_NAMED``
(``router_cpu.py --narwhal-bin NAME=PATH``) and ``PEER_POLICY`` (``--peer-policy``) are set by
the scripts before any router starts: one dict each, shared by
every module that imports it, so assign to their keys, never rebind the names.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_loadgen import _expected
from bench_stack import BENCH, MODEL, NODELAY, PEERS_BIN, PROMPT_FILLER, PY, ROOT, Fleet, free_port

NARWHAL = ROOT / ".venv" / "bin" / "narwhal"
NARWHAL_BIN = {"path": NARWHAL}  # --narwhal-bin: e.g. .venv-compiled/bin/narwhal (mypyc build)
ROUTERS = ("narwhal", "vllm-router", "smg", "naive", "aiohttp-relay")
EXTRA = "narwhal-nodelay"  # Narwhal with TCP_NODELAY on its client side (--narwhal-nodelay)
COMPILED = "narwhal-compiled"  # the mypyc build, scripts/build_compiled.sh (--narwhal-compiled)
NARWHAL_COMPILED = ROOT / ".venv-compiled" / "bin" / "narwhal"
# router_cpu.py --narwhal-bin NAME=PATH: more Narwhal executables, each measured under its name
# (e.g. the same build in venvs of two interpreters); filled before any router starts
NARWHAL_NAMED: dict[str, Path] = {}


# The two Python proxies of this folder, each given the fleet as --prefill/--decode URLs: the
# script, and what the report says of its fault handling. aiohttp-relay is the floor of a Python
# relay on Narwhal's HTTP stack.
PYTHON_PROXIES = {
    "naive": (
        "naive_proxy.py",
        "round robin, no retries, no breaker, no timeout but connect (5 s)",
    ),
    "aiohttp-relay": (
        "aiohttp_relay.py",
        "logic-free relay on aiohttp + uvloop: round robin, no timeouts, no checks",
    ),
}


@dataclass
class RouterSpec:
    name: str
    url: str
    argv: list[str]
    flags: str  # what a reader needs to reproduce the fault-handling settings


def narwhal_config(fleet: Fleet, request_timeout: float) -> str:
    lines = [
        "[engine]",
        "first_token_timeout_s = 1.0",
        "decode_read_timeout_s = 1.0",
        f"request_timeout_s = {request_timeout}",
        f"max_handoff_age_s = {min(25.0, request_timeout)}",
        "",
        "[recovery]",
        "eject_after = 2",
        "max_attempts = 2",
        "probe_interval_s = 5.0",
        "",
        "[engine_contract]",
        f'model = "{MODEL}"',
        'vllm_version = "0.32.0"',
        'kv_connector = "NixlConnector"',
    ]
    for engine in fleet.prefills:
        lines += [
            "",
            "[[engines]]",
            f'url = "{engine.url}"',
            'role = "prefill"',
            f'kv_endpoint = "127.0.0.1:{engine.kv_port}"',
        ]
    for engine in fleet.decodes:
        lines += ["", "[[engines]]", f'url = "{engine.url}"', 'role = "decode"']
    return "\n".join(lines) + "\n"


PEER_POLICY = {"policy": "power_of_two"}  # --peer-policy; power_of_two is the closest to
# Narwhal's least-reserved placement (round_robin is the naive proxy's)

PEER_RESILIENCE = [
    # the peers' documented knobs set to the closest equivalent of Narwhal's settings
    "--retry-max-retries", "2",  # = max_attempts 2 (1 would disable retries)
    "--cb-failure-threshold", "2",  # = eject_after 2
    "--cb-timeout-duration-secs", "5",  # = probe_interval_s 5
    "--health-check-interval-secs", "5",
    "--health-failure-threshold", "2",
]  # fmt: skip


def router_spec(name: str, fleet: Fleet, workdir: Path, request_timeout: float) -> RouterSpec:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    timeout = str(int(request_timeout))
    if name in ("narwhal", EXTRA, COMPILED) or name in NARWHAL_NAMED:
        config = workdir / f"narwhal-{port}.toml"
        config.write_text(narwhal_config(fleet, request_timeout))
        argv = [str(NARWHAL_BIN["path"]), "serve", "--config", str(config), "--port", str(port)]
        if name == EXTRA:
            argv[:1] = [str(PY), str(NODELAY)]
        elif name == COMPILED:
            argv[0] = str(NARWHAL_COMPILED)
        elif name in NARWHAL_NAMED:
            argv[0] = str(NARWHAL_NAMED[name])
        flags = (
            "first_token_timeout_s=1, decode_read_timeout_s=1, "
            f"request_timeout_s={timeout}, max_attempts=2, eject_after=2, probe_interval_s=5"
        )
    elif name == "vllm-router":
        argv = [str(PEERS_BIN / "vllm-router"), "--vllm-pd-disaggregation"]
        for engine in fleet.prefills:
            argv += ["--prefill", engine.url]
        for engine in fleet.decodes:
            argv += ["--decode", engine.url]
        argv += [
            "--host", "127.0.0.1", "--port", str(port), "--kv-connector", "nixl",
            "--policy", PEER_POLICY["policy"],
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
            "--request-timeout-secs", timeout, *PEER_RESILIENCE,
        ]  # fmt: skip
        flags = " ".join(
            ["--policy", PEER_POLICY["policy"], "--request-timeout-secs", timeout, *PEER_RESILIENCE]
        )
    elif name == "smg":
        manifest = workdir / f"smg-{port}.json"
        workers = [
            {"url": e.url, "worker_type": "prefill", "kv_connector": "NixlConnector"}
            for e in fleet.prefills
        ] + [
            {"url": e.url, "worker_type": "decode", "kv_connector": "NixlConnector"}
            for e in fleet.decodes
        ]
        manifest.write_text(json.dumps({"version": 1, "workers": workers}))
        argv = [
            str(PEERS_BIN / "smg"), "launch", "--pd-disaggregation",
            "--discovery-provider", "file", "--discovery-file", str(manifest),
            "--host", "127.0.0.1", "--port", str(port),
            "--policy", PEER_POLICY["policy"], "--power-of-two-load-metric", "requests",
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
            "--shutdown-grace-period-secs", "1",
            "--request-timeout-secs", timeout, *PEER_RESILIENCE,
        ]  # fmt: skip
        flags = " ".join(
            [
                f"--policy {PEER_POLICY['policy']} --power-of-two-load-metric requests",
                "--request-timeout-secs",
                timeout,
                *PEER_RESILIENCE,
                "(workers from a --discovery-file manifest with kv_connector NixlConnector)",
            ]
        )
    elif name in PYTHON_PROXIES:
        script, flags = PYTHON_PROXIES[name]
        argv = [str(PY), str(BENCH / script), "--port", str(port)]
        for engine in fleet.prefills:
            argv += ["--prefill", engine.url]
        for engine in fleet.decodes:
            argv += ["--decode", engine.url]
    else:
        raise ValueError(name)
    return RouterSpec(name, url, argv, flags)


def wait_router(spec: RouterSpec, timeout: float) -> None:
    """Ready = a real completion through it comes back with the expected text."""
    import httpx

    body: dict[str, Any] = {"model": MODEL, "prompt": PROMPT_FILLER + "[ready]", "max_tokens": 4}
    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            reply = httpx.post(spec.url + "/v1/completions", json=body, timeout=5)
            if reply.status_code == 200:
                text = reply.json()["choices"][0]["text"]
                if text == _expected(body["prompt"], 4):
                    return
                last = f"text {text!r}"
            else:
                last = f"status {reply.status_code}: {reply.text[:120]}"
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as error:
            last = f"{type(error).__name__}"
        time.sleep(0.3)
    raise RuntimeError(f"{spec.name} at {spec.url} not ready in {timeout:.0f} s (last: {last})")
