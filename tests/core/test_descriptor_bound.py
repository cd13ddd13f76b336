"""Block ids bounded by the prompt: a producer's descriptor with more block ids than its prompt
can fill is the producer's bad descriptor, found before any id is read and before anything is
sent to a consumer; a descriptor within the bound passes as it is."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from narwhal.core import wire
from narwhal.core.descriptor import (
    BLOCK_ID_SLACK,
    DescriptorError,
    DescriptorReason,
    max_block_ids,
    validate_descriptor,
)
from narwhal.core.errors import Fault, FaultKind
from narwhal.core.legs import read_prefill_reply
from narwhal.core.ports import Reply

NIXL = "NixlConnector"
PRODUCER = "http://127.0.0.1:8100"


def descriptor(block_ids: list[Any], num_tokens: int | None = None) -> dict[str, Any]:
    params = wire.nixl_kv_params(
        block_ids=[],
        engine_id="engine-0",
        request_id="cmpl-1-0-abc",
        host="127.0.0.1",
        port=5559,
        num_tokens=0 if num_tokens is None else num_tokens,
    )
    params["remote_block_ids"] = block_ids
    if num_tokens is None:
        del params["remote_num_tokens"]
    return params


def test_the_bound_is_the_prompt_and_its_one_token_in_one_token_blocks_plus_the_slack() -> None:
    assert max_block_ids(3) == 3 + 1 + BLOCK_ID_SLACK
    assert max_block_ids(0) == 1 + BLOCK_ID_SLACK


def test_a_three_token_prompt_with_a_million_and_a_half_block_ids_is_refused_at_once() -> None:
    absurd = descriptor([list(range(1_500_000))])
    began = time.perf_counter()
    with pytest.raises(DescriptorError) as refused:
        validate_descriptor(absurd, NIXL, prompt_tokens=3)
    assert time.perf_counter() - began < 0.05  # one comparison, not a scan of the ids
    assert refused.value.reason is DescriptorReason.TOO_MANY_BLOCK_IDS
    assert "remote_block_ids[0] holds 1500000 block ids" in refused.value.detail
    assert "a prompt of 3 tokens" in refused.value.detail


@pytest.mark.parametrize("flat", [True, False], ids=["flat", "grouped"])
def test_block_ids_up_to_the_bound_pass_and_one_more_is_refused(flat: bool) -> None:
    bound = max_block_ids(10)

    def ids(n: int) -> list[Any]:
        return list(range(n)) if flat else [[0], list(range(n))]

    passed = validate_descriptor(descriptor(ids(bound)), NIXL, prompt_tokens=10)
    assert passed["remote_block_ids"] == ids(bound)
    with pytest.raises(DescriptorError) as refused:
        validate_descriptor(descriptor(ids(bound + 1)), NIXL, prompt_tokens=10)
    assert refused.value.reason is DescriptorReason.TOO_MANY_BLOCK_IDS


def test_the_fewest_tokens_reported_bound_the_ids() -> None:
    """The descriptor's own remote_num_tokens bounds it too, with no reply count, and the
    smaller of the two counts is the one that holds."""
    many = descriptor([list(range(50))], num_tokens=5)
    for reported in (None, 1000):
        with pytest.raises(DescriptorError):
            validate_descriptor(many, NIXL, prompt_tokens=reported)
    unbounded = descriptor([list(range(50))])  # no count at all: nothing to bound by
    assert validate_descriptor(unbounded, NIXL)["remote_block_ids"] == [list(range(50))]


def test_an_inflated_prefill_reply_is_the_producers_bad_descriptor() -> None:
    """The prefill reply, parsed as the lifecycle parses it: a fault of the producer, in the
    prefill phase, so nothing is sent to a consumer and the consumer is not charged."""
    reply = {
        "id": "cmpl-1",
        "choices": [{"index": 0, "text": "a", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        "kv_transfer_params": descriptor([list(range(1_500_000))], num_tokens=3),
    }
    body = json.dumps(reply).encode()
    assert len(body) > 10_000_000  # the decode body it would have made
    read = read_prefill_reply(Reply(200, body), PRODUCER, NIXL, None)
    assert isinstance(read, Fault)
    assert read.kind is FaultKind.BAD_DESCRIPTOR and read.status == 502
    assert read.engine == PRODUCER and read.phase == "prefill"
    assert "too_many_block_ids" in read.message
