"""The shared fault vocabulary: one name per fault, old names and other worlds' faults refused
with a message that says what to use."""

from __future__ import annotations

import pytest

from narwhal.core.injected_faults import (
    BY_NAME,
    EMULATOR,
    FAULTS,
    PARAMETERS,
    PRODUCER_FAULTS,
    RENAMED,
    RENAMED_PARAMETERS,
    SIMULATOR,
    STREAM_FAULTS,
    FaultNameError,
    World,
    check_code,
    check_parameters,
    fault_named,
    names_in,
)


def test_names_are_unique_and_old_names_are_not_current_ones() -> None:
    assert len(BY_NAME) == len(FAULTS)
    assert not set(RENAMED) & set(BY_NAME)
    assert not set(RENAMED_PARAMETERS) & set(PARAMETERS)


def test_every_fault_is_acted_out_somewhere_and_takes_only_known_parameters() -> None:
    for fault in FAULTS:
        assert fault.worlds, fault.name
        for taken in fault.parameters.values():
            assert set(taken) <= set(PARAMETERS), fault.name


@pytest.mark.parametrize("world", list(World))
@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_an_old_name_is_refused_naming_the_new_one(old: str, new: str, world: World) -> None:
    with pytest.raises(FaultNameError, match=f"'{old}' is now called '{new}'"):
        fault_named(old, world)
    assert world in BY_NAME[new].worlds  # every renamed fault is one both worlds act out


@pytest.mark.parametrize("name", sorted(names_in(SIMULATOR) ^ names_in(EMULATOR)))
def test_a_fault_of_one_world_is_refused_by_the_other_naming_its_world(name: str) -> None:
    (home,) = BY_NAME[name].worlds
    other = EMULATOR if home is SIMULATOR else SIMULATOR
    assert fault_named(name, home).name == name
    with pytest.raises(FaultNameError, match=f"by the {home.value} only, not by the {other.value}"):
        fault_named(name, other)


def test_an_unknown_name_lists_what_the_world_acts_out() -> None:
    with pytest.raises(FaultNameError, match="unknown fault kind 'melt'") as caught:
        fault_named("melt", SIMULATOR)
    assert "crash" in str(caught.value) and "freeze" not in str(caught.value)


def test_the_shared_faults_are_the_simulators_names() -> None:
    shared = names_in(SIMULATOR) & names_in(EMULATOR)
    assert set(RENAMED.values()) <= shared
    assert {"early_done", "disconnect", "refused", "http_5xx", "hang", "stall"} <= shared


def test_an_old_parameter_is_refused_naming_the_new_one() -> None:
    with pytest.raises(FaultNameError, match="'after' is now called 'after_tokens'"):
        check_parameters(BY_NAME["stall"], ["after"], EMULATOR)


def test_a_parameter_is_checked_per_world_and_scheduling_keys_are_left_alone() -> None:
    http_5xx = BY_NAME["http_5xx"]
    check_parameters(http_5xx, ["code", "count", "phase"], EMULATOR)
    check_parameters(http_5xx, ["at_s", "probability"], SIMULATOR)
    with pytest.raises(
        FaultNameError, match="'code' does not apply to 'http_5xx' in the simulator"
    ):
        check_parameters(http_5xx, ["code"], SIMULATOR)
    with pytest.raises(FaultNameError, match=r"it takes after_tokens\)"):
        check_parameters(BY_NAME["disconnect"], ["seconds"], EMULATOR)


def test_http_5xx_takes_server_error_codes_only() -> None:
    check_code(BY_NAME["http_5xx"], 503)
    with pytest.raises(FaultNameError, match="from 500 to 599, got 404"):
        check_code(BY_NAME["http_5xx"], 404)
    check_code(BY_NAME["inband_error"], 429)  # an in-band 4xx is passed through


def test_the_derived_sets() -> None:
    assert {f.name for f in FAULTS if f.takes("after_tokens", SIMULATOR)} == STREAM_FAULTS
    assert {"stall", "early_done", "inband_error", "disconnect"} == STREAM_FAULTS
    assert {"release_handoff", "bad_descriptor"} == PRODUCER_FAULTS
