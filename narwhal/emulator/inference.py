"""The inference paths of an emulated engine: a streamed reply or a whole one, and the faults
that act on a request.

Rule kept here: on the wire the emulator behaves as vLLM 0.32's OpenAI server does and every
deviation is a scripted fault; every shape it writes (chunks, the usage chunk, error objects,
``[DONE]``, completion and prefill replies) comes from :mod:`narwhal.core.wire`, the tokens from
:mod:`narwhal.emulator.text` and every duration from the configured
:class:`~narwhal.emulator.timing.TimingModel`.

Theory of operation: :meth:`Inference.handle` parses the request (a refusal is vLLM's 4xx
JSON) and serves it. Before anything is sent, ``hang_headers`` hangs, ``reset`` resets the
connection and ``http_5xx`` answers its ``code``. A streaming request then gets HTTP 200 and SSE
headers at once (vLLM sends them before generating), its prefill or KV pull, (chat) the role
chunk, the token chunks (the last one carries ``finish_reason``; with ``return_token_ids`` each
carries its ``token_ids`` and the first the ``prompt_token_ids`` — a chat's role chunk, at its
top level — as vLLM's), the usage chunk when
``stream_options.include_usage`` and ``data: [DONE]``; an error after the headers is an in-band
error event, then ``[DONE]``. The stream faults act after ``after_tokens`` tokens (after the
last one: before the usage chunk and ``[DONE]``, only the end lost): ``stall``
goes silent, ``disconnect`` ends the body without ``[DONE]``, ``early_done`` sends ``[DONE]``,
``inband_error`` an error event. A whole reply acts them out as a non-streaming vLLM would show
them: a hang, a reset, a truncated completion, an HTTP error. While the engine is hung or
frozen no step runs: nothing is prefilled, pulled or generated
(:meth:`~narwhal.emulator.acting.FaultActor.wait_step`). A prefill leg on a producer adds the
KV handoff's ``kv_transfer_params`` (:mod:`narwhal.emulator.handoff`). With prefix caching on,
the usage (the whole reply's, the usage chunk's) carries ``prompt_tokens_details.cached_tokens``:
the tokens this engine's prefix cache held, or, for a consumer that pulled the KV, the
producer's (``remote_prefill_cached_tokens``), as vLLM reports them.
"""

from __future__ import annotations

import anyio
from starlette.types import Scope, Send

from narwhal.core import wire
from narwhal.core.injected_faults import STREAM_FAULTS
from narwhal.emulator.acting import FaultActor
from narwhal.emulator.asgi import SSE_HEADERS, bytes_reply, error_reply
from narwhal.emulator.handoff import Handoff
from narwhal.emulator.request import InferenceJob, Rejected, parse_job
from narwhal.emulator.state import EngineState
from narwhal.emulator.surfaces import kv_blocks
from narwhal.emulator.text import completion_tokens, token_ids


class Inference:
    """``POST /v1/completions`` and ``/v1/chat/completions`` of one emulated engine."""

    def __init__(self, state: EngineState, actor: FaultActor, handoff: Handoff) -> None:
        self.state = state
        self.actor = actor
        self.handoff = handoff

    async def handle(self, scope: Scope, raw: bytes, send: Send, chat: bool) -> bool:
        """Serve one request; True once its response is complete."""
        state = self.state
        state.counts["requests"] += 1
        try:
            job = parse_job(state, self.actor.book, scope, raw, chat)
        except Rejected as error:
            await bytes_reply(send, error.status, error.body())
            return True
        blocks = kv_blocks(state.config.block_size, job.prompt_tokens + job.max_tokens)
        state.running += 1
        state.running_kv_blocks += blocks
        try:
            return await self._serve(job, send)
        finally:
            state.running -= 1
            state.running_kv_blocks -= blocks

    async def _serve(self, job: InferenceJob, send: Send) -> bool:
        fault, kind = job.fault, job.fault_kind
        if fault is not None and kind == "hang_headers":
            await self.actor.hang(fault.seconds)
        if kind == "reset":
            await self.actor.reset(send)
        if fault is not None and kind == "http_5xx":
            await error_reply(send, fault.code, "emulated engine failure")
            return True
        if job.stream:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            await self._stream(job, send)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return True
        return await self._whole(job, send)

    def _per_token_s(self, job: InferenceJob) -> float:
        per_token = self.state.config.timing.decode_token_s(job.prompt_tokens)
        if job.fault is not None and job.fault.kind == "slow":
            per_token = per_token * job.fault.factor + job.fault.delay
        return per_token

    async def _stream(self, job: InferenceJob, send: Send) -> None:
        async def emit(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        state, fault, kind = self.state, job.fault, job.fault_kind
        state.counts["decodes"] += 1
        if fault is not None and kind == "hang_first_token":
            await self.actor.hang(fault.seconds)
        await self.actor.wait_step()
        failure = await self.handoff.prepare(job)
        if failure is not None:
            await emit(wire.error_event(500, failure))
            await emit(wire.DONE)
            return
        writer = wire.ChunkWriter(job.response_id, state.config.model, job.created, chat=job.chat)
        with_ids = job.body.get("return_token_ids") is True
        if job.chat:  # vLLM's chat stream: the rendered prompt's ids ride on the role chunk
            await emit(writer.role_chunk(token_ids(job.prompt) if with_ids else None))
        tokens = completion_tokens(job.prompt, job.max_tokens)
        per_token = self._per_token_s(job)
        stop_at = fault.after_tokens if fault is not None and kind in STREAM_FAULTS else None
        for index, token in enumerate(tokens):
            if stop_at is not None and index == stop_at:
                break
            await anyio.sleep(per_token)
            await self.actor.wait_step()
            finish = "length" if index == len(tokens) - 1 else None
            if with_ids:  # vLLM's return_token_ids: the prompt's ids ride on the first chunk
                prompt_ids = token_ids(job.prompt) if index == 0 and not job.chat else None
                chunk = writer.token_chunk(token, finish, token_ids(token, bos=False), prompt_ids)
            else:
                chunk = writer.token_chunk(token, finish)
            await emit(chunk)
            state.counts["generation_tokens"] += 1
        if fault is not None and stop_at is not None and stop_at <= len(tokens):
            if kind == "stall":
                await self.actor.hang(fault.seconds)
            elif kind == "disconnect":
                return
            else:
                if kind == "inband_error":
                    await emit(wire.error_event(fault.code, "emulated in-stream engine error"))
                await emit(wire.DONE)
                return
        if job.include_usage:
            cached = job.reported_cached_tokens(state.config.prefix_caching)
            await emit(writer.usage_chunk(job.prompt_tokens, len(tokens), cached))
        await emit(wire.DONE)
        state.counts["completed"] += 1

    async def _whole(self, job: InferenceJob, send: Send) -> bool:
        state, fault, kind = self.state, job.fault, job.fault_kind
        if fault is not None and kind in ("hang_first_token", "stall"):
            await self.actor.hang(fault.seconds)
        if kind == "disconnect":
            await self.actor.reset(send)
        await self.actor.wait_step()
        failure = await self.handoff.prepare(job)
        if failure is not None:
            await error_reply(send, 500, failure)
            return True
        if fault is not None and kind == "inband_error":
            await error_reply(send, fault.code, "emulated engine error")
            return True
        count = job.max_tokens
        if fault is not None and kind == "early_done":
            count = min(count, fault.after_tokens)
        tokens = completion_tokens(job.prompt, count)
        await anyio.sleep(self._per_token_s(job) * len(tokens))
        state.counts["generation_tokens"] += len(tokens)
        params = self.handoff.produce(job) if job.producing else None
        reply = wire.completion_reply(
            job.response_id,
            state.config.model,
            job.created,
            "".join(tokens),
            prompt_tokens=job.prompt_tokens,
            completion_tokens=len(tokens),
            chat=job.chat,
            kv_transfer_params=params,
            cached_tokens=job.reported_cached_tokens(state.config.prefix_caching),
        )
        await bytes_reply(send, 200, wire.to_json(reply))
        state.counts["completed"] += 1
        return True
