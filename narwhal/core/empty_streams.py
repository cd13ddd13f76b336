"""Empty streams: when a consumer's ``[DONE]`` before any token is charged to it.

Rule kept here: an empty stream (``[DONE]`` before any generated token, a 502 the request may
retry) is charged to its consumer only on evidence that the request was not legitimately empty:
a later attempt of the same request got a generated token from another engine. Without that
evidence nobody is charged, since a healthy engine answers an immediate end of sequence or stop
string with just such a stream.

Theory of operation: one :class:`EmptyStreams` per request. :meth:`EmptyStreams.ended_empty`
notes the consumer, its breaker epoch at placement and the producer of that attempt (for the
readmission probe of a crossed decode). When an attempt's first generated token arrives,
:meth:`EmptyStreams.answered` charges every noted consumer other than the one that answered, as a
decode failure tagged with its epoch, so a charge that comes after the engine was ejected or
readmitted is stale and changes nothing (:class:`narwhal.core.breaker.Breaker`), and forgets
them, so each empty stream is charged at most once. A request that ends without a token charges
nobody. The charge counts in the consumer's decode streak like any other: it reaches
``eject_after`` (ejected, or CAPPED over the ejection cap) only when that many of its streams in
a row ended empty where another engine answered, with no completed stream between.
"""

from __future__ import annotations

from dataclasses import dataclass

from narwhal.core.breaker import Breaker
from narwhal.core.records import DecisionLog


@dataclass(frozen=True)
class EmptyStream:
    """One attempt's stream that ended with ``[DONE]`` before any token."""

    consumer: str
    epoch: int  # the consumer's breaker epoch when the attempt was placed
    producer: str | None  # the producer of a crossed decode (None: the consumer prefilled)


class EmptyStreams:
    """The empty streams of one request that no engine has contradicted yet."""

    __slots__ = ("_pending", "_request_id")

    def __init__(self, request_id: str) -> None:
        self._request_id = request_id
        self._pending: list[EmptyStream] = []

    def ended_empty(self, consumer: str, epoch: int, producer: str | None) -> None:
        """An attempt's stream from ``consumer`` ended with ``[DONE]`` before any token."""
        self._pending.append(EmptyStream(consumer, epoch, producer))

    def answered(self, consumer: str, now: float, breaker: Breaker, log: DecisionLog) -> None:
        """``consumer`` sent this request a generated token: charge the other consumers whose
        streams for it ended empty."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for empty in pending:
            if empty.consumer == consumer:
                continue  # the same engine answered after all: no evidence against it
            log.add(now, "empty_stream_charged", empty.consumer, request=self._request_id)
            breaker.on_failure(
                empty.consumer, empty.epoch, now, phase="decode", producer=empty.producer
            )
