"""The contract's two engine legs, written once for every caller: the request lifecycle, the
readmission probes, ``narwhal preflight`` and ``EngineClient``.

Rule kept here: how a prefill leg is sent and read (the one-token body, the producer's reply, the
KV descriptor's validation) and how a decode stream is opened and read (the first-token and
silence deadlines, and what ends it: ``[DONE]``, ``[DONE]`` before any token, an in-band error,
malformed data, a close before ``[DONE]``) is decided here and nowhere else. Every outcome is a
:class:`~narwhal.core.errors.Fault` value or a result; nothing here raises for an engine fault.

Theory of operation: :func:`prefill_leg` builds the producer's body from the client request, calls
the producer under ``min(deadline, start + max_handoff_age_s)`` and reads the reply with
:func:`read_prefill_reply` into a :class:`PrefillOutcome` (the descriptor and the prompt tokens
the reply reports, or the fault, and when the reply came, which is the request's ``ttft_s``).
A :class:`DecodeLeg` is one decode stream:
:meth:`DecodeLeg.open` opens it under the first-token deadline, and :meth:`DecodeLeg.read` (sans-IO)
says what one transport read under :attr:`DecodeLeg.deadline` means (:meth:`DecodeLeg.next_read`
awaits the read and reads it). The deadline of each read is ``first_token_at`` until the first
generated token, then ``arrival + decode_read_timeout_s`` (or the request deadline when that is 0)
after every chunk, never past the request deadline; after a write to the client, silence is
measured from when the router turned back to the stream (:meth:`DecodeLeg.resumed`: the engine
is not silent while the router is not reading it). A read returns its ``(arrival time, event)``
pairs (tokens, metadata and the final ``[DONE]``); a read that shows a fault still returns the
events before it and sets :attr:`DecodeLeg.fault`. The lifecycle awaits each read itself and
forwards its events in one write; ``EngineClient`` yields them; probes and preflight only need
:meth:`DecodeLeg.read_to_end`.

Why a committed stream has a second way in, :meth:`DecodeLeg.forwardable` and
:meth:`DecodeLeg.forwarded` (the lifecycle's ``_relay``, which the live transport calls from its
read callback, :meth:`~narwhal.core.ports.Transport.relay_reads`): a read that is only whole token
and metadata events, after the first token, is taken where it arrives instead of waking the
request's task and its chain of coroutines. Everything it decides is :meth:`read`'s (it takes
nothing :meth:`read` would treat differently, declines the rest untouched, and restarts the silence
timer the same way), so it is a shortcut, not a second set of rules. Reading every chunk through
the decode loop instead costs nearly 40 % more per chunk, far past the counter's run-to-run spread
(a 1-token request: 0.832 M to 0.904 M in four runs): 79 k instructions per paced chunk against 57
k, a 64-token request 5.83 M against 4.45 M (pure build, Debian's python3.11; pyenv's unoptimised
3.11.7: 87 k against 62 k), counted by ``.venv/bin/python benchmarks/router/router_instructions.py
--tokens 64 --decode-s-per-token 0.01 --base 10 --requests 30`` (per chunk: that figure less the
1-token one, ``--base 10 --requests 100``, over 63; the relay never sees a 1-token request). At
full speed, several chunks to a read, wall-clock CPU does not separate the two: 30 to 40 ms per
1,000 chunks either way, runs alternated, ``.venv/bin/python benchmarks/router/routers.py --quick
--skip faults --only narwhal``.

What an engine sends is bounded, so a broken engine cannot exhaust the router's memory: a
prefill reply over :data:`MAX_REPLY_BYTES` (the transport stops reading one byte past it) and an
SSE event still unfinished past :data:`MAX_EVENT_BYTES` are malformed responses (502).
"""

from __future__ import annotations

from typing import Any, Final

from narwhal.core.descriptor import DescriptorError, prefill_kv_params, validate_descriptor
from narwhal.core.errors import DONE_BEFORE_TOKEN_TEXT, SILENCE_TEXT, Fault, FaultKind, fault
from narwhal.core.jsonparse import parse_json
from narwhal.core.ports import (
    Burst,
    Chunk,
    ChunkResult,
    Clock,
    ConnectFailed,
    Reply,
    StreamOpened,
    TimedOut,
    Transport,
)
from narwhal.core.requests import ClientRequest, prefill_body
from narwhal.core.retry import handoff_too_old
from narwhal.core.sse import EventKind, SseEvent, SseParser, SseTooLarge

# Generous: a vLLM reply or event carrying prompt logprobs of a long prompt runs to megabytes.
MAX_REPLY_BYTES = 16 * 1024 * 1024
MAX_EVENT_BYTES = 16 * 1024 * 1024


def _connect_fault(result: ConnectFailed, engine: str, phase: str) -> Fault:
    kind = FaultKind.REFUSED if result.reason == "refused" else FaultKind.RESET
    return fault(kind, f"{phase} engine {result.reason}", engine=engine, phase=phase)


def _http_fault(status: int, raw: bytes, engine: str, phase: str) -> Fault:
    """A non-200 answer: 4xx passed through as is (body kept), anything else a 502."""
    if 400 <= status < 500:
        try:
            parsed = parse_json(raw)
        except ValueError:
            parsed = None
        return fault(
            FaultKind.ENGINE_4XX,
            f"{phase} engine rejected the request ({status})",
            engine=engine,
            phase=phase,
            status=status,
            upstream_body=parsed if isinstance(parsed, dict) else None,
        )
    return fault(
        FaultKind.ENGINE_5XX, f"{phase} engine answered HTTP {status}", engine=engine, phase=phase
    )


def stale_handoff(started_at: float, now: float, max_handoff_age_s: float) -> Fault | None:
    """The fault of a handoff too old to decode (its producer may have freed the blocks)."""
    if not handoff_too_old(started_at, now, max_handoff_age_s):
        return None
    return fault(
        FaultKind.HANDOFF_TOO_OLD,
        f"handoff older than max_handoff_age_s ({max_handoff_age_s:g} s)",
        engine=None,
        phase="decode",
    )


# ---------------------------------------------------------------- the prefill leg


def prompt_tokens_of(payload: dict[str, Any]) -> int | None:
    """``usage.prompt_tokens`` of an engine's reply or usage chunk, when it is a count (vLLM
    reports it in every non-streaming reply and in a stream's usage chunk); None otherwise."""
    usage = payload.get("usage")
    if not isinstance(usage, dict):
        return None
    count = usage.get("prompt_tokens")
    if type(count) is not int or count < 0:  # bool is an int subclass: not a count
        return None
    return count


def read_prefill_reply(
    reply: Reply, producer: str, connector: str, pinned_side_channel: str | None
) -> tuple[dict[str, Any], int | None] | Fault:
    """The validated descriptor of a prefill reply and the prompt tokens it reports, or the
    fault it shows (a reply without a usable count still hands off: the count only feeds
    metrics)."""
    if reply.status != 200:
        return _http_fault(reply.status, reply.body, producer, "prefill")
    if len(reply.body) > MAX_REPLY_BYTES:
        return fault(
            FaultKind.MALFORMED_RESPONSE,
            f"prefill response over {MAX_REPLY_BYTES} bytes",
            engine=producer,
            phase="prefill",
        )
    try:
        payload = parse_json(reply.body)
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        return fault(
            FaultKind.MALFORMED_RESPONSE,
            "prefill response is not a JSON object",
            engine=producer,
            phase="prefill",
        )
    prompt_tokens = prompt_tokens_of(payload)
    try:
        descriptor = validate_descriptor(  # the reply was parsed here, for this leg alone
            payload.get("kv_transfer_params"),
            connector,
            pinned_side_channel,
            detach=False,
            prompt_tokens=prompt_tokens,
        )
    except DescriptorError as error:
        return fault(
            FaultKind.BAD_DESCRIPTOR,
            f"invalid KV descriptor from producer ({error.reason.value}): {error.detail}",
            engine=producer,
            phase="prefill",
        )
    return descriptor, prompt_tokens


class PrefillOutcome:
    """What one prefill leg came to: the validated descriptor, or the fault that ended it."""

    __slots__ = ("descriptor", "fault", "prompt_tokens", "replied_at", "started_at")

    def __init__(
        self,
        started_at: float,
        replied_at: float | None,
        descriptor: dict[str, Any] | None,
        fault: Fault | None,
        prompt_tokens: int | None = None,
    ) -> None:
        self.started_at: Final = started_at  # when the leg started: the handoff's age starts
        self.replied_at: Final = replied_at  # when the producer's reply came (None: never)
        self.descriptor: Final = descriptor  # None exactly when ``fault`` is set
        self.fault: Final = fault
        self.prompt_tokens: Final = prompt_tokens  # the reply's usage.prompt_tokens, if any


async def prefill_leg(
    transport: Transport,
    clock: Clock,
    producer: str,
    request: ClientRequest,
    *,
    backend_request_id: str,
    connector: str,
    pinned_side_channel: str | None,
    deadline: float,
    max_handoff_age_s: float | None,
) -> PrefillOutcome:
    """Run the one-token, non-streaming prefill of ``request`` on ``producer``.

    The leg is bounded by ``deadline`` and, unless ``max_handoff_age_s`` is None, by the
    handoff's age: waiting past it only wastes the deadline, since the handoff is then unusable.
    """
    started = clock.now()
    age_bound = deadline if max_handoff_age_s is None else started + max_handoff_age_s
    leg_deadline = min(deadline, age_bound)
    kv_params = prefill_kv_params(connector, transfer_id=backend_request_id)
    result = await transport.call(
        producer,
        "POST",
        request.endpoint,
        prefill_body(request, kv_params),
        {"X-Request-Id": backend_request_id},
        leg_deadline,
    )
    if isinstance(result, TimedOut):
        if leg_deadline < deadline:
            failure = fault(
                FaultKind.HANDOFF_TOO_OLD,
                f"prefill took longer than max_handoff_age_s ({max_handoff_age_s:g} s)",
                engine=producer,
                phase="prefill",
            )
        else:
            failure = fault(
                FaultKind.DEADLINE,
                "request deadline passed during prefill",
                engine=None,
                phase="prefill",
            )
        return PrefillOutcome(started, None, None, failure)
    if isinstance(result, ConnectFailed):
        return PrefillOutcome(started, None, None, _connect_fault(result, producer, "prefill"))
    replied = clock.now()
    read = read_prefill_reply(result, producer, connector, pinned_side_channel)
    if isinstance(read, Fault):
        return PrefillOutcome(started, replied, None, read)
    return PrefillOutcome(started, replied, read[0], None, read[1])


# ---------------------------------------------------------------- the decode leg


class ReadEvents:
    """The events of one read result, oldest first, and when each arrived, side by side
    (``times[i]`` is when ``events[i]`` arrived): a streamed token costs no pair."""

    __slots__ = ("events", "times")

    def __init__(self) -> None:
        self.times: list[float] = []
        self.events: list[SseEvent] = []

    def add(self, at: float, event: SseEvent) -> None:
        self.times.append(at)
        self.events.append(event)


class DecodeLeg:
    """One decode stream on ``consumer``: its deadlines, and what each read of it means.

    ``first_token_timeout_s`` runs from the leg's creation (the open's connect and header delays
    count) until the first generated token. :meth:`read` turns one transport result into the
    events it carries and their arrival times (:class:`ReadEvents`), in order; when the read
    shows a fault the events before it are still returned and :attr:`fault` is set. Nothing is
    read after a fault or after ``[DONE]`` (:attr:`done`). A :class:`Burst` is taken read by
    read, each at its own arrival time, exactly as if the reads had come one at a time; a read
    equal to the one before it, where that one started and ended at an event boundary, is that
    read's events again, not parsed a second time.
    """

    __slots__ = (
        "clock",
        "consumer",
        "deadline",
        "decode_read_timeout_s",
        "delivered",
        "done",
        "fault",
        "first_token_timeout_s",
        "got_token",
        "handle",
        "parser",
        "request_deadline",
        "transport",
    )

    def __init__(
        self,
        transport: Transport,
        clock: Clock,
        consumer: str,
        *,
        first_token_timeout_s: float,
        decode_read_timeout_s: float,
        request_deadline: float,
    ) -> None:
        self.transport = transport
        self.clock = clock
        self.consumer = consumer
        self.first_token_timeout_s = first_token_timeout_s
        self.decode_read_timeout_s = decode_read_timeout_s
        self.request_deadline = request_deadline
        # until the first token; then silence or the request's
        self.deadline = min(request_deadline, clock.now() + first_token_timeout_s)
        self.handle: Any = None  # the open stream (None: not open, or closed)
        # False only when the request surely never reached the consumer (its connection was
        # refused): only then is a handoff sent in it still the sender's to release. After a
        # reset or a timeout the consumer may have it, and may be pulling its blocks.
        self.delivered = False
        self.got_token = False
        self.done = False
        self.fault: Fault | None = None
        self.parser = SseParser(max_event_bytes=MAX_EVENT_BYTES)

    async def open(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Fault | None:
        """Open the stream; the fault (also kept in :attr:`fault`) when it did not open as a
        200 stream. Whatever it opened is closed by :meth:`close`."""
        opened = await self.transport.open_stream(self.consumer, path, body, headers, self.deadline)
        self.delivered = not (isinstance(opened, ConnectFailed) and opened.reason == "refused")
        if isinstance(opened, TimedOut):
            self.fault = self._timeout()
        elif isinstance(opened, ConnectFailed):
            self.fault = _connect_fault(opened, self.consumer, "decode")
        else:
            assert isinstance(opened, StreamOpened)
            self.handle = opened.handle
            if opened.status != 200:
                self.fault = _http_fault(opened.status, opened.body, self.consumer, "decode")
        return self.fault

    async def next_read(self) -> ReadEvents:
        """Await the stream's next read under the current deadline; its events (see
        :meth:`read`)."""
        result = await self.transport.next_chunk(self.handle, self.deadline)
        return self.read(result, self.clock.now())

    async def read_to_end(self) -> Fault | None:
        """Read the open stream to its end, dropping the events: None after a generated token
        and ``[DONE]``, else the fault that ended it."""
        while self.fault is None and not self.done:
            await self.next_read()
        return self.fault

    def close(self) -> None:
        """Abandon the stream, if one is open (synchronous: safe in ``finally``)."""
        handle, self.handle = self.handle, None
        if handle is not None:
            self.transport.close_stream(handle)

    def resumed(self, at: float) -> bool:
        """The router turned back to the stream at ``at`` after writing to the client.

        The engine cannot be silent while the router is not reading it: time spent writing
        (blocked by a client that does not read) is not engine silence, so after the first
        token silence is measured from ``max(last chunk, at)``. True when the write outlasted
        the silence deadline then in force, i.e. when counting it would have blamed the engine.
        """
        if not self.got_token or self.done or self.fault is not None:
            return False
        timeout = self.decode_read_timeout_s
        if timeout <= 0 or self.deadline >= self.request_deadline:
            return False  # the request deadline bounds the stream: it is nobody's silence
        outlasted = at >= self.deadline
        self.deadline = max(self.deadline, min(at + timeout, self.request_deadline))
        return outlasted

    def read(self, result: ChunkResult, now: float) -> ReadEvents:
        """The events of one read result, each with its arrival time (see the class)."""
        out = ReadEvents()
        if isinstance(result, Chunk):
            self._take(now, result.data, out)
        elif isinstance(result, Burst):
            # A read equal to the last one, which started and ended at an event boundary after
            # the first token, has that read's events and changes nothing else (every event was
            # a token or metadata: anything else ends the stream), so it is not parsed again: a
            # simulated engine at one token per chunk writes the same bytes for every chunk.
            repeat: bytes | None = None
            same: list[SseEvent] = []
            times, events = out.times, out.events
            arrived = result.times
            for i, data in enumerate(result.chunks):
                at = arrived[i]
                if at >= self.deadline:
                    self.fault = self._timeout()
                    break
                if data == repeat:
                    for event in same:
                        times.append(at)
                        events.append(event)
                    self.forwarded(at)
                    continue
                fresh = self.parser.at_boundary
                start = len(events)
                self._take(at, data, out)
                if self.done or self.fault is not None:
                    break
                if fresh and self.got_token and self.parser.at_boundary:
                    repeat, same = data, events[start:]
                else:
                    repeat = None
        elif isinstance(result, TimedOut):
            self.fault = self._timeout()
        else:  # StreamEnd | ConnectFailed
            self.fault = fault(
                FaultKind.CLOSED_BEFORE_DONE,
                "engine closed the stream before [DONE]",
                engine=self.consumer,
                phase="decode",
            )
        return out

    def _timeout(self) -> Fault:
        """Which deadline the read in progress hit: the request's, first token, or silence."""
        if self.deadline >= self.request_deadline:
            return fault(
                FaultKind.DEADLINE,
                "request deadline passed while decoding",
                engine=None,
                phase="decode",
            )
        if not self.got_token:
            return fault(
                FaultKind.FIRST_TOKEN_TIMEOUT,
                "engine produced no token within first_token_timeout_s "
                f"({self.first_token_timeout_s:g} s)",
                engine=self.consumer,
                phase="decode",
            )
        return fault(
            FaultKind.SILENCE,
            f"{SILENCE_TEXT} (no chunk for decode_read_timeout_s = "
            f"{self.decode_read_timeout_s:g} s)",
            engine=self.consumer,
            phase="decode",
        )

    def _take(self, at: float, data: bytes, out: ReadEvents) -> None:
        """One transport read that arrived at ``at``."""
        try:
            events = self.parser.feed(data)
        except SseTooLarge:
            self.fault = fault(
                FaultKind.MALFORMED_RESPONSE,
                f"engine sent a server-sent event over {MAX_EVENT_BYTES} bytes",
                engine=self.consumer,
                phase="decode",
            )
            return
        for event in events:
            kind = event.kind
            if kind is EventKind.TOKEN:
                self.got_token = True
            elif kind is EventKind.ERROR:
                self.fault = fault(
                    FaultKind.INBAND_ERROR,
                    f"engine error in stream: {event.error_message or 'unknown error'}",
                    engine=self.consumer,
                    phase="decode",
                    status=event.error_status or 502,
                )
                return
            elif kind is EventKind.MALFORMED:
                self.fault = fault(
                    FaultKind.MALFORMED_RESPONSE,
                    "engine sent malformed SSE data",
                    engine=self.consumer,
                    phase="decode",
                )
                return
            elif kind is EventKind.DONE:
                if not self.got_token:
                    self.fault = fault(
                        FaultKind.DONE_BEFORE_TOKEN,
                        DONE_BEFORE_TOKEN_TEXT,
                        engine=self.consumer,
                        phase="decode",
                    )
                    return
                out.add(at, event)
                self.done = True
                return
            out.add(at, event)
        if self.got_token:  # any chunk, metadata too, resets the silence timer
            self.forwarded(at)

    def forwardable(self, data: bytes) -> list[SseEvent] | None:
        """The events of a read that needs nothing but forwarding, whole events each a token or
        metadata, after the first token; None for any other read, which :meth:`read` takes.
        Changes nothing: call :meth:`forwarded` once the events are forwarded."""
        if not self.got_token or self.done or self.fault is not None:
            return None
        events = self.parser.whole_events(data)
        if events is None:
            return None
        for event in events:
            kind = event.kind
            if kind is not EventKind.TOKEN and kind is not EventKind.METADATA:
                return None
        return events

    def forwarded(self, at: float) -> None:
        """A read after the first token arrived at ``at``: the silence timer starts again."""
        timeout = self.decode_read_timeout_s
        bound = at + timeout if timeout > 0 else self.request_deadline
        self.deadline = min(bound, self.request_deadline)
