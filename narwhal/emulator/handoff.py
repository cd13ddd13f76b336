"""The KV handoff, both sides: a producer stores and describes a prompt's blocks, a consumer
really pulls them over the producer's side channel.

Rule kept here: a consumer's KV load succeeds only if the producer still holds the handoff and
its engine id, block ids and prompt all match (:class:`~narwhal.emulator.kv.KvStore`), so a bad
descriptor or a released handoff really fails; a descriptor that lacks its identity or has no
blocks is ignored with a local recompute, as vLLM does ("Got invalid KVTransferParams").

Theory of operation:
- Producer: :meth:`Handoff.produce` stores the prompt's blocks under a fresh
  ``remote_request_id`` and returns NixlConnector ``kv_transfer_params``
  (:func:`narwhal.core.wire.nixl_kv_params`) naming the side channel as ``remote_host`` and
  ``remote_port``; ``release_handoff`` drops the blocks at once, ``bad_descriptor`` spoils
  ``remote_block_ids``.
- Both: the prefix cache (:mod:`narwhal.emulator.prefix_cache`) is looked up first; a prefill
  computes, and a pull moves, only the tokens after the cached prefix (vLLM's NixlConnector
  pulls only what the consumer's own cache lacks), and the prompt's blocks are cached after.
- Consumer: :meth:`Handoff.prepare` pulls with
  ``GET http://<remote_host>:<remote_port>/kv/blocks/<remote_request_id>?engine_id=...``
  (``kv_transfer_fail`` fails it without asking), or prefills locally. A failed pull is an
  error under ``kv_load_failure_policy = "fail"`` and a silent recompute under ``"recompute"``.
- The side channel's endpoints, served by the same app on both ports:
  ``GET /kv/blocks/{id}`` (:meth:`Handoff.blocks`) and ``POST /kv/release``
  (:meth:`Handoff.release`, which the router's ``release_handoff`` calls).
"""

from __future__ import annotations

import anyio
import httpx
from starlette.datastructures import QueryParams
from starlette.types import Scope, Send

from narwhal.core import wire
from narwhal.core.jsonparse import parse_json
from narwhal.emulator.asgi import error_reply, json_reply
from narwhal.emulator.kv import normalize_blocks
from narwhal.emulator.request import InferenceJob
from narwhal.emulator.state import EngineState
from narwhal.emulator.text import digest

KV_FETCH_TIMEOUT_S = 5.0
LOAD_FAILED = "Internal server error"  # vLLM's message when a KV load fails under "fail"


class Handoff:
    """One emulated engine's side of KV handoffs."""

    def __init__(self, state: EngineState) -> None:
        self.state = state
        self._client: httpx.AsyncClient | None = None  # for pulls; open while the app runs

    async def open(self) -> None:
        self._client = httpx.AsyncClient(timeout=KV_FETCH_TIMEOUT_S)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    # ------------------------------------------------------------------ producer

    def produce(self, job: InferenceJob) -> dict[str, object]:
        """Store the prompt's KV blocks and describe them as a NixlConnector producer does."""
        state, config = self.state, self.state.config
        state.counts["prefills"] += 1
        remote_id = f"{job.response_id}-0-{state.rng.getrandbits(32):08x}"
        entry = state.kv.put(remote_id, job.prompt_tokens, digest(job.prompt))
        host, port = config.side_channel or (config.host, config.port)
        params = wire.nixl_kv_params(
            block_ids=entry.block_ids[0],
            engine_id=state.engine_id,
            request_id=remote_id,
            host=host,
            port=port,
            num_tokens=job.prompt_tokens,
            cached_tokens=job.cached_tokens,
        )
        kind = job.fault_kind
        if kind == "release_handoff":
            state.kv.release(remote_id)
        elif kind == "bad_descriptor":
            params["remote_block_ids"] = "not-a-list"
        return params

    # ------------------------------------------------------------------ consumer

    async def prepare(self, job: InferenceJob) -> str | None:
        """Prefill locally or pull the KV, either only past what the prefix cache holds; an
        error message when the KV load failed."""
        state, timing, cache = self.state, self.state.config.timing, self.state.prefix_cache
        job.cached_tokens = cache.lookup(job.prompt, job.prompt_tokens)
        missing = job.prompt_tokens - job.cached_tokens
        if job.pulling and job.kv is not None:
            outcome = await self._pull(job)
            if outcome == "ok":
                state.counts["external_kv_tokens"] += missing
                await anyio.sleep(timing.kv_transfer_s(missing))
                cache.insert(job.prompt)
                return None
            if outcome == "failed" and state.config.kv_load_failure_policy == "fail":
                return LOAD_FAILED
            state.counts["recomputed"] += 1
        state.counts["local_tokens"] += missing
        await anyio.sleep(timing.prefill_s(missing))
        cache.insert(job.prompt)
        return None

    async def _pull(self, job: InferenceJob) -> str:
        """'ok', 'invalid' (ignored, recomputed) or 'failed' (the fetch itself failed)."""
        counts = self.state.counts
        kv = job.kv or {}
        request_id, engine_id = kv.get("remote_request_id"), kv.get("remote_engine_id")
        host, port = kv.get("remote_host"), kv.get("remote_port")
        blocks = normalize_blocks(kv.get("remote_block_ids"))
        if (
            not (request_id and engine_id and host and isinstance(port, int))
            or not blocks
            or not any(blocks)
        ):
            return "invalid"
        if job.fault_kind == "kv_transfer_fail":
            counts["pulls_failed"] += 1
            return "failed"
        assert self._client is not None
        try:
            response = await self._client.get(
                f"http://{host}:{port}/kv/blocks/{request_id}", params={"engine_id": engine_id}
            )
            entry = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            entry = None
        if (
            not isinstance(entry, dict)
            or entry.get("block_ids") != blocks
            or entry.get("digest") != digest(job.prompt)
        ):
            counts["pulls_failed"] += 1
            return "failed"
        counts["pulls_ok"] += 1
        counts["kv_bytes"] += int(entry.get("bytes", 0))
        return "ok"

    # ------------------------------------------------------------------ side channel

    async def blocks(self, request_id: str, scope: Scope, send: Send) -> None:
        """``GET /kv/blocks/{id}?engine_id=...``: hand the blocks over once."""
        query = QueryParams(scope.get("query_string", b""))
        result = self.state.kv.pull(request_id, query.get("engine_id", ""))
        if isinstance(result, str):
            await json_reply(send, 404, {"detail": result})
            return
        await json_reply(send, 200, result.as_dict(self.state.config.bytes_per_token))

    async def release(self, raw: bytes, send: Send) -> None:
        """``POST /kv/release`` with ``{"kv_transfer_params": descriptor}``."""
        try:
            data = parse_json(raw)
        except ValueError:
            data = None
        params = data.get("kv_transfer_params") if isinstance(data, dict) else None
        request_id = params.get("remote_request_id") if isinstance(params, dict) else None
        if not isinstance(request_id, str):
            await error_reply(send, 400, "kv_transfer_params.remote_request_id needed")
            return
        await json_reply(send, 200, {"released": self.state.kv.release(request_id)})
