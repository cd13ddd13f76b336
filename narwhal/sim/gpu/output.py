"""Output: a sequence's tokens written to its stream, and the router woken when it must see them.

Rule kept here: a stream carries exactly what vLLM would have sent by then (chunks of
``stream_interval`` tokens, ``[DONE]``, or what a stream fault makes of it), each write stamped
with the time the engine produced it. The router is woken at once only for what changes its
decisions: a stream's first output (its deadline moves earlier) and what ends or breaks a
stream; a later plain chunk only moves the router's read deadline later, so (with
``coalesce_reads``) it waits for the router's next wake-up, at the latest the deadline of the
read it waits on, and reaches it as one :class:`~narwhal.core.ports.Burst` with the rest.

Theory of operation: :meth:`StreamWriter.emit` sends the tokens generated since the last write.
A stream whose sequence drew a stream fault is checked on every write: once its ``after``
tokens are reached, the writer sends the tokens up to that point and then acts the fault out on
the stream, and returns its kind so that the scheduler takes the sequence out (a ``stall``
keeps it, silent; the others finish it). Streams to wake are queued while a step is applied and
woken together by :meth:`flush` at its end.
"""

from __future__ import annotations

from narwhal.core.wire import DONE
from narwhal.sim.gpu.sequence import EOF, Resumer, Seq, SimStream, take_chunk
from narwhal.sim.gpu.totals import EngineTotals
from narwhal.sim.gpu.wire import ERROR_500, prompt_ids, token_chunk


class StreamWriter:
    """One engine's writes to its streams."""

    def __init__(self, coalesce_reads: bool, totals: EngineTotals) -> None:
        self.coalesce_reads = coalesce_reads
        self.totals = totals
        self.wake: list[SimStream] = []  # streams whose router waits and must see them now

    def emit(self, seq: Seq, final: bool, now: float) -> str | None:
        """Send ``seq``'s tokens generated since its last write (and end the stream if
        ``final``); the stream fault's kind if the stream reached its fault point instead."""
        stream = seq.stream
        if stream is None:
            return None
        n = seq.gen - seq.emitted
        if seq.fault is not None and seq.emitted + n >= seq.fault[1]:
            return self._act_out_fault(seq, stream, now)
        first = seq.emitted == 0
        if n > 0:
            self.totals.tokens_out += n
            seq.emitted = seq.gen
            if n == seq.chunk_tokens and not final:  # the usual chunk: its bytes are known
                data = seq.chunk
            else:
                assert seq.head is not None  # a decode leg's stream has its writer
                asked = seq.ids  # return_token_ids: the prompt's ids ride on the first chunk
                prompt = prompt_ids(asked, seq.prompt) if first and asked is not None else None
                data = token_chunk(seq.head, n, final, asked is not None, prompt)
                if not final and prompt is None:
                    seq.chunk_tokens, seq.chunk = n, data
            stream.write(now, data)
        if final:
            self.totals.deliver(seq.rid, seq.emitted)
            stream.write(now, DONE)
            stream.ended = EOF
        if stream.waiter is not None and (final or first or not self.coalesce_reads):
            self.wake.append(stream)
        return None

    def _act_out_fault(self, seq: Seq, stream: SimStream, now: float) -> str:
        assert seq.fault is not None
        kind, after = seq.fault
        allowed = max(0, after - seq.emitted)
        if allowed:  # the tokens before the fault point go out as usual
            seq.fault = None
            generated = seq.gen
            seq.gen = seq.emitted + allowed
            self.emit(seq, final=False, now=now)
            seq.gen = generated
            seq.fault = (kind, after)
        self.totals.deliver(seq.rid, seq.emitted)  # what went out before the fault
        if kind == "stall":  # the stream stays open and says nothing more
            return kind
        if kind == "early_done":
            stream.write(now, DONE)
            stream.ended = EOF
        elif kind == "inband_error":
            self.send_error(stream, now)
        else:  # disconnect: the connection closes before [DONE]
            stream.ended = EOF
        if stream.waiter is not None:
            self.wake.append(stream)
        return kind

    def send_error(self, stream: SimStream, now: float) -> None:
        """End ``stream`` with vLLM's in-band error event and ``[DONE]``."""
        stream.write(now, ERROR_500)
        stream.write(now, DONE)
        stream.ended = EOF

    def flush_one(self, stream: SimStream) -> None:
        """Hand a waiting router what ``stream`` has for it now."""
        waiter = stream.waiter
        if waiter is None:
            return
        result = take_chunk(stream)
        if result is not None:
            stream.waiter = None
            waiter.fire(result)

    def flush(self, replies: list[tuple[Resumer, object]]) -> None:
        """Wake the router for every queued stream (a woken router task may queue more, e.g.
        by aborting another request), then answer the calls in ``replies``."""
        while self.wake:
            wake, self.wake = self.wake, []
            for stream in wake:
                self.flush_one(stream)
        for resumer, value in replies:
            resumer.fire(value)
