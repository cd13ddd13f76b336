"""The runner: arrivals start on time and in order; a run leaves the process's garbage collector
as it found it (a library does not tune the process), and what the collector does after a run
does not change its records."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from narwhal.sim.runner import run

from .conftest import scenario


@pytest.fixture
def custom_thresholds() -> Iterator[tuple[int, int, int]]:
    saved = gc.get_threshold()
    gc.set_threshold(1234, 7, 9)
    try:
        yield (1234, 7, 9)
    finally:
        gc.set_threshold(*saved)


def test_a_run_leaves_the_collector_as_it_found_it(
    custom_thresholds: tuple[int, int, int],
) -> None:
    result = run(scenario(workload={"duration_s": 1.0}))
    assert result.records
    assert gc.get_threshold() == custom_thresholds


def test_requests_start_at_their_arrivals_in_order_one_timer_per_arrival_time() -> None:
    """Arrivals due together start together, in trace order; a request waited for starts when
    its timer fires (SimPy's ``now + delay``), not after a second timer for the rounding."""
    arrivals = [0.0, 0.0, 0.127, 2.834, 2.834, 3.5]
    fixed = {"kind": "fixed", "arrivals_s": arrivals, "prompt": None, "output": None}
    result = run(scenario(workload=fixed))
    started = sorted((int(r.request_id[4:]), r.arrival) for r in result.records)
    reached = 0.127 + (2.834 - 0.127)  # 2.8339999999999996: where one timer from 0.127 lands
    # (so req-4, due at 2.834, is still 4e-16 s ahead then and gets a timer of its own)
    assert started == list(enumerate([0.0, 0.0, 0.127, reached, 2.834, 3.5]))


def test_progress_watches_every_request_end_and_changes_nothing() -> None:
    seen: list[tuple[int, int]] = []
    watched = run(scenario(workload={"duration_s": 1.0}), progress=lambda *p: seen.append(p))
    plain = run(scenario(workload={"duration_s": 1.0}))
    total = len(plain.records)
    assert total > 0 and seen == [(n, total) for n in range(1, total + 1)]
    assert watched.records == plain.records and watched.decisions == plain.decisions


def test_requests_cut_off_by_the_end_of_the_run_stay_without_a_record() -> None:
    """A request still running at ``max_sim_s`` is unfinished, even once the collector closes
    its coroutine (the core then writes a record for it, which the run no longer takes)."""
    hung = {
        "engine": {
            "first_token_timeout_s": 86400,
            "decode_read_timeout_s": 0,
            "request_timeout_s": 86400,
        },
        "fleet": {"prefill": 1, "decode": 1},
        "workload": {"kind": "fixed", "arrivals_s": [0.0, 0.5], "prompt": None, "output": None},
        "faults": [{"kind": "hang", "role": "decode", "at_s": 0.0, "duration_s": 1e7}],
        "sim": {"max_sim_s": 5.0, "health_checks": False},
    }
    result = run(scenario(**hung))
    assert result.records == []
    gc.collect()  # closes the two requests' coroutines, which nothing references any more
    assert result.records == []
