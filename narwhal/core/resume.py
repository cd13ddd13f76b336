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

Theory of operation: :func:`resumable` says, when a request starts, whether its stream could be
resumed at all (a streaming completions request whose options allow an exact replay), and
:class:`StreamResume` then follows it. The first leg is asked with ``return_token_ids``; every
token and metadata event forwarded to the client hands its ``token_ids`` (and the first leg's
``prompt_token_ids``) to :meth:`StreamResume.saw`, so at any moment the router holds the
prompt's ids and the ids it delivered. After a committed failure the lifecycle asks
:meth:`StreamResume.after_failure` (the fault, ids complete, max_resumes, the request deadline,
the stated sequence length, the retry budget);
a resume is a fresh attempt (new ids, re-placed, the failed engine avoided) whose leg request
(:meth:`StreamResume.leg_request`) is a completions request whose ``prompt`` is the prompt's ids
plus the delivered ids and whose ``max_tokens`` and ``min_tokens`` are reduced by the delivered
count: a fresh prefill on a producer, then decode on a consumer. A resumed leg's events reach the
client rewritten (:meth:`StreamResume.wire`) to the first leg's ``id`` and ``created``, without
the leg's own ``prompt_token_ids``, its usage chunk counting the original prompt and every
delivered token, so the client sees one stream.
"""

from __future__ import annotations

from typing import Any

from narwhal.core import wire
from narwhal.core.config import RecoverySettings
from narwhal.core.errors import Fault
from narwhal.core.records import DecisionLog
from narwhal.core.requests import COMPLETIONS, ClientRequest
from narwhal.core.retry import Deadline, RetryBudget
from narwhal.core.sse import EventKind, SseEvent

RETURN_TOKEN_IDS = "return_token_ids"

# Why a committed stream was not resumed: a bounded set, the /metrics label and the record's.
REFUSAL_REASONS = (
    "endpoint",  # a chat stream: the continuation would need the chat template's token ids
    "guided",  # guided decoding, response_format or tools: the grammar's state restarts
    "n",  # several choices in one stream
    "logprobs",  # logprobs the client asked for
    "echo",  # the prompt echoed back
    "stop",  # stop strings: one straddling the resume point would be missed
    "penalties",  # penalties on generated tokens only: the delivered ones would become prompt
    "no_token_ids",  # an engine did not report the ids of what it sent
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
    if request.endpoint != COMPLETIONS:
        return "endpoint"
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


def resumable(request: ClientRequest, enabled: bool) -> StreamResume | None:
    """The follower of a streaming request's resumes, or None: resuming is off, or the client
    does not stream (a failure before its end is an ordinary retry). A request whose options
    refuse an exact replay is followed too, its ``static`` saying why (:func:`static_refusal`),
    so that its committed failures are counted as refused; its legs are sent as written."""
    if not enabled or not request.stream:
        return None
    return StreamResume(request, static_refusal(request))


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
        "created",
        "delivered",
        "finished",
        "first_leg",
        "ids_lost",
        "model",
        "prompt_ids",
        "refused",
        "request",
        "response_id",
        "resumes",
        "static",
        "strip_ids",
        "usage_sent",
    )

    def __init__(self, request: ClientRequest, static: str | None) -> None:
        self.request = request
        self.static = static  # why no resume could ever be exact (None: it could)
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
        or the continuation from the prompt's ids and the delivered ids (a resumed leg)."""
        request = self.request
        if self.static is not None:
            return request
        body = dict(request.body)
        body[RETURN_TOKEN_IDS] = True
        if not self.first_leg:
            assert self.prompt_ids is not None
            done = len(self.delivered)
            body["prompt"] = [*self.prompt_ids, *self.delivered]
            for key in ("max_tokens", "min_tokens"):
                value = body.get(key)
                if type(value) is int:
                    if key == "min_tokens" and value - done <= 0:
                        del body[key]
                    else:
                        body[key] = value - done
        return ClientRequest(request.request_id, request.endpoint, body, request.arrival)

    def remaining(self) -> int | None:
        """Tokens the client may still get (None: the client set no ``max_tokens``); 0 once a
        forwarded chunk carried a ``finish_reason`` (the sequence ended: a continuation of
        its ids would run past it)."""
        if self.finished:
            return 0
        limit = self.request.body.get("max_tokens")
        return None if type(limit) is not int else limit - len(self.delivered)

    def restarted(self) -> None:
        """A fresh attempt before anything was shown: nothing delivered yet."""
        self.prompt_ids, self.delivered, self.ids_lost = None, [], False
        self.response_id = self.created = self.model = None
        self.finished = self.usage_sent = False

    # ------------------------------------------------------------ the stream

    def saw(self, event: SseEvent) -> None:
        """An event forwarded to the client: take the token ids it reports."""
        if self.static is not None:
            return
        payload = event.payload
        if payload is None:
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
            self.prompt_ids = _int_list(choice.get("prompt_token_ids"))
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
        out = dict(payload)
        if not self.first_leg:
            out["id"], out["created"] = self.response_id, self.created
        choices = payload.get("choices")
        dropped = ("prompt_token_ids", "token_ids") if self.strip_ids else ("prompt_token_ids",)
        if isinstance(choices, list):
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
        writer = wire.ChunkWriter(str(self.response_id), str(self.model), created, chat=False)
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
        if self.resumes >= recovery.max_resumes:
            return "max_resumes"
        if deadline.expired(now):
            return "deadline"
        limit = recovery.resume_max_seq_len
        if limit and len(self.prompt_ids) + len(self.delivered) > limit:
            return "sequence_length"
        return None

    def after_failure(
        self,
        failure: Fault,
        now: float,
        deadline: Deadline,
        recovery: RecoverySettings,
        budget: RetryBudget,
        log: DecisionLog,
    ) -> bool:
        """Whether the committed stream goes on in a fresh attempt after ``failure``; the retry
        budget is taken when it does (the caller releases it when the attempt ends). Logged
        either way: decision ``resume``, ``outcome`` resumed (``reason``: the fault) or refused
        (``reason``: why)."""
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
        return reason is None
