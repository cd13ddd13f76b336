"""The router's block identity against the installed vLLM's own hasher (no engine started):
random token ids, both SHA-256 algorithms, with and without PYTHONHASHSEED and a cache salt."""

from __future__ import annotations

import json
import os
import random
import subprocess

import pytest

from narwhal.core.routing.block_identity import VllmBlockHasher
from tests.vllm.conftest import VENV

pytestmark = pytest.mark.vllm

# runs inside the vLLM venv: vLLM's hasher over the ids given on stdin, the events' int form
_VLLM_SIDE = """
import json, sys, types
sys.modules.setdefault("msgpack", types.ModuleType("msgpack"))  # not needed by the hasher
from vllm.v1.core import kv_cache_utils as k
from vllm.utils.hashing import get_hash_fn_by_name
job = json.load(sys.stdin)
fn = get_hash_fn_by_name(job["algo"])
k.init_none_hash(fn)
ids, size, parent, out = job["ids"], job["block_size"], None, []
for s in range(0, len(ids) // size * size, size):
    extra = (("cache_salt", job["salt"]),) if s == 0 and job["salt"] else None
    parent = k.hash_block_tokens(fn, parent, ids[s:s + size], extra)
    out.append(k.maybe_convert_block_hash(parent))
print(json.dumps(out))
"""


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("seed", [None, "1234"])
@pytest.mark.parametrize("salt", [None, "tenant-a"])
def test_chain_matches_vllm(algo: str, seed: str | None, salt: str | None) -> None:
    python = VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no vLLM venv at {VENV}")
    rng = random.Random(f"{algo}{seed}{salt}")
    ids = [rng.randrange(0, 150_000) for _ in range(16 * 7 + 5)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    job = {"algo": algo, "ids": ids, "block_size": 16, "salt": salt}
    done = subprocess.run(
        [str(python), "-c", _VLLM_SIDE],
        input=json.dumps(job),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    want = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(want) == 7
    assert VllmBlockHasher(algo=algo, seed=seed).chain(ids, salt) == want
