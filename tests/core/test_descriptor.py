"""Tests for narwhal.core.descriptor: the decode-leg descriptor's validation (the prefill-leg
params and side-channel helpers: test_descriptor_helpers.py)."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.core.descriptor import (
    KNOWN_CONNECTORS,
    DescriptorError,
    DescriptorReason,
    parse_side_channel,
    prefill_kv_params,
    side_channel_of,
    validate_descriptor,
)

NIXL = "NixlConnector"
MOONCAKE = "MooncakeConnector"
R = DescriptorReason

# A producer response as vLLM 0.32.0's NixlConnector sends it, verbatim.
VLLM_NIXL_EXAMPLE: dict[str, Any] = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[1, 2, 3]],
    "remote_engine_id": "028bffdc-...-4b5060f7db4a",
    "remote_request_id": "cmpl-<id>-0-bf6560ae",
    "remote_host": "127.0.0.1",
    "remote_port": 5559,
    "tp_size": 1,
    "dcp_size": 1,
    "pp_size": 1,
    "remote_num_tokens": 301,
    "remote_blocks_expiry_time": None,
    "transfer_mode": "pull",
    "remote_prefill_cached_tokens": 0,
}

# A Mooncake decode-leg descriptor as vLLM's proxy builds it.
MOONCAKE_EXAMPLE: dict[str, Any] = {
    "do_remote_decode": False,
    "do_remote_prefill": True,
    "transfer_id": "xfer-cmpl-42",
    "remote_engine_id": "engine-1_dp0",
    "remote_bootstrap_addr": "http://10.0.0.1:8998",
}

KNOWN_KEYS = frozenset(
    {
        "do_remote_prefill",
        "do_remote_decode",
        "remote_block_ids",
        "remote_engine_id",
        "remote_request_id",
        "remote_host",
        "remote_port",
        "transfer_mode",
        "transfer_id",
        "remote_bootstrap_addr",
        "disagg_spec",
        "ret_first_tok",
    }
)

FAST = settings(derandomize=True, max_examples=150, deadline=None)


# --------------------------------------------------------------------------------------------
# Strategies

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
extra_fields = st.dictionaries(
    st.text(min_size=1, max_size=12).filter(lambda k: k not in KNOWN_KEYS),
    json_values,
    max_size=4,
)
engine_ids = st.builds(
    lambda base, dp: base if dp is None else f"{base}_dp{dp}",
    st.text(min_size=1, max_size=20).filter(lambda s: s.strip() != ""),
    st.none() | st.integers(min_value=0, max_value=15),
)
hosts = st.sampled_from(["127.0.0.1", "localhost", "10.0.0.7", "prefill-0.svc.local", "::1"])
ports = st.integers(min_value=1, max_value=65535)
block_id = st.integers(min_value=0, max_value=2**40)
flat_ids = st.lists(block_id, max_size=6)
nested_ids = st.lists(st.lists(block_id, max_size=6), max_size=3)
block_ids = nested_ids | flat_ids


@st.composite
def nixl_descriptors(draw: st.DrawFn) -> dict[str, Any]:
    mode = draw(st.sampled_from(["absent", None, "pull", "push"]))
    d: dict[str, Any] = draw(extra_fields)
    d["do_remote_prefill"] = True
    if draw(st.booleans()):
        d["do_remote_decode"] = draw(st.sampled_from([False, None]))
    d["remote_engine_id"] = draw(engine_ids)
    if draw(st.booleans()):
        d["remote_request_id"] = f"cmpl-{draw(st.uuids())}-0"
    d["remote_host"] = draw(hosts)
    d["remote_port"] = draw(ports)
    if mode != "absent":
        d["transfer_mode"] = mode
    if mode == "push":
        choice = draw(st.sampled_from(["absent", "none", "ids"]))
        if choice == "none":
            d["remote_block_ids"] = None
        elif choice == "ids":
            d["remote_block_ids"] = draw(block_ids)
    else:
        d["remote_block_ids"] = draw(block_ids)
    return d


@st.composite
def mooncake_descriptors(draw: st.DrawFn) -> dict[str, Any]:
    d: dict[str, Any] = draw(extra_fields)
    d["do_remote_prefill"] = True
    if draw(st.booleans()):
        d["do_remote_decode"] = False
    d["transfer_id"] = draw(st.text(min_size=1, max_size=20).filter(lambda s: s.strip() != ""))
    d["remote_engine_id"] = draw(engine_ids)
    host = draw(hosts)
    if ":" in host:
        host = f"[{host}]"
    scheme = draw(st.sampled_from(["", "http://"]))
    d["remote_bootstrap_addr"] = f"{scheme}{host}:{draw(ports)}"
    return d


connector_and_descriptor = st.one_of(
    st.tuples(st.just(NIXL), nixl_descriptors()),
    st.tuples(st.just(MOONCAKE), mooncake_descriptors()),
)


def _lists_in(value: Any) -> list[Any]:
    """Every list and dict nested anywhere in value (value included)."""
    found: list[Any] = []
    if isinstance(value, list):
        found.append(value)
        for item in value:
            found.extend(_lists_in(item))
    elif isinstance(value, dict):
        found.append(value)
        for item in value.values():
            found.extend(_lists_in(item))
    return found


# --------------------------------------------------------------------------------------------
# Valid descriptors


@FAST
@given(connector_and_descriptor)
def test_valid_descriptor_returns_equal_deep_copy(case: tuple[str, dict[str, Any]]) -> None:
    connector, descriptor = case
    before = copy.deepcopy(descriptor)
    result = validate_descriptor(descriptor, connector)
    assert result == descriptor
    assert descriptor == before  # validation never mutates its input
    assert result is not descriptor
    originals = {id(c) for c in _lists_in(descriptor)}
    assert not originals & {id(c) for c in _lists_in(result)}  # no container shared
    result.clear()
    assert descriptor == before


@FAST
@given(connector_and_descriptor)
def test_undetached_validation_returns_the_value_itself_unchanged(
    case: tuple[str, dict[str, Any]],
) -> None:
    connector, descriptor = case
    before = copy.deepcopy(descriptor)
    assert validate_descriptor(descriptor, connector, detach=False) is descriptor
    assert descriptor == before


def test_undetached_validation_still_refuses_a_bad_descriptor() -> None:
    bad = {**VLLM_NIXL_EXAMPLE, "remote_block_ids": [[1, -2]]}
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(bad, NIXL, detach=False)
    assert info.value.reason is R.MALFORMED_BLOCK_IDS


@FAST
@given(connector_and_descriptor)
def test_valid_descriptor_passes_its_own_pinned_side_channel(
    case: tuple[str, dict[str, Any]],
) -> None:
    connector, descriptor = case
    pinned = side_channel_of(descriptor, connector)
    assert pinned is not None
    assert validate_descriptor(descriptor, connector, pinned) == descriptor
    host, port = parse_side_channel(pinned)
    assert validate_descriptor(descriptor, connector, f"{host.upper()}:{port}") == descriptor


@FAST
@given(nixl_descriptors())
def test_mutating_result_block_ids_leaves_input(descriptor: dict[str, Any]) -> None:
    before = copy.deepcopy(descriptor)
    result = validate_descriptor(descriptor, NIXL)
    ids = result.get("remote_block_ids")
    if isinstance(ids, list):
        ids.append(7)
        for group in ids:
            if isinstance(group, list):
                group.append(7)
    result["remote_engine_id"] = "changed"
    assert descriptor == before


# --------------------------------------------------------------------------------------------
# Corrupted descriptors

Corruption = Callable[[st.DataObject, str, dict[str, Any]], tuple[str | None, DescriptorReason]]


def _drop_engine_id(data: st.DataObject, c: str, d: dict[str, Any]) -> tuple[None, R]:
    del d["remote_engine_id"]
    return None, R.MISSING_ENGINE_IDENTITY


def _blank_engine_id(data: st.DataObject, c: str, d: dict[str, Any]) -> tuple[None, R]:
    d["remote_engine_id"] = data.draw(st.sampled_from(["", " ", "\t\n"]))
    return None, R.MISSING_ENGINE_IDENTITY


def _non_str_engine_id(data: st.DataObject, c: str, d: dict[str, Any]) -> tuple[None, R]:
    d["remote_engine_id"] = data.draw(
        st.sampled_from([None, 42, True, 1.5, ["e"], {"id": "e"}, b"engine"])
    )
    return None, R.MISSING_ENGINE_IDENTITY


def _bad_identity_field(data: st.DataObject, c: str, d: dict[str, Any]) -> tuple[None, R]:
    if c == NIXL:
        field = data.draw(st.sampled_from(["remote_host", "remote_port", "remote_request_id"]))
        table: dict[str, list[Any]] = {
            "remote_host": [None, "", "  ", 127],
            "remote_port": [None, 0, 65536, -1, "5559", True, 5559.0],
            "remote_request_id": [None, "", 7],
        }
    else:
        field = data.draw(st.sampled_from(["transfer_id", "remote_bootstrap_addr"]))
        table = {
            "transfer_id": [None, "", " ", 3],
            "remote_bootstrap_addr": [None, "", "10.0.0.1", "10.0.0.1:0", "h:x", ":8998", 8998],
        }
    if data.draw(st.booleans()) and field != "remote_request_id":
        del d[field]
    else:
        d[field] = data.draw(st.sampled_from(table[field]))
    return None, R.MISSING_ENGINE_IDENTITY


def _bad_ids(data: st.DataObject, bad_item: Any) -> list[Any]:
    ids = data.draw(flat_ids)
    ids.insert(data.draw(st.integers(0, len(ids))), bad_item)
    if data.draw(st.booleans()):  # nested: hide it in one of the groups
        groups = data.draw(nested_ids)
        groups.insert(data.draw(st.integers(0, len(groups))), ids)
        return groups
    return ids


def _block_ids_none(data: st.DataObject, c: str, d: dict[str, Any]) -> tuple[None, R]:
    d["transfer_mode"] = data.draw(st.sampled_from(["pull", None]))
    if data.draw(st.booleans()):
        d["remote_block_ids"] = None
    else:
        d.pop("remote_block_ids", None)
    return None, R.MALFORMED_BLOCK_IDS


def _block_ids_wrong_type(data: st.DataObject, c: str, d: dict[str, Any]) -> tuple[None, R]:
    d["remote_block_ids"] = data.draw(st.sampled_from(["[1, 2]", "", 3, {"0": [1]}, (1, 2)]))
    return None, R.MALFORMED_BLOCK_IDS


def _block_ids_bad_item(data: st.DataObject, c: str, d: dict[str, Any]) -> tuple[None, R]:
    bad = data.draw(
        st.sampled_from([-1, -(2**40), True, False, 1.0, 2.5, "3", None, [[1]], {"b": 1}])
    )
    d["remote_block_ids"] = _bad_ids(data, bad)
    return None, R.MALFORMED_BLOCK_IDS


def _block_ids_mixed_nesting(data: st.DataObject, c: str, d: dict[str, Any]) -> tuple[None, R]:
    groups: list[Any] = data.draw(st.lists(st.lists(block_id, max_size=3), min_size=1))
    groups.insert(data.draw(st.integers(0, len(groups))), data.draw(block_id))
    d["remote_block_ids"] = groups
    return None, R.MALFORMED_BLOCK_IDS


def _other_connector_shape(data: st.DataObject, c: str, d: dict[str, Any]) -> tuple[None, R]:
    other = data.draw(mooncake_descriptors() if c == NIXL else nixl_descriptors())
    d.clear()
    d.update(other)
    return None, R.CONNECTOR_MISMATCH


def _foreign_key_added(data: st.DataObject, c: str, d: dict[str, Any]) -> tuple[None, R]:
    keys = ["transfer_id", "remote_bootstrap_addr"] if c == NIXL else ["remote_block_ids"]
    d[data.draw(st.sampled_from([*keys, "disagg_spec"]))] = data.draw(json_values)
    return None, R.CONNECTOR_MISMATCH


def _not_decode_leg(data: st.DataObject, c: str, d: dict[str, Any]) -> tuple[None, R]:
    if data.draw(st.booleans()):
        if data.draw(st.booleans()):
            del d["do_remote_prefill"]
        else:
            d["do_remote_prefill"] = data.draw(st.sampled_from([False, None, 1, "true"]))
    else:
        d["do_remote_decode"] = data.draw(st.sampled_from([True, 1, "yes"]))
    return None, R.CONNECTOR_MISMATCH


def _bad_transfer_mode(data: st.DataObject, c: str, d: dict[str, Any]) -> tuple[None, R]:
    d["transfer_mode"] = data.draw(st.sampled_from(["PULL", "write", "", 1, True]))
    return None, R.CONNECTOR_MISMATCH


def _pinned_elsewhere(data: st.DataObject, c: str, d: dict[str, Any]) -> tuple[str, R]:
    pinned = side_channel_of(d, c)
    assert pinned is not None
    host, port = parse_side_channel(pinned)
    if data.draw(st.booleans()):
        port = port % 65535 + 1  # another port, same host
    else:
        host = "192.0.2.1" if host != "192.0.2.1" else "192.0.2.2"
    pinned_form = data.draw(st.sampled_from(["{h}:{p}", "http://{h}:{p}"]))
    if ":" in host:
        host = f"[{host}]"
    return pinned_form.format(h=host, p=port), R.SIDE_CHANNEL_MISMATCH


COMMON: list[Corruption] = [
    _drop_engine_id,
    _blank_engine_id,
    _non_str_engine_id,
    _bad_identity_field,
    _other_connector_shape,
    _foreign_key_added,
    _not_decode_leg,
    _pinned_elsewhere,
]
NIXL_ONLY: list[Corruption] = [
    _block_ids_none,
    _block_ids_wrong_type,
    _block_ids_bad_item,
    _block_ids_mixed_nesting,
    _bad_transfer_mode,
]


@settings(derandomize=True, max_examples=400, deadline=None)
@given(case=connector_and_descriptor, data=st.data())
def test_any_single_corruption_is_rejected_with_its_reason(
    case: tuple[str, dict[str, Any]], data: st.DataObject
) -> None:
    connector, descriptor = case
    corruptions = COMMON + NIXL_ONLY if connector == NIXL else COMMON
    corrupt = data.draw(st.sampled_from(corruptions), label="corruption")
    pinned, reason = corrupt(data, connector, descriptor)
    before = copy.deepcopy(descriptor)
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(descriptor, connector, pinned)
    assert info.value.reason is reason, info.value.detail
    assert descriptor == before
    assert len(info.value.detail) < 400


# --------------------------------------------------------------------------------------------
# Explicit examples


def test_vllms_nixl_example_validates() -> None:
    result = validate_descriptor(VLLM_NIXL_EXAMPLE, NIXL, "127.0.0.1:5559")
    assert result == VLLM_NIXL_EXAMPLE
    assert result is not VLLM_NIXL_EXAMPLE
    assert result["remote_block_ids"] is not VLLM_NIXL_EXAMPLE["remote_block_ids"]
    assert type(result["remote_port"]) is int
    assert side_channel_of(result, NIXL) == "127.0.0.1:5559"


def test_localhost_is_not_127_0_0_1() -> None:
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(VLLM_NIXL_EXAMPLE, NIXL, "localhost:5559")
    assert info.value.reason is R.SIDE_CHANNEL_MISMATCH
    assert "localhost:5559" in info.value.detail  # what was pinned
    assert "127.0.0.1:5559" in info.value.detail  # what was found

    defaulted = {**VLLM_NIXL_EXAMPLE, "remote_host": "localhost"}
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(defaulted, NIXL, "127.0.0.1:5559")
    assert info.value.reason is R.SIDE_CHANNEL_MISMATCH
    assert "pins" in info.value.detail and "localhost:5559" in info.value.detail


def test_pinning_compares_host_case_insensitively_and_port_as_int() -> None:
    d = {**VLLM_NIXL_EXAMPLE, "remote_host": "Prefill-0.Local"}
    assert validate_descriptor(d, NIXL, "prefill-0.local:05559") == d
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(d, NIXL, "prefill-0.local:5600")
    assert info.value.reason is R.SIDE_CHANNEL_MISMATCH


def test_unparseable_pin_is_a_configuration_error() -> None:
    with pytest.raises(ValueError) as info:
        validate_descriptor(VLLM_NIXL_EXAMPLE, NIXL, "127.0.0.1")
    assert not isinstance(info.value, DescriptorError)


def test_empty_block_ids_are_valid() -> None:
    cases: list[list[Any]] = [[], [[]], [[], [4, 5]]]
    for ids in cases:
        d = {**VLLM_NIXL_EXAMPLE, "remote_block_ids": ids}
        assert validate_descriptor(d, NIXL) == d


def test_flat_block_ids_and_dp_suffix_are_valid() -> None:
    d = {**VLLM_NIXL_EXAMPLE, "remote_block_ids": [0, 1, 2], "remote_engine_id": "abc_dp1"}
    assert validate_descriptor(d, NIXL) == d


def test_bool_block_id_is_rejected() -> None:
    d = {**VLLM_NIXL_EXAMPLE, "remote_block_ids": [[1, True]]}
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(d, NIXL)
    assert info.value.reason is R.MALFORMED_BLOCK_IDS
    assert "remote_block_ids[0][1]" in info.value.detail and "bool" in info.value.detail


@pytest.mark.parametrize(
    ("field", "value", "where"),
    [
        ("tp_size", float("nan"), "tp_size"),
        ("remote_num_tokens", float("inf"), "remote_num_tokens"),
        ("extra", {"scores": [1.0, float("-inf")]}, "extra.scores[1]"),
    ],
)
def test_a_non_finite_number_anywhere_is_refused(field: str, value: Any, where: str) -> None:
    # what a parser lets through from "NaN", "Infinity" or "1e400": the decode leg's JSON
    # could not carry it
    d = {**VLLM_NIXL_EXAMPLE, field: value}
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(d, NIXL)
    assert info.value.reason is R.NON_FINITE_NUMBER
    assert info.value.detail.startswith(f"{where} is not a finite number")


def test_push_mode_needs_no_block_ids() -> None:
    push = {k: v for k, v in VLLM_NIXL_EXAMPLE.items() if k != "remote_block_ids"}
    push["transfer_mode"] = "push"
    assert validate_descriptor(push, NIXL, "127.0.0.1:5559") == push
    assert validate_descriptor({**push, "remote_block_ids": None}, NIXL)["remote_block_ids"] is None
    with pytest.raises(DescriptorError) as info:
        validate_descriptor({**push, "remote_block_ids": [-1]}, NIXL)
    assert info.value.reason is R.MALFORMED_BLOCK_IDS
    pull = {**push, "transfer_mode": "pull"}
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(pull, NIXL)
    assert info.value.reason is R.MALFORMED_BLOCK_IDS


def test_mooncake_example_validates() -> None:
    result = validate_descriptor(MOONCAKE_EXAMPLE, MOONCAKE, "10.0.0.1:8998")
    assert result == MOONCAKE_EXAMPLE and result is not MOONCAKE_EXAMPLE
    assert side_channel_of(MOONCAKE_EXAMPLE, MOONCAKE) == "10.0.0.1:8998"
    bare = {**MOONCAKE_EXAMPLE, "remote_bootstrap_addr": "10.0.0.1:8998"}
    assert validate_descriptor(bare, MOONCAKE, "http://10.0.0.1:8998") == bare
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(MOONCAKE_EXAMPLE, MOONCAKE, "10.0.0.2:8998")
    assert info.value.reason is R.SIDE_CHANNEL_MISMATCH


def test_shapes_of_the_other_connector_mismatch() -> None:
    for params, connector in ((MOONCAKE_EXAMPLE, NIXL), (VLLM_NIXL_EXAMPLE, MOONCAKE)):
        with pytest.raises(DescriptorError) as info:
            validate_descriptor(params, connector)
        assert info.value.reason is R.CONNECTOR_MISMATCH
    lmcache = {"ret_first_tok": 5, "disagg_spec": {"req_id": "r", "receiver_host": "h"}}
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(lmcache, NIXL)
    assert info.value.reason is R.CONNECTOR_MISMATCH
    # The router's own prefill-leg params echoed back are not a decode-leg descriptor.
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(prefill_kv_params(NIXL), NIXL)
    assert info.value.reason is R.CONNECTOR_MISMATCH


def test_unknown_connector() -> None:
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(VLLM_NIXL_EXAMPLE, "LMCacheConnectorV1")
    assert info.value.reason is R.UNKNOWN_CONNECTOR
    assert "LMCacheConnectorV1" in info.value.detail
    with pytest.raises(DescriptorError) as info:
        prefill_kv_params("P2pNcclConnector")
    assert info.value.reason is R.UNKNOWN_CONNECTOR
    with pytest.raises(DescriptorError) as info:
        side_channel_of(VLLM_NIXL_EXAMPLE, "nixl")
    assert info.value.reason is R.UNKNOWN_CONNECTOR


@pytest.mark.parametrize("params", [None, [], "kv", 0, ("a", 1), [VLLM_NIXL_EXAMPLE]])
def test_non_dict_is_not_an_object(params: object) -> None:
    for connector in (*KNOWN_CONNECTORS, "Unknown"):
        with pytest.raises(DescriptorError) as info:
            validate_descriptor(params, connector)
        assert info.value.reason is R.NOT_AN_OBJECT


def test_check_order_identity_before_block_ids() -> None:
    d = {**VLLM_NIXL_EXAMPLE, "remote_engine_id": "", "remote_block_ids": "bad"}
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(d, NIXL, "localhost:1")
    assert info.value.reason is R.MISSING_ENGINE_IDENTITY
    d = {**VLLM_NIXL_EXAMPLE, "remote_block_ids": "bad"}
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(d, NIXL, "localhost:1")
    assert info.value.reason is R.MALFORMED_BLOCK_IDS


def test_detail_never_dumps_huge_values() -> None:
    huge = {**VLLM_NIXL_EXAMPLE, "remote_block_ids": "x" * 100_000}
    with pytest.raises(DescriptorError) as info:
        validate_descriptor(huge, NIXL)
    assert "remote_block_ids" in info.value.detail and "str" in info.value.detail
    assert len(str(info.value)) < 200


def test_error_is_a_value_error_and_pickles() -> None:
    err = DescriptorError(R.MALFORMED_BLOCK_IDS, "remote_block_ids must be a list")
    assert isinstance(err, ValueError)
    assert str(err) == "malformed_block_ids: remote_block_ids must be a list"
    back = pickle.loads(pickle.dumps(err))
    assert back.reason is R.MALFORMED_BLOCK_IDS and back.detail == err.detail


def test_opaque_values_keep_their_types() -> None:
    d = {**VLLM_NIXL_EXAMPLE, "x_big": 2**70, "x_float": 1.0, "x_nested": {"a": [1, None]}}
    result = validate_descriptor(d, NIXL)
    assert type(result["x_big"]) is int and result["x_big"] == 2**70
    assert type(result["x_float"]) is float
    assert result["x_nested"] == {"a": [1, None]} and result["x_nested"] is not d["x_nested"]
