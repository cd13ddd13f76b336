"""Resumable streams: whether a committed stream whose consumer failed may go on elsewhere, and
how the legs that continue it are asked and read.

Rule kept here: the resume decision is made once, here, for the live router and the simulator
alike (the lifecycle only asks), and a stream is resumed only where the replay is exact: the
continuation is asked of the engines by token ids they reported themselves (vLLM's
``return_token_ids``), never by re-tokenised text, and a request whose decoding state a fresh
prefill would not rebuild is refused — guided decoding (``guided_*``, ``structured_outputs``,
``response_format`` other than text, tools), ``n``/``best_of`` over 1, logprobs the client
asked for, ``echo``, stop strings (a stop string straddling the resume point would be missed)
and output-only penalties (``presence_penalty``, ``frequency_penalty``: the delivered tokens
would become prompt). Off (``[recovery] resume_streams = false``) nothing here is consulted and
the request is sent exactly as the client asked.

Chat streams resume too, through the completions endpoint (:mod:`narwhal.core.chat_resume`: the
chat template's prompt ids as the engine reported them, the continuation's chunks rewritten into
the client's chat chunks). A committed stream whose client already has every token (a
``finish_reason`` forwarded, or the output limit reached) is never refused: only its end was
lost, and the router ends it itself.

Theory of operation: :func:`resumable` says, when a request starts, whether its stream could be
resumed at all (a streaming request whose options allow an exact replay), and
:class:`StreamResume` then follows it. The first leg is asked with ``return_token_ids``; every
token and metadata event forwarded to the client hands its ``token_ids`` (and the first leg's
``prompt_token_ids``) to :meth:`StreamResume.saw`, so at any moment the router holds the
prompt's ids and the ids it delivered. After a committed failure the lifecycle asks
:meth:`StreamResume.after_failure`: end (every token delivered), resume (the fault, ids
complete, max_resumes, the request deadline, the stated sequence length, the retry budget), or
refuse; a resume is a fresh attempt (new ids, re-placed, the failed engine avoided) whose leg
request (:meth:`StreamResume.leg_request`) is a completions request whose ``prompt`` is the
prompt's ids plus the delivered ids and whose ``max_tokens`` is the uninterrupted stream's
output limit (:meth:`StreamResume.output_limit`) less the delivered count, ``min_tokens``
reduced likewise: a fresh prefill on a producer, then decode on a consumer. A resumed leg's
events reach the client rewritten (:meth:`StreamResume.wire`) to the first leg's ``id`` and
``created`` (a chat's, into chat chunks), without the leg's own ``prompt_token_ids``, its usage
chunk counting the original prompt and every delivered token, so the client sees one stream.
"""

from __future__ import annotations

from typing import Any

from narwhal.core import wire
from narwhal.core.chat_resume import (
    CONTINUATION_ENDPOINT,
    as_chat_chunk,
    chat_limit,
    chat_refusal,
    continuation_body,
    parsed,
)
from narwhal.core.config import RecoverySettings
from narwhal.core.errors import Fault
from narwhal.core.records import DecisionLog
from narwhal.core.requests import CHAT, ClientRequest
from narwhal.core.retry import Deadline, RetryBudget
from narwhal.core.sse import EventKind, SseEvent

RETURN_TOKEN_IDS = "return_token_ids"
# vLLM's (0.32) CompletionRequest.max_tokens default: a completions request without one (or with
# null) stops after this many tokens
COMPLETIONS_DEFAULT_MAX_TOKENS = 16

# What :meth:`StreamResume.after_failure` decides for a committed stream whose engine failed
RESUME = "resume"  # a fresh attempt continues it
END = "end"  # every token was delivered, only the end lost: the router ends it itself
REFUSE = "refuse"  # the terminal event

# Why a committed stream was not resumed: a bounded set, the /metrics label and the record's.
REFUSAL_REASONS = (
    "guided",  # guided decoding, response_format or tools: the grammar's state restarts
    "n",  # several choices in one stream
    "logprobs",  # logprobs the client asked for
    "echo",  # the prompt echoed back
    "stop",  # stop strings: one straddling the resume point would be missed
    "penalties",  # penalties on generated tokens only: the delivered ones would become prompt
    "media",  # a chat message with media parts: their placeholder ids replay without media
    "reasoning",  # a chat thinking budget: it counts reasoning tokens by the parser's state
    "no_token_ids",  # an engine did not report the ids of what it sent
    "parser",  # a chat delta a reasoning or tool parser shaped (a completions leg would not)
    "open_ended",  # a chat without an output limit and no stated sequence length
    "sequence_length",  # prompt + delivered past recovery.resume_max_seq_len
    "max_resumes",  # recovery.max_resumes already used
    "deadline",  # the request deadline has passed
    "retry_budget",  # the retry budget has no room
    "fault",  # the fault is not one a fresh attempt can mend (a 4xx, the deadline, no engine)
)

_GUIDED = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
)
_LOGPROBS = ("logprobs", "top_logprobs", "prompt_logprobs")


def _set(value: Any) -> bool:
    """Whether an option is in effect (present, not null, not false, not empty)."""
    return value is not None and value is not False and value != [] and value != ""


def static_refusal(request: ClientRequest) -> str | None:
    """Why this request's stream could never be resumed exactly (a :data:`REFUSAL_REASONS`
    value), or None."""
    body = request.body
    if request.endpoint == CHAT:
        chat = chat_refusal(body)
        if chat is not None:
            return chat
    if any(_set(body.get(key)) for key in _GUIDED):
        return "guided"
    response_format = body.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        return "guided"
    for key in ("n", "best_of"):
        count = body.get(key)
        if isinstance(count, int) and count > 1:
            return "n"
    if any(_set(body.get(key)) for key in _LOGPROBS):
        return "logprobs"
    if _set(body.get("echo")):
        return "echo"
    if _set(body.get("stop")):
        return "stop"
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            return "penalties"
    return None


def resumable(request: ClientRequest, enabled: bool, max_seq_len: int = 0) -> StreamResume | None:
    """The follower of a streaming request's resumes, or None: resuming is off, or the client
    does not stream (a failure before its end is an ordinary retry). A request whose options
    refuse an exact replay is followed too, its ``static`` saying why (:func:`static_refusal`),
    so that its committed failures are counted as refused (and a stream that got every token
    still ends cleanly); its legs are sent as written. ``max_seq_len``: the stated sequence
    length (``recovery.resume_max_seq_len``), the context length an open-ended chat runs to."""
    if not enabled or not request.stream:
        return None
    return StreamResume(request, static_refusal(request), max_seq_len)


_ID_FIELDS = (b',"prompt_token_ids":', b',"token_ids":')


def without_ids(raw: bytes) -> bytes:
    """``raw`` (an event's bytes) without its ``prompt_token_ids`` and ``token_ids`` fields,
    cut from the bytes as the engine wrote them (compact JSON, as vLLM writes it), so that what
    is left is byte for byte the event of a request that did not ask for them. A quote outside
    a JSON string is never escaped, so the field names cannot match inside a text; their
    values are int lists. (Other spacing is left as it is: :meth:`StreamResume.wire` then
    re-encodes.)"""
    for name in _ID_FIELDS:
        at = raw.find(name)
        while at >= 0:
            start = at + len(name)
            if raw.startswith(b"null", start):
                end = start + 4
            elif raw.startswith(b"[", start):
                end = raw.find(b"]", start) + 1
            else:
                end = 0
            if end <= start:
                break
            raw = b"".join((raw[:at], raw[end:]))  # (no bytes +: compiled, see setup.py)
            at = raw.find(name, at)
    return raw


def forwarded(resume: StreamResume | None, event: SseEvent) -> bytes:
    """The bytes the client gets for a forwarded ``event`` (as sent when resuming is off)."""
    return event.wire() if resume is None else resume.wire(event)


def relayed(resume: StreamResume | None, events: list[SseEvent]) -> bytes | None:
    """The bytes the client gets for ``events`` read on the transport's relay, or None where
    the decode loop must take them (a resumed leg's events are rewritten there)."""
    if resume is not None and not resume.first_leg:
        return None
    if len(events) == 1:
        return forwarded(resume, events[0])
    return b"".join([forwarded(resume, e) for e in events])


def _int_list(value: Any) -> list[int] | None:
    if not isinstance(value, list):
        return None
    for item in value:
        if type(item) is not int:
            return None
    return value


class StreamResume:
    """One streaming request's resume state: the prompt's and the delivered token ids, the
    resumes made, and the client stream's identity (see the module)."""

    __slots__ = (
        "chat",
        "created",
        "delivered",
        "finished",
        "first_leg",
        "ids_lost",
        "max_seq_len",
        "model",
        "parsed",
        "prompt_ids",
        "refused",
        "request",
        "response_id",
        "resumes",
        "static",
        "strip_ids",
        "usage_sent",
    )

    def __init__(self, request: ClientRequest, static: str | None, max_seq_len: int = 0) -> None:
        self.request = request
        self.static = static  # why no resume could ever be exact (None: it could)
        self.chat = request.endpoint == CHAT
        self.max_seq_len = max_seq_len
        self.parsed = False  # a chat delta an engine's reasoning or tool parser shaped
        self.prompt_ids: list[int] | None = None
        self.delivered: list[int] = []
        self.ids_lost = False  # an event sent to the client without its token ids
        self.resumes = 0
        self.refused: str | None = None  # why the last committed failure was not resumed
        self.first_leg = True  # the leg now streaming is the client stream's first
        self.response_id: Any = None  # the first leg's ``id``, ``created`` and ``model``
        self.created: Any = None
        self.model: Any = None
        # the ids are the router's, not the client's: kept from what the client sees
        self.strip_ids = static is None and request.body.get(RETURN_TOKEN_IDS) is not True
        self.finished = False  # a choice's finish_reason was forwarded: every token was sent
        self.usage_sent = False  # the stream's usage chunk was forwarded

    # ------------------------------------------------------------ the legs

    def leg_request(self) -> ClientRequest:
        """The request the next leg serves: the client's, asked for token ids (the first leg),
        or the continuation from the prompt's ids and the delivered ids (a resumed leg: a
        completions request, a chat's mapped by :func:`continuation_body`)."""
        request = self.request
        if self.static is not None:
            return request
        endpoint = request.endpoint
        if self.first_leg:
            body = dict(request.body)
        else:
            assert self.prompt_ids is not None
            done = len(self.delivered)
            body = continuation_body(request.body) if self.chat else dict(request.body)
            endpoint = CONTINUATION_ENDPOINT
            body["prompt"] = [*self.prompt_ids, *self.delivered]
            left = self.remaining()
            if left is not None:
                body["max_tokens"] = left
            min_tokens = body.get("min_tokens")
            if type(min_tokens) is int:
                if min_tokens - done <= 0:
                    del body["min_tokens"]
                else:
                    body["min_tokens"] = min_tokens - done
        body[RETURN_TOKEN_IDS] = True
        return ClientRequest(request.request_id, endpoint, body, request.arrival)

    def output_limit(self) -> int | None:
        """How many tokens the uninterrupted stream could produce at most, as the pinned vLLM
        bounds it: a completions request's ``max_tokens`` (16 when absent or null); a chat's
        ``max_completion_tokens`` or ``max_tokens``, else the stated sequence length less the
        prompt (vLLM's default is the context length less the prompt); None: unknown."""
        body = self.request.body
        if not self.chat:
            value = body.get("max_tokens")
            if value is None:
                return COMPLETIONS_DEFAULT_MAX_TOKENS
            return value if type(value) is int else None
        limit = chat_limit(body)
        if limit is not None:
            return limit
        if self.max_seq_len and self.prompt_ids is not None:
            return self.max_seq_len - len(self.prompt_ids)
        return None

    def remaining(self) -> int | None:
        """Tokens the client may still get (None: an open-ended chat with no stated sequence
        length); 0 once a forwarded chunk carried a ``finish_reason`` (the sequence ended: a
        continuation of its ids would run past it)."""
        if self.finished:
            return 0
        limit = self.output_limit()
        return None if limit is None else max(0, limit - len(self.delivered))

    def restarted(self) -> None:
        """A fresh attempt before anything was shown: nothing delivered yet."""
        self.prompt_ids, self.delivered, self.ids_lost = None, [], False
        self.parsed = False
        self.response_id = self.created = self.model = None
        self.finished = self.usage_sent = False

    # ------------------------------------------------------------ the stream

    def saw(self, event: SseEvent) -> None:
        """An event forwarded to the client: take the token ids it reports (and, for every
        followed stream, whether a ``finish_reason`` was forwarded)."""
        payload = event.payload
        if payload is None:
            return
        if self.static is not None:
            choices = payload.get("choices")
            if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                self.finished = self.finished or choices[0].get("finish_reason") is not None
            return
        if self.first_leg and self.response_id is None:
            self.response_id, self.created = payload.get("id"), payload.get("created")
            self.model = payload.get("model")
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices:
            if isinstance(payload.get("usage"), dict):
                self.usage_sent = True
            return
        choice = choices[0]
        if not isinstance(choice, dict):
            return
        if choice.get("finish_reason") is not None:
            self.finished = True
        if self.first_leg and self.prompt_ids is None:
            # a chat's on its (role) chunk's top level, a completion's in its choice
            where = payload if self.chat else choice
            self.prompt_ids = _int_list(where.get("prompt_token_ids"))
        if self.chat and self.first_leg and parsed(choice):
            self.parsed = True
        ids = _int_list(choice.get("token_ids"))
        if ids is None:
            if event.kind is EventKind.TOKEN:
                self.ids_lost = True
            return
        self.delivered.extend(ids)

    def wire(self, event: SseEvent) -> bytes:
        """The bytes the client gets for ``event``: as sent, on the first leg, less the token
        ids the client did not ask for (byte for byte what the engine sends a request without
        ``return_token_ids``); on a resumed leg, rewritten into the client's stream (its id and
        created, no prompt ids of its own, token ids only if the client asked, usage counted
        for the whole stream)."""
        payload = event.payload
        if payload is None:
            return event.wire()
        if self.first_leg:
            if not self.strip_ids:
                return event.wire()
            cut = without_ids(event.wire())
            if b'token_ids"' not in cut:  # (an unescaped quote: a field, never a text)
                return cut
        if self.chat and not self.first_leg:  # a completions leg's chunk, as a chat chunk
            out = as_chat_chunk(payload, keep_ids=not self.strip_ids)
            out["model"] = self.model
        else:
            out = dict(payload)
        if self.first_leg:  # (a chat's prompt ids: at the chunk's top level)
            if self.strip_ids:
                out.pop("prompt_token_ids", None)
        else:
            out["id"], out["created"] = self.response_id, self.created
        choices = out.get("choices")
        dropped = ("prompt_token_ids", "token_ids") if self.strip_ids else ("prompt_token_ids",)
        if isinstance(choices, list) and not (self.chat and not self.first_leg):
            out["choices"] = [
                {k: v for k, v in c.items() if k not in dropped} if isinstance(c, dict) else c
                for c in choices
            ]
        usage = payload.get("usage")
        if isinstance(usage, dict) and self.prompt_ids is not None and not self.first_leg:
            prompt, generated = len(self.prompt_ids), len(self.delivered)
            out["usage"] = {
                **usage,
                "prompt_tokens": prompt,
                "completion_tokens": generated,
                "total_tokens": prompt + generated,
            }
        return wire.sse_event(wire.to_json(out))

    def ending(self) -> bytes:
        """The end the router writes itself when every token was delivered and only the end
        was lost: the usage chunk the client asked for (``stream_options.include_usage``) and
        was not sent, counted from the prompt's and the delivered ids, then ``[DONE]``."""
        options = self.request.body.get("stream_options")
        asked = isinstance(options, dict) and options.get("include_usage") is True
        if not asked or self.usage_sent or self.prompt_ids is None:
            return wire.DONE
        created = self.created if type(self.created) is int else 0
        writer = wire.ChunkWriter(str(self.response_id), str(self.model), created, chat=self.chat)
        usage = writer.usage_chunk(len(self.prompt_ids), len(self.delivered))
        return b"".join((usage, wire.DONE))

    # ------------------------------------------------------------ the decision

    def refusal(
        self, failure: Fault, now: float, deadline: Deadline, recovery: RecoverySettings
    ) -> str | None:
        """Why the committed stream may not be resumed after ``failure`` (a
        :data:`REFUSAL_REASONS` value), or None: it may, budget permitting."""
        if self.static is not None:
            return self.static
        if not failure.retryable:
            return "fault"
        if self.prompt_ids is None or self.ids_lost:
            return "no_token_ids"
        if self.parsed:
            return "parser"
        if self.resumes >= recovery.max_resumes:
            return "max_resumes"
        if deadline.expired(now):
            return "deadline"
        limit = recovery.resume_max_seq_len
        if limit and len(self.prompt_ids) + len(self.delivered) > limit:
            return "sequence_length"
        if self.remaining() is None:
            return "open_ended"
        return None

    def after_failure(
        self,
        failure: Fault,
        now: float,
        deadline: Deadline,
        recovery: RecoverySettings,
        budget: RetryBudget,
        log: DecisionLog,
    ) -> str:
        """What follows ``failure`` of the committed stream: :data:`END` when the client
        already has every token (:meth:`remaining` is 0: a ``finish_reason`` was forwarded,
        or the output limit reached) — whatever the fault, the deadline or the budget, only
        the end was lost; else :data:`RESUME`, a fresh attempt, the retry budget taken (the
        caller releases it when the attempt ends); else :data:`REFUSE`. Logged: decision
        ``resume``, ``outcome`` ended or resumed (``reason``: the fault) or refused
        (``reason``: why)."""
        if self.remaining() == 0:
            self.refused = None
            log.add(
                now,
                "resume",
                failure.engine,
                request=self.request.request_id,
                outcome="ended",
                reason=failure.kind.value,
            )
            return END
        reason = self.refusal(failure, now, deadline, recovery)
        if reason is None and not budget.try_acquire():
            reason = "retry_budget"
        if reason is None:
            self.resumes += 1
            self.first_leg = False
            self.refused = None
        else:
            self.refused = reason
        log.add(
            now,
            "resume",
            failure.engine,
            request=self.request.request_id,
            outcome="refused" if reason else "resumed",
            reason=reason or failure.kind.value,
        )
        return REFUSE if reason else RESUME
