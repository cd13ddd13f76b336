"""The contract's Python API: EngineClient.prefill() -> PrefillResult -> EngineClient.decode()."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from narwhal.core.descriptor import DescriptorError, DescriptorReason
from narwhal.core.requests import CHAT, COMPLETIONS
from narwhal.core.sse import EventKind, SseEvent
from narwhal.engines.client import EngineClient, EngineError
from narwhal.engines.connector import HandoffMismatch, PrefillResult
from tests.core.scripted import (
    Decode,
    Prefill,
    ScriptedTransport,
    VirtualClock,
    descriptor,
    run,
)


def clients(
    scripts: dict[str, list[Any]] | None = None,
) -> tuple[EngineClient, EngineClient, ScriptedTransport]:
    clock = VirtualClock()
    transport = ScriptedTransport(clock, scripts or {})
    producer = EngineClient("http://p0", transport=transport, clock=clock)
    consumer = EngineClient("http://d0", transport=transport, clock=clock)
    return producer, consumer, transport


async def collect(events: AsyncIterator[SseEvent]) -> list[SseEvent]:
    return [event async for event in events]


def test_prefill_result_passes_straight_to_decode() -> None:
    producer, consumer, transport = clients()
    body = {"prompt": "hello", "max_tokens": 2}
    result = run(producer.prefill(body))
    assert isinstance(result, PrefillResult)
    assert (result.producer_url, result.endpoint) == ("http://p0", COMPLETIONS)
    assert result.backend_request_id == transport.calls[0][4]["X-Request-Id"]
    events = run(collect(consumer.decode(result, body)))
    assert [e.kind for e in events] == [EventKind.TOKEN, EventKind.TOKEN, EventKind.DONE]
    sent = transport.calls[1][3]
    assert sent is not None and sent["kv_transfer_params"] == descriptor()


def test_parameters_is_a_detached_copy() -> None:
    producer, _, _ = clients()
    result = run(producer.prefill({"prompt": "x"}))
    params = result.parameters()
    params["remote_engine_id"] = "tampered"
    params["remote_block_ids"][0].append(99)
    assert result.parameters() == descriptor()


@pytest.mark.parametrize(
    ("connector", "bad", "reason"),
    [
        ("NixlConnector", {"remote_engine_id": None}, DescriptorReason.MISSING_ENGINE_IDENTITY),
        ("NixlConnector", {"remote_block_ids": [["1"]]}, DescriptorReason.MALFORMED_BLOCK_IDS),
        ("NoSuchConnector", {}, DescriptorReason.UNKNOWN_CONNECTOR),
    ],
)
def test_a_hand_built_prefill_result_is_validated_too(
    connector: str, bad: dict[str, Any], reason: DescriptorReason
) -> None:
    # No decode can ever send a descriptor that did not pass validation.
    with pytest.raises(DescriptorError) as caught:
        PrefillResult.create(
            producer_url="http://p0",
            endpoint=COMPLETIONS,
            backend_request_id="r",
            connector=connector,
            started_at=0.0,
            descriptor={**descriptor(), **bad},
        )
    assert caught.value.reason is reason


def test_decode_refuses_endpoint_mismatch_before_io() -> None:
    producer, consumer, transport = clients()
    result = run(producer.prefill({"prompt": "x"}))
    with pytest.raises(HandoffMismatch, match="endpoint mismatch"):
        consumer.decode(result, {"messages": [{"role": "user", "content": "x"}]}, endpoint=CHAT)
    assert len(transport.calls) == 1


def test_decode_refuses_connector_mismatch() -> None:
    producer, _, transport = clients()
    result = run(producer.prefill({"prompt": "x"}))
    mooncake = EngineClient(
        "http://d1", transport=transport, clock=transport.clock, connector="MooncakeConnector"
    )
    with pytest.raises(HandoffMismatch, match="connector mismatch"):
        mooncake.decode(result, {"prompt": "x"})


def test_bad_descriptor_is_an_engine_error() -> None:
    producer, _, _ = clients({"prefill": [Prefill(kv={**descriptor(), "remote_block_ids": [-1]})]})
    with pytest.raises(EngineError) as error:
        run(producer.prefill({"prompt": "x"}))
    assert error.value.fault.status == 502 and "malformed_block_ids" in str(error.value)


def test_decode_fault_maps_like_the_router() -> None:
    producer, consumer, _ = clients({"decode": [Decode(items=(), end="hang")]})
    result = run(producer.prefill({"prompt": "x"}))
    with pytest.raises(EngineError) as error:
        run(collect(consumer.decode(result, {"prompt": "x"})))
    assert error.value.fault.status == 504


def test_old_handoff_is_not_used() -> None:
    producer, consumer, transport = clients()
    result = run(producer.prefill({"prompt": "x"}))
    transport.clock.t += 26.0
    with pytest.raises(EngineError, match="handoff older"):
        run(collect(consumer.decode(result, {"prompt": "x"})))
    assert len(transport.calls) == 1
