"""The engine emulator: a raw ASGI app that speaks vLLM's HTTP protocol, with scripted faults.

Rule kept here: on the wire the emulator behaves as vLLM 0.32 does (docs/contract.md), and
every deviation is a scripted fault; what it generates is deterministic
(:mod:`narwhal.live.emulator.text`) and how long it takes comes from a
:class:`~narwhal.live.emulator.timing.TimingModel`.

Theory of operation:
- ``POST /v1/completions`` and ``/v1/chat/completions``: validation errors are HTTP 400/404 JSON
  before anything is streamed. A streaming request gets HTTP 200 and SSE headers at once (vLLM
  sends them before generating), then (chat) the role chunk, the token chunks (the last one
  carries ``finish_reason``), the usage chunk when ``stream_options.include_usage``, and
  ``data: [DONE]``. An error after the headers is an in-band ``data: {"error": ...}`` then
  ``data: [DONE]``. ``X-Request-Id: <id>`` makes the response id ``cmpl-<id>``
  (``chatcmpl-<id>`` for chat).
- Prefill leg (``kv_transfer_params.do_remote_decode = true`` on an engine that can produce):
  the KV blocks are stored (:mod:`narwhal.live.emulator.kv`) and the response carries the NIXL
  descriptor vLLM's NixlConnector sends; ``remote_host``/``remote_port`` are the emulator's KV side
  channel. A decode-only engine ignores the request for a remote decode (no descriptor).
- Decode leg (``do_remote_prefill = true``): the engine really fetches the blocks with
  ``GET http://<remote_host>:<remote_port>/kv/blocks/<remote_request_id>?engine_id=...`` and
  checks engine id, block ids and prompt. A descriptor missing its identity or with empty block
  ids is ignored with a recompute (vLLM: "Got invalid KVTransferParams"); a failed fetch is an
  in-band 500 (``kv_load_failure_policy = "fail"``) or a silent recompute (``"recompute"``).
- The KV side channel is a second listening socket served by the same app (``/kv/...`` works on
  both ports; the router's ``release_handoff`` uses ``POST /kv/release`` on the HTTP port).
- ``/health``, ``/version``, ``/v1/models``, ``/metrics`` (Prometheus text with vLLM's names),
  and the admin endpoints ``GET|POST|DELETE /admin/faults``, ``GET /admin/state``.
- A client disconnect cancels the request's work (counted as ``aborted``).
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from starlette.datastructures import Headers, QueryParams
from starlette.types import Message, Receive, Scope, Send

from narwhal.core.config import Role
from narwhal.core.jsonparse import parse_json
from narwhal.live.emulator.faults import (
    ENGINE_KINDS,
    FaultBook,
    FaultError,
    FaultSpec,
)
from narwhal.live.emulator.kv import KvStore, normalize_blocks
from narwhal.live.emulator.text import completion_tokens, digest, prompt_text, prompt_tokens
from narwhal.live.emulator.timing import LinearTiming, TimingModel
from narwhal.live.serving import ListenerControl

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
JSON_HEADERS = [(b"content-type", b"application/json")]
DEFAULT_MAX_TOKENS = 16
KV_FETCH_TIMEOUT_S = 5.0
ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
    504: "GatewayTimeoutError",
}


@dataclass
class EmulatorConfig:
    """What the emulated engine is and how it behaves."""

    role: Role = Role.BOTH
    model: str = "tiny-llama"
    version: str = "0.32.0"
    host: str = "127.0.0.1"
    port: int = 0  # the HTTP port (informational: the socket is bound by the runner)
    side_channel: tuple[str, int] | None = None  # the KV side channel host, port
    engine_id: str | None = None
    block_size: int = 16
    kv_lease_s: float = 30.0
    kv_load_failure_policy: str = "fail"  # or "recompute"
    bytes_per_token: int = 2048
    max_model_len: int = 2048
    seed: int = 0
    timing: TimingModel = field(default_factory=LinearTiming)


def _error(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "BadRequestError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def _compact(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _error_event(status: int, message: str) -> bytes:
    return b"data: " + json.dumps(_error(status, message)).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


class _Rejected(Exception):
    """A request refused before anything was sent (HTTP 4xx JSON)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


@dataclass
class _Job:
    """One inference request, parsed."""

    chat: bool
    body: dict[str, Any]
    response_id: str
    created: int
    prompt: str
    prompt_tokens: int
    max_tokens: int
    stream: bool
    include_usage: bool
    kv: dict[str, Any] | None
    producing: bool
    pulling: bool
    fault: FaultSpec | None


class EmulatorApp:
    """An emulated vLLM engine (ASGI 3)."""

    def __init__(self, config: EmulatorConfig, faults: list[FaultSpec] | None = None) -> None:
        self.config = config
        self._rng = random.Random(config.seed)
        identity = random.Random(f"{config.seed}/{config.host}:{config.port}")  # one per engine
        self.engine_id = config.engine_id or str(uuid.UUID(int=identity.getrandbits(128)))
        self.kv = KvStore(self.engine_id, config.block_size, config.kv_lease_s)
        self.faults = FaultBook()
        self.listener: ListenerControl | None = None
        self._pending_engine_faults: list[FaultSpec] = []
        for spec in faults or []:
            self._add_fault_sync(spec)
        self._frozen: anyio.Event | None = None
        self._client: httpx.AsyncClient | None = None
        self.counts: dict[str, int] = dict.fromkeys(
            (
                "requests",
                "prefills",
                "decodes",
                "pulls_ok",
                "pulls_failed",
                "recomputed",
                "aborted",
                "completed",
                "generation_tokens",
                "external_kv_tokens",
                "local_tokens",
                "kv_bytes",
            ),
            0,
        )
        self.running = 0
        self._timers: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ ASGI entry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        raw = await self._body(receive)  # read first: the disconnect watchers share receive()
        if raw is None:
            return
        if path.startswith("/admin/"):
            await self._admin(method, path, raw, send)
            return
        if self._frozen is not None and not await self._wait_thaw(receive):
            return
        if method == "POST" and path in ("/v1/completions", "/v1/chat/completions"):
            chat = path.endswith("chat/completions")
            await self._watched(receive, lambda: self._inference(scope, raw, send, chat))
        elif method == "GET" and path == "/health":
            await self._reply(send, 200, b"", [])
        elif method == "GET" and path == "/version":
            await self._json(send, 200, {"version": self.config.version})
        elif method == "GET" and path == "/v1/models":
            await self._json(send, 200, self._models())
        elif method == "GET" and path == "/metrics":
            await self._reply(
                send,
                200,
                self._metrics().encode(),
                [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")],
            )
        elif method == "GET" and path.startswith("/kv/blocks/"):
            await self._kv_blocks(path.removeprefix("/kv/blocks/"), scope, send)
        elif method == "POST" and path == "/kv/release":
            await self._kv_release(raw, send)
        else:
            await self._json(send, 404, {"detail": "Not Found"})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._client = httpx.AsyncClient(timeout=KV_FETCH_TIMEOUT_S)
                for spec in self._pending_engine_faults:
                    await self._engine_fault(spec)
                self._pending_engine_faults.clear()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._client is not None:
                    await self._client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ------------------------------------------------------------------ small I/O helpers

    @staticmethod
    async def _reply(
        send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> None:
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _json(self, send: Send, status: int, payload: Any) -> None:
        await self._reply(send, status, json.dumps(payload).encode(), JSON_HEADERS)

    @staticmethod
    async def _body(receive: Receive) -> bytes | None:
        parts: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(parts)

    async def _watched(self, receive: Receive, work: Callable[[], Awaitable[bool]]) -> None:
        """Run ``work`` (returns True once its response is complete); a disconnect cancels it."""
        finished = False
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                while True:
                    message: Message = await receive()
                    if message["type"] == "http.disconnect":
                        if not finished:
                            self.counts["aborted"] += 1
                            group.cancel_scope.cancel()
                        return

            async def run() -> None:
                nonlocal finished
                finished = await work()
                group.cancel_scope.cancel()

            group.start_soon(watch)
            group.start_soon(run)

    async def _wait_thaw(self, receive: Receive) -> bool:
        frozen = self._frozen
        if frozen is None:
            return True
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    scope.cancel()

                group.start_soon(watch)
                await frozen.wait()
                group.cancel_scope.cancel()
        return not scope.cancelled_caught

    async def _hang(self, seconds: float | None) -> None:
        """Hang for ``seconds``, or until the client leaves (the watcher cancels us)."""
        if seconds is None:
            await anyio.sleep_forever()
        else:
            await anyio.sleep(seconds)

    @staticmethod
    async def _reset(send: Send) -> None:
        """Drop the connection with a TCP reset (needs uvicorn's h11 server)."""
        cycle = getattr(send, "__self__", None)
        transport = getattr(cycle, "transport", None)
        if transport is None:
            raise RuntimeError("the reset fault needs the emulator to run under uvicorn (h11)")
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
        await anyio.sleep_forever()  # the disconnect watcher ends us

    # ------------------------------------------------------------------ inference

    def _parse(self, scope: Scope, raw: bytes, chat: bool) -> _Job:
        try:
            body = parse_json(raw)
        except ValueError as error:
            raise _Rejected(400, f"JSON decode error: {error}") from None
        if not isinstance(body, dict):
            raise _Rejected(400, "request body must be a JSON object")
        model = body.get("model")
        if model is not None and model != self.config.model:
            raise _Rejected(404, f"The model `{model}` does not exist.", "model")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _Rejected(400, "messages: Field required", "messages")
        elif not isinstance(body.get("prompt"), str | list):
            raise _Rejected(400, "prompt: Field required", "prompt")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        if max_tokens is None:
            max_tokens = DEFAULT_MAX_TOKENS
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise _Rejected(400, f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
        # two of vLLM's own request checks, so a router that forwards what it should drop from
        # the one-token prefill leg (stream_options, min_tokens) fails here as it would there
        if body.get("stream_options") is not None and body.get("stream") is not True:
            raise _Rejected(
                400, "Stream options can only be defined when `stream=True`.", "stream_options"
            )
        min_tokens = body.get("min_tokens", 0)
        if isinstance(min_tokens, int) and min_tokens > max_tokens:
            raise _Rejected(
                400,
                f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                f"got {min_tokens}.",
                "min_tokens",
            )
        text = prompt_text(body, chat)
        limit, prompt_length = self.config.max_model_len, prompt_tokens(text)
        if prompt_length >= limit:  # no room for even one token: vLLM refuses it with a 400
            raise _Rejected(
                400,
                f"The decoder prompt (length {prompt_length}) is longer than the maximum model "
                f"length of {limit}.",
                "prompt",
            )
        # a prompt + max_tokens over the context is clamped, not rejected (as vLLM does)
        max_tokens = min(max_tokens, limit - prompt_length)
        headers = Headers(scope=scope)
        request_id = headers.get("x-request-id") or uuid.UUID(int=self._rng.getrandbits(128)).hex
        kv = body.get("kv_transfer_params")
        kv = kv if isinstance(kv, dict) else None
        remote_decode = kv is not None and kv.get("do_remote_decode") is True
        options = body.get("stream_options")
        stream = body.get("stream") is True
        phase = "prefill" if remote_decode else "decode"
        pulling = kv is not None and kv.get("do_remote_prefill") is True
        return _Job(
            chat=chat,
            body=body,
            response_id=("chatcmpl-" if chat else "cmpl-") + request_id,
            created=int(time.time()),
            prompt=text,
            prompt_tokens=prompt_length,
            max_tokens=max_tokens,
            stream=stream,
            include_usage=stream
            and isinstance(options, dict)
            and options.get("include_usage") is True,
            kv=kv,
            producing=remote_decode and self.config.role.produces,
            pulling=pulling,
            fault=self.faults.take(phase, pulling=pulling),
        )

    async def _inference(self, scope: Scope, raw: bytes, send: Send, chat: bool) -> bool:
        self.counts["requests"] += 1
        try:
            job = self._parse(scope, raw, chat)
        except _Rejected as error:
            await self._json(send, error.status, _error(error.status, error.message, error.param))
            return True
        self.running += 1
        try:
            return await self._serve(job, send)
        finally:
            self.running -= 1

    async def _serve(self, job: _Job, send: Send) -> bool:
        fault = job.fault
        kind = fault.kind if fault else None
        if fault is not None and kind == "hang_headers":
            await self._hang(fault.seconds)
        if kind == "reset":
            await self._reset(send)
        if fault is not None and kind == "status":
            await self._json(send, fault.code, _error(fault.code, "emulated engine failure"))
            return True
        if job.stream:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            await self._stream(job, send)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return True
        return await self._whole(job, send)

    async def _prepare(self, job: _Job) -> str | None:
        """Prefill locally or pull the KV; an error message when the KV load failed."""
        timing = self.config.timing
        if job.pulling and job.kv is not None:
            outcome = await self._pull(job)
            if outcome == "ok":
                self.counts["external_kv_tokens"] += job.prompt_tokens
                await anyio.sleep(timing.kv_transfer_s(job.prompt_tokens))
                return None
            if outcome == "failed" and self.config.kv_load_failure_policy == "fail":
                return "Internal server error"
            self.counts["recomputed"] += 1
        self.counts["local_tokens"] += job.prompt_tokens
        await anyio.sleep(timing.prefill_s(job.prompt_tokens))
        return None

    async def _pull(self, job: _Job) -> str:
        """'ok', 'invalid' (ignored, recomputed) or 'failed' (the fetch itself failed)."""
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
        if job.fault is not None and job.fault.kind == "kv_fetch_fail":
            self.counts["pulls_failed"] += 1
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
            self.counts["pulls_failed"] += 1
            return "failed"
        self.counts["pulls_ok"] += 1
        self.counts["kv_bytes"] += int(entry.get("bytes", 0))
        return "ok"

    def _chunk(self, job: _Job, token: str | None, finish: str | None, role: bool = False) -> bytes:
        if job.chat:
            delta: dict[str, Any] = (
                {"role": "assistant", "content": ""} if role else {"content": token}
            )
            choice: dict[str, Any] = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish,
            }
            kind = "chat.completion.chunk"
        else:
            choice = {
                "index": 0,
                "text": token,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            kind = "text_completion"
        return _compact(
            {
                "id": job.response_id,
                "object": kind,
                "created": job.created,
                "model": self.config.model,
                "choices": [choice],
            }
        )

    def _usage(self, job: _Job, generated: int) -> dict[str, int]:
        return {
            "prompt_tokens": job.prompt_tokens,
            "total_tokens": job.prompt_tokens + generated,
            "completion_tokens": generated,
        }

    async def _stream(self, job: _Job, send: Send) -> None:
        async def emit(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        fault = job.fault
        kind = fault.kind if fault else None
        self.counts["decodes"] += 1
        if fault is not None and kind == "hang_first_token":
            await self._hang(fault.seconds)
        failure = await self._prepare(job)
        if failure is not None:
            await emit(_error_event(500, failure))
            await emit(DONE)
            return
        if kind == "done_first":
            await emit(DONE)
            return
        if job.chat:
            await emit(self._chunk(job, None, None, role=True))
        tokens = completion_tokens(job.prompt, job.max_tokens)
        per_token = self.config.timing.decode_token_s(job.prompt_tokens)
        if fault is not None and kind == "slow":
            per_token = per_token * fault.factor + fault.delay
        stop_at = (
            fault.after
            if fault is not None and kind in ("stall", "close", "inband_error")
            else None
        )
        for index, token in enumerate(tokens):
            if stop_at is not None and index == stop_at:
                break
            await anyio.sleep(per_token)
            frozen = self._frozen
            if frozen is not None:  # like SIGSTOP: running streams stop too, until thawed
                await frozen.wait()
            last = index == len(tokens) - 1
            await emit(self._chunk(job, token, "length" if last else None))
            self.counts["generation_tokens"] += 1
        if fault is not None and stop_at is not None and stop_at < len(tokens):
            if kind == "stall":
                await self._hang(fault.seconds)
            elif kind == "close":
                return
            else:
                await emit(_error_event(fault.code, "emulated in-stream engine error"))
                await emit(DONE)
                return
        if job.include_usage:
            await emit(
                _compact(
                    {
                        "id": job.response_id,
                        "object": "chat.completion.chunk" if job.chat else "text_completion",
                        "created": job.created,
                        "model": self.config.model,
                        "choices": [],
                        "usage": self._usage(job, len(tokens)),
                    }
                )
            )
        await emit(DONE)
        self.counts["completed"] += 1

    async def _whole(self, job: _Job, send: Send) -> bool:
        fault = job.fault
        kind = fault.kind if fault else None
        if fault is not None and kind in ("hang_first_token", "stall"):
            await self._hang(fault.seconds)
        if kind == "close":
            await self._reset(send)
        failure = await self._prepare(job)
        if failure is not None:
            await self._json(send, 500, _error(500, failure))
            return True
        if fault is not None and kind == "inband_error":
            await self._json(send, fault.code, _error(fault.code, "emulated engine error"))
            return True
        count = 0 if kind == "done_first" else job.max_tokens
        tokens = completion_tokens(job.prompt, count)
        per_token = self.config.timing.decode_token_s(job.prompt_tokens)
        if fault is not None and kind == "slow":
            per_token = per_token * fault.factor + fault.delay
        await anyio.sleep(per_token * len(tokens))
        self.counts["generation_tokens"] += len(tokens)
        text = "".join(tokens)
        params = self._produce(job) if job.producing else None
        if job.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": "length",
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": "length",
                "stop_reason": None,
                "prompt_logprobs": None,
            }
        payload = {
            "id": job.response_id,
            "object": "chat.completion" if job.chat else "text_completion",
            "created": job.created,
            "model": self.config.model,
            "choices": [choice],
            "usage": self._usage(job, len(tokens)),
            "kv_transfer_params": params,
        }
        await self._json(send, 200, payload)
        self.counts["completed"] += 1
        return True

    def _produce(self, job: _Job) -> dict[str, Any]:
        """Store the prompt's KV blocks and describe them (as a NixlConnector producer does)."""
        self.counts["prefills"] += 1
        remote_id = f"{job.response_id}-0-{self._rng.getrandbits(32):08x}"
        entry = self.kv.put(remote_id, job.prompt_tokens, digest(job.prompt))
        host, port = self.config.side_channel or (self.config.host, self.config.port)
        params: dict[str, Any] = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": entry.block_ids,
            "remote_engine_id": self.engine_id,
            "remote_request_id": remote_id,
            "remote_host": host,
            "remote_port": port,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": job.prompt_tokens,
            "remote_blocks_expiry_time": None,
            "transfer_mode": "pull",
            "remote_prefill_cached_tokens": 0,
        }
        kind = job.fault.kind if job.fault else None
        if kind == "released_handoff":
            self.kv.release(remote_id)
        elif kind == "bad_descriptor":
            params["remote_block_ids"] = "not-a-list"
        return params

    # ------------------------------------------------------------------ KV side channel

    async def _kv_blocks(self, request_id: str, scope: Scope, send: Send) -> None:
        query = QueryParams(scope.get("query_string", b""))
        result = self.kv.pull(request_id, query.get("engine_id", ""))
        if isinstance(result, str):
            await self._json(send, 404, {"detail": result})
            return
        await self._json(send, 200, result.as_dict(self.config.bytes_per_token))

    async def _kv_release(self, raw: bytes, send: Send) -> None:
        try:
            data = parse_json(raw)
        except ValueError:
            data = None
        params = data.get("kv_transfer_params") if isinstance(data, dict) else None
        request_id = params.get("remote_request_id") if isinstance(params, dict) else None
        if not isinstance(request_id, str):
            await self._json(send, 400, _error(400, "kv_transfer_params.remote_request_id needed"))
            return
        await self._json(send, 200, {"released": self.kv.release(request_id)})

    # ------------------------------------------------------------------ vLLM surfaces

    def _models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.config.model,
                    "object": "model",
                    "created": 0,
                    "owned_by": "vllm",
                    "root": self.config.model,
                    "parent": None,
                    "max_model_len": self.config.max_model_len,
                    "permission": [],
                }
            ],
        }

    def _metrics(self) -> str:
        self.kv.sweep()
        labels = f'engine="0",model_name="{self.config.model}"'
        c = self.counts
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {float(self.running)}",
            "# HELP vllm:prompt_tokens_by_source_total Prompt tokens by source.",
            "# TYPE vllm:prompt_tokens_by_source_total counter",
            f'vllm:prompt_tokens_by_source_total{{{labels},source="external_kv_transfer"}} '
            f"{float(c['external_kv_tokens'])}",
            f'vllm:prompt_tokens_by_source_total{{{labels},source="local_compute"}} '
            f"{float(c['local_tokens'])}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{labels}}} {float(c['generation_tokens'])}",
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{{labels},finished_reason="length"}} '
            f"{float(c['completed'])}",
            "# HELP vllm:nixl_num_kv_expired_reqs_total Requests whose KV blocks expired.",
            "# TYPE vllm:nixl_num_kv_expired_reqs_total counter",
            f"vllm:nixl_num_kv_expired_reqs_total{{{labels}}} {float(self.kv.expired)}",
            "# HELP vllm:nixl_bytes_transferred Bytes transferred per NIXL transfer.",
            "# TYPE vllm:nixl_bytes_transferred histogram",
            f"vllm:nixl_bytes_transferred_sum{{{labels}}} {float(c['kv_bytes'])}",
            f"vllm:nixl_bytes_transferred_count{{{labels}}} {float(c['pulls_ok'])}",
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig.",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="{self.config.block_size}",engine="0"}} 1.0',
        ]
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ admin

    def state(self) -> dict[str, Any]:
        self.kv.sweep()
        return {
            "engine_id": self.engine_id,
            "role": self.config.role.value,
            "running": self.running,
            **self.counts,
            "kv_held": len(self.kv.entries),
            "kv_pulled": self.kv.pulled,
            "kv_released": self.kv.released,
            "kv_expired": self.kv.expired,
            "faults": self.faults.snapshot(),
            "frozen": self._frozen is not None,
            "listening": self.listener.listening if self.listener else True,
        }

    def _add_fault_sync(self, spec: FaultSpec) -> None:
        if spec.kind in ENGINE_KINDS:
            self._pending_engine_faults.append(spec)
        else:
            self.faults.add(spec)

    async def _engine_fault(self, spec: FaultSpec) -> None:
        if spec.kind == "freeze":
            if self._frozen is None:
                self._frozen = anyio.Event()
        elif self.listener is not None:  # refuse
            self.listener.pause()
        if spec.seconds is not None:
            await self._later(spec.seconds, self._thaw_all)

    async def _later(self, seconds: float, job: Callable[[], Awaitable[None]]) -> None:
        async def run() -> None:
            await asyncio.sleep(seconds)
            await job()

        task = asyncio.get_running_loop().create_task(run())
        self._timers.add(task)
        task.add_done_callback(self._timers.discard)

    async def _thaw_all(self) -> None:
        if self._frozen is not None:
            self._frozen.set()
            self._frozen = None
        if self.listener is not None:
            await self.listener.resume()

    async def _admin(self, method: str, path: str, raw: bytes, send: Send) -> None:
        if path == "/admin/state" and method == "GET":
            await self._json(send, 200, self.state())
            return
        if path != "/admin/faults":
            await self._json(send, 404, {"detail": "Not Found"})
            return
        if method == "GET":
            await self._json(send, 200, {"faults": self.faults.snapshot()})
        elif method == "DELETE":
            self.faults.clear()
            await self._thaw_all()
            await self._json(send, 200, {"faults": []})
        elif method == "POST":
            try:
                data = parse_json(raw)
                items = data.get("faults", [data]) if isinstance(data, dict) else data
                if not isinstance(items, list):
                    raise FaultError("expected {'faults': [...]} or one fault object")
                specs = [FaultSpec.from_dict(item) for item in items]
            except (ValueError, FaultError) as error:
                await self._json(send, 400, _error(400, str(error)))
                return
            if isinstance(data, dict) and data.get("replace"):
                self.faults.clear()
            for spec in specs:
                if spec.kind in ENGINE_KINDS:
                    await self._engine_fault(spec)
                else:
                    self.faults.add(spec)
            await self._json(send, 200, {"faults": self.faults.snapshot()})
        else:
            await self._json(send, 405, {"detail": "Method Not Allowed"})
