"""A committed stream's reads taken where they arrive (``Transport.relay_reads``): the client
gets the same bytes, the record the same counts and the same end, as when every read goes
through the decode loop; a read that is not only tokens and metadata, or that the client cannot
take at once, is left to the loop; the relay's deadline bounds the silence that follows it."""

from __future__ import annotations

from typing import Any

from narwhal.core.config import parse_config
from narwhal.core.lifecycle import serve_request
from narwhal.core.policies import Policies
from narwhal.core.ports import Chunk, ChunkResult, Relay
from narwhal.core.records import RequestRecord
from narwhal.core.requests import COMPLETIONS, parse_client_request
from tests.core.scripted import (
    DONE,
    USAGE_CHUNK,
    Decode,
    RecordingSink,
    ScriptedTransport,
    VirtualClock,
    make_ports,
    run,
    token,
)

P0, D0 = "http://p0", "http://d0"
SILENCE_S = 0.5


class RelayingTransport(ScriptedTransport):
    """Offers each scripted read to the stream's relay, once one is set, before the reader
    sees it, as the live transport does from its read callback."""

    def __init__(self, clock: VirtualClock, scripts: dict[str, list[Any]]) -> None:
        super().__init__(clock, scripts)
        self.relays: dict[int, Relay] = {}
        self.relayed: list[bytes] = []

    def relay_reads(self, handle: Any, relay: Relay) -> bool:
        self.relays[id(handle)] = relay
        return True

    async def next_chunk(self, handle: Any, deadline: float) -> ChunkResult:
        while True:
            result = await super().next_chunk(handle, deadline)
            relay = self.relays.get(id(handle))
            if relay is None or not isinstance(result, Chunk):
                return result
            taken = relay(result.data, self.clock.now())
            if taken is None:
                return result
            self.relayed.append(result.data)
            deadline = taken

    def close_stream(self, handle: Any) -> None:
        self.relays.pop(id(handle), None)
        super().close_stream(handle)


class TakingSink(RecordingSink):
    """A client that takes every write at once (``send_now``) unless told it is not reading."""

    def __init__(self, reading: bool = True) -> None:
        super().__init__()
        self.reading = reading

    def send_now(self, data: bytes) -> bool:
        if not self.reading:
            return False
        self.events.append(data)
        return True


def serve(decode: Decode, *, relaying: bool, reading: bool = True) -> tuple[Any, Any, Any]:
    config = parse_config(
        {
            "engine": {
                "first_token_timeout_s": 1.0,
                "decode_read_timeout_s": SILENCE_S,
                "request_timeout_s": 30.0,
            },
            "engines": [{"url": P0, "role": "prefill"}, {"url": D0, "role": "decode"}],
        }
    )
    clock = VirtualClock()
    records: list[RequestRecord] = []
    policies = Policies(config, seed=1, on_record=records.append)
    kind = RelayingTransport if relaying else ScriptedTransport
    transport = kind(clock, {D0: [decode]})
    sink = TakingSink(reading)
    body = {"prompt": "hello", "max_tokens": 8, "stream": True}
    request = parse_client_request(COMPLETIONS, body, request_id="r1", arrival=clock.now())
    run(serve_request(request, make_ports(clock, transport), policies, sink))
    (record,) = records
    return sink, transport, record


def summary(sink: RecordingSink, record: RequestRecord) -> tuple[Any, ...]:
    return (
        b"".join(sink.events),
        record.status,
        record.outcome,
        record.output_tokens,
        record.prompt_tokens,
        record.finished_s,
    )


STREAM = Decode(
    items=(
        (0.02, token("A")),
        (0.02, token("B")),
        (0.02, token("C") + token("D")),  # two events in one read
        (0.02, USAGE_CHUNK),
        (0.0, DONE),
    )
)


def test_relayed_reads_give_the_client_and_the_record_what_the_loop_gives() -> None:
    looped_sink, _, looped = serve(STREAM, relaying=False)
    sink, transport, record = serve(STREAM, relaying=True)
    assert summary(sink, record) == summary(looped_sink, looped)
    assert record.output_tokens == 4 and record.prompt_tokens == 5
    # the first token commits the stream in the loop; [DONE] ends it there
    assert transport.relayed == [token("B"), token("C") + token("D"), USAGE_CHUNK]


def test_a_client_that_cannot_take_a_write_at_once_gets_every_read_from_the_loop() -> None:
    looped_sink, _, looped = serve(STREAM, relaying=False)
    sink, transport, record = serve(STREAM, relaying=True, reading=False)
    assert transport.relayed == []
    assert summary(sink, record) == summary(looped_sink, looped)


def test_silence_after_relayed_reads_ends_the_stream_at_the_relays_deadline() -> None:
    stalling = Decode(items=((0.02, token("A")), (0.02, token("B")), (0.1, token("C"))), end="hang")
    looped_sink, _, looped = serve(stalling, relaying=False)
    sink, transport, record = serve(stalling, relaying=True)
    assert transport.relayed == [token("B"), token("C")]
    assert summary(sink, record) == summary(looped_sink, looped)
    assert record.outcome == "silence" and record.output_tokens == 3
    assert record.finished_s == looped.finished_s  # C's arrival plus the silence timeout
