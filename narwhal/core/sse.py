"""Server-sent events from an engine: an incremental parser and a classifier.

Rule kept here: pure code. Nothing in this module performs I/O, reads a clock, uses randomness or
knows about asyncio/anyio/httpx. Bytes go in, immutable :class:`SseEvent` values come out.

Theory of operation: an engine's streaming response body arrives as byte chunks cut at arbitrary
points. :class:`SseParser` follows the WHATWG event-stream grammar: it splits the bytes into lines
(ended by CRLF, LF or CR; a CR that ends one chunk swallows an LF that starts the next), drops
comment lines (leading ``:``), accumulates the ``data`` field (one leading space after the colon
removed, several lines joined with ``\\n``), ignores every other field, and dispatches an event on
each blank line that follows at least one ``data`` line. Only complete lines are decoded (UTF-8,
invalid bytes replaced), so a multi-byte character split across chunks is never torn; a UTF-8 byte
order mark at the very start of the stream is dropped. Every chunk is scanned once: the unterminated
tail is kept aside and only joined when its line ends, so the work is linear in the stream's length
however it is cut. Chunks of whole one-line events with nothing held (the usual shape) skip the line
splitting, and such an event that repeats the last one taken whole is that same event (classifying
is pure), so it is not classified again. At end of stream :meth:`SseParser.close` discards an
unterminated event, as the specification says, and :attr:`SseParser.pending` tells whether there was
one (a truncated stream).

:func:`classify` turns one event's data into a kind the router acts on (vLLM's shapes, see
docs/contract.md): ``[DONE]`` ends the stream; a JSON object with a truthy ``error`` key, or
``"object": "error"``, is an in-band error (the status to report is its ``code`` when that is an
HTTP error code, else 502); a completions choice with non-empty ``text`` or a chat delta with
non-empty ``content``, ``reasoning_content``, ``reasoning``, ``tool_calls`` or ``function_call`` is
a generated token; any other JSON object (chat role chunk, usage chunk, finish_reason-only chunk)
is metadata; anything else is malformed. :meth:`SseEvent.wire` re-encodes an event for forwarding
to the client byte-for-byte as vLLM would have sent it.
"""

from __future__ import annotations

import enum
import re
from typing import Any, Final

from narwhal.core.jsonparse import parse_json

__all__ = [
    "DEFAULT_ERROR_STATUS",
    "EventKind",
    "SseEvent",
    "SseParser",
    "SseTooLarge",
    "classify",
]

DEFAULT_ERROR_STATUS = 502
"""Status reported for an in-band error whose ``code`` is missing or not an HTTP error code."""

_DONE = "[DONE]"
_UTF8_BOM = b"\xef\xbb\xbf"
_EOL = re.compile(r"\r\n|\r|\n")
# Chat delta fields whose non-empty value means the engine generated output.
_DELTA_OUTPUT_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls", "function_call")


class EventKind(enum.Enum):
    """What one server-sent event means to the router."""

    TOKEN = "token"
    """Generated output: a completions ``text`` or a chat delta carrying content."""
    METADATA = "metadata"
    """A valid JSON chunk that carries no generated output (role, usage, finish_reason)."""
    ERROR = "error"
    """An in-band error object sent after the response was committed."""
    DONE = "done"
    """``data: [DONE]``, the normal end of an OpenAI-style stream."""
    MALFORMED = "malformed"
    """Data that is neither ``[DONE]`` nor a JSON object."""


class SseEvent:
    """One dispatched server-sent event, classified.

    ``payload`` is the parsed JSON object (``None`` for DONE and MALFORMED); it is shared, not
    copied, so treat it as read-only. ``error_status`` and ``error_message`` are read from it,
    for ERROR events only. ``encoded`` is what :meth:`wire` returns, when the parser still had
    the event's bytes (no re-encoding).

    Immutable (``Final``); equal by kind, data and payload, hashed by kind and data. A plain
    class rather than a frozen dataclass, as :class:`~narwhal.core.records.Decision` is: most
    streamed reads make one, and a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__`` (and stays interpreted in the compiled build).
    """

    __slots__ = ("data", "encoded", "kind", "payload")

    def __init__(
        self,
        kind: EventKind,
        data: str,
        payload: dict[str, Any] | None = None,
        encoded: bytes | None = None,
    ) -> None:
        self.kind: Final = kind
        self.data: Final = data
        self.payload: Final = payload
        self.encoded: Final = encoded

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, SseEvent)
            and self.kind is other.kind
            and self.data == other.data
            and self.payload == other.payload
        )

    def __hash__(self) -> int:
        return hash((self.kind, self.data))

    def __repr__(self) -> str:
        return f"SseEvent(kind={self.kind!r}, data={self.data!r}, payload={self.payload!r})"

    @property
    def error_status(self) -> int | None:
        """The HTTP status to report for an ERROR event (None for any other kind)."""
        if self.kind is not EventKind.ERROR or self.payload is None:
            return None
        return _error_details(self.payload)[0]

    @property
    def error_message(self) -> str | None:
        """The message of an ERROR event (None for any other kind)."""
        if self.kind is not EventKind.ERROR or self.payload is None:
            return None
        return _error_details(self.payload)[1]

    def wire(self) -> bytes:
        """The event encoded for forwarding: a ``data: `` line per line of data, then a blank line.

        Parsing the result gives back an event equal to this one. A CR or CRLF inside ``data``
        (possible only for an event built by hand) becomes a line break like LF.
        """
        if self.encoded is not None:
            return self.encoded
        data = self.data
        if "\n" not in data and "\r" not in data:
            return f"data: {data}\n\n".encode()
        lines = _EOL.split(data)
        return "".join([f"data: {line}\n" for line in lines] + ["\n"]).encode()


_DONE_WIRE = b"data: [DONE]\n\n"
_DONE_EVENT = SseEvent(EventKind.DONE, _DONE, encoded=_DONE_WIRE)


# ---------------------------------------------------------------- classification


def classify(data: str, encoded: bytes | None = None) -> SseEvent:
    """Classify one event's data field (see :class:`EventKind`); ``encoded``, when given, is
    the event's exact wire form (``data: <data>`` and a blank line), kept for :meth:`wire`."""
    if data[:1] != "{":  # not the common shape, a JSON object: perhaps [DONE]
        if data == _DONE and (encoded is None or encoded == _DONE_WIRE):
            return _DONE_EVENT  # every stream's last event: one value serves them all
        if data == _DONE or data.strip() == _DONE:
            return SseEvent(EventKind.DONE, data, encoded=encoded)
    try:
        payload = parse_json(data)  # the router's one JSON parser (bounded depth)
    except ValueError:
        return SseEvent(EventKind.MALFORMED, data, encoded=encoded)
    if not isinstance(payload, dict):
        return SseEvent(EventKind.MALFORMED, data, encoded=encoded)

    if payload.get("error") or payload.get("object") == "error":
        return SseEvent(EventKind.ERROR, data, payload, encoded)
    kind = EventKind.TOKEN if _has_output(payload) else EventKind.METADATA
    return SseEvent(kind, data, payload, encoded=encoded)


def _has_output(payload: dict[str, Any]) -> bool:
    choices = payload.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        text = choice.get("text")
        if isinstance(text, str) and text:
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict):
            for name in _DELTA_OUTPUT_FIELDS:
                value = delta.get(name)
                if isinstance(value, str | list | dict) and value:
                    return True
    return False


def _error_details(payload: dict[str, Any]) -> tuple[int, str]:
    """The HTTP status and message to report for an in-band error.

    ``{"error": {...}}`` (vLLM's shape) reads ``code`` and ``message`` inside the error object;
    ``{"object": "error", ...}`` (older vLLM) and ``{"error": "text"}`` read them at top level.
    """
    error = payload.get("error")
    source: dict[str, Any] = error if isinstance(error, dict) else payload
    status = _http_error_code(source.get("code"))
    message = source.get("message")
    if isinstance(message, str) and message:
        return status, message
    if isinstance(error, str) and error:
        return status, error
    kind = source.get("type")
    if isinstance(kind, str) and kind:
        return status, kind
    return status, "upstream sent an error event"


def _http_error_code(code: Any) -> int:
    value: int | None = None
    if isinstance(code, int) and not isinstance(code, bool):
        value = code
    elif isinstance(code, str):
        text = code.strip()
        if text.isascii() and text.isdigit() and len(text) == 3:
            value = int(text)
    if value is not None and 400 <= value <= 599:
        return value
    return DEFAULT_ERROR_STATUS


# ---------------------------------------------------------------- incremental parsing


class SseTooLarge(ValueError):
    """The event being assembled grew past the parser's ``max_event_bytes``."""


class SseParser:
    """Incremental parser: feed arbitrary byte chunks, get complete events.

    ``max_event_bytes`` (default: no limit) bounds the bytes held for one event that is still
    being assembled (its data lines plus the unterminated line); going past it raises
    :class:`SseTooLarge` from :meth:`feed`, so a peer that never ends a line cannot exhaust memory.
    """

    __slots__ = (
        "_closed",
        "_data",
        "_data_bytes",
        "_last_event",
        "_last_wire",
        "_max_event_bytes",
        "_partial",
        "_skip_lf",
        "_start",
    )

    def __init__(self, *, max_event_bytes: int | None = None) -> None:
        self._max_event_bytes = max_event_bytes
        self._partial = bytearray()  # the current line, not yet terminated
        self._data: list[str] = []  # data lines of the event being assembled
        self._data_bytes = 0
        self._skip_lf = False  # the last chunk ended in CR: an LF starting the next is its pair
        self._start = True  # no line completed yet: a leading BOM is still to be dropped
        self._closed = False
        # The last event taken whole (one data line and its blank line) and what it was:
        # classifying is pure, so an event that repeats it is that same event.
        self._last_wire = b""
        self._last_event = _DONE_EVENT

    @property
    def pending(self) -> bool:
        """Whether bytes of an unfinished event are held (after :meth:`close`: were discarded)."""
        return bool(self._partial) or bool(self._data)

    @property
    def at_boundary(self) -> bool:
        """Whether nothing of an earlier event is held (no partial line, data line or CR): the
        events of the next chunk then depend on that chunk alone."""
        return not (self._partial or self._data or self._skip_lf)

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Take the next bytes of the stream; return the events they complete, in order."""
        if self._closed:
            raise RuntimeError("SseParser.feed() after close()")
        events: list[SseEvent] = []
        if not chunk:
            return events
        whole = self.whole_events(chunk)
        if whole is not None:
            return whole
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == 0x0A:
                chunk = chunk[1:]
                if not chunk:
                    return events
        # bytes.splitlines splits on exactly CR, LF and CRLF, in C, in one pass.
        pieces = chunk.splitlines(keepends=True)
        last = pieces[-1]
        if last[-1] not in (0x0A, 0x0D):
            pieces.pop()  # unterminated tail: keep it for later
        else:
            last = b""
            self._skip_lf = chunk[-1] == 0x0D
        for piece in pieces:
            cut = 2 if piece.endswith(b"\r\n") else 1
            if self._partial:
                self._partial += piece[:-cut]
                line = bytes(self._partial)
                self._partial.clear()
            else:
                line = piece[:-cut]
            if self._start:
                self._start = False
                if line.startswith(_UTF8_BOM):
                    line = line[3:]
            if not line:
                if self._data:
                    events.append(classify("\n".join(self._data)))
                    self._data.clear()
                    self._data_bytes = 0
                continue
            self._line(line)
        if last:
            self._partial += last
        if self._max_event_bytes is not None:
            self._check_size()
        return events

    def whole_events(self, chunk: bytes) -> list[SseEvent] | None:
        """The events of ``chunk`` when it is the usual shape, whole events of one ``data: ``
        line each with nothing of an earlier event held (the fast path); None otherwise.

        It changes nothing :meth:`feed` depends on (only its cache of the last event, and
        that a leading BOM can no longer come), so a chunk read here may still be fed, with the
        same events: a caller can look at a read's events before deciding who handles it."""
        if self._partial or self._data or self._skip_lf or self._closed:
            return None
        if chunk == self._last_wire:
            return [self._last_event]  # the last whole event again: the same event
        if (
            not chunk.endswith(b"\n\n")
            or chunk.find(b"\r") >= 0
            or (self._start and chunk.startswith(_UTF8_BOM))
        ):
            return None
        # Nothing held, so no size to check. Most often the chunk is exactly one event.
        if chunk.find(b"\n") == len(chunk) - 2 and chunk.startswith(b"data: "):
            self._start = False
            return [self._whole_event(chunk)]
        blocks = chunk[:-2].split(b"\n\n")
        for block in blocks:
            if not block.startswith(b"data: ") or block.find(b"\n") >= 0:
                return None
        self._start = False
        return [self._whole_event(b"".join((block, b"\n\n"))) for block in blocks]

    def close(self) -> list[SseEvent]:
        """End of stream. An unterminated trailing event is discarded (see :attr:`pending`)."""
        self._closed = True
        return []

    def _whole_event(self, wire: bytes) -> SseEvent:
        """The event of ``wire``, one whole event of one line, ``data: <data>`` and a blank
        line (the fast path; see ``_last_wire``), classified with its bytes kept."""
        if wire != self._last_wire:
            self._last_wire = wire
            try:
                data = wire[6:-2].decode("utf-8")
            except UnicodeDecodeError:  # replacement characters: the wire form is re-encoded
                self._last_event = classify(wire[6:-2].decode("utf-8", errors="replace"))
            else:
                self._last_event = classify(data, wire)
        return self._last_event

    def _line(self, line: bytes) -> None:
        if line[0] == 0x3A:  # ":" comment
            return
        colon = line.find(b":")
        if colon < 0:
            if line == b"data":
                self._data.append("")
            return
        if line[:colon] != b"data":
            return  # event, id, retry and unknown fields do not affect what is forwarded
        start = colon + 2 if line[colon + 1 : colon + 2] == b" " else colon + 1
        self._data.append(line[start:].decode("utf-8", errors="replace"))
        self._data_bytes += len(line)

    def _check_size(self) -> None:
        assert self._max_event_bytes is not None
        if self._data_bytes + len(self._partial) > self._max_event_bytes:
            raise SseTooLarge(
                f"server-sent event over {self._max_event_bytes} bytes "
                f"({self._data_bytes + len(self._partial)} held)"
            )
