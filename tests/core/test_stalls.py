"""The stall ledger at its boundaries, with injected time: what counts as a stall, the stall in
progress, and how far a pending deadline moves."""

from __future__ import annotations

import pytest

from narwhal.core.stalls import StallLedger


def ledger() -> StallLedger:
    """A ledger started at 0 with a 0.1 s heartbeat and a 0.05 s tolerance (first beat due 0.1)."""
    stalls = StallLedger(heartbeat_s=0.1, tolerance_s=0.05)
    stalls.start(0.0)
    return stalls


def beat_on_time(stalls: StallLedger, until: float) -> None:
    while stalls.due is not None and stalls.due <= until + 1e-9:
        assert stalls.beat(stalls.due) == 0.0


def test_a_beat_late_by_the_tolerance_is_jitter_and_one_later_is_a_stall() -> None:
    stalls = ledger()
    assert stalls.beat(0.15) == 0.0  # late by exactly the tolerance: jitter
    assert stalls.due == pytest.approx(0.25) and stalls.count == 0
    assert stalls.beat(0.3500001) == pytest.approx(0.1000001)  # late by more: all of it counts
    assert stalls.count == 1 and stalls.total_s == pytest.approx(0.1000001)
    assert stalls.last_stall_at == 0.3500001


def test_the_stall_in_progress_counts_before_the_heartbeat_reports_it() -> None:
    stalls = ledger()
    assert stalls.stalled(0.15) == 0.0  # overdue by the tolerance: not yet a stall
    assert stalls.stalled(0.6) == pytest.approx(0.5)  # overdue by 0.5 s: stalled now
    assert stalls.beat(0.6) == pytest.approx(0.5)  # the heartbeat then reports the same stall
    assert stalls.stalled(0.6) == pytest.approx(0.5)  # counted once
    assert stalls.stalled(0.7) == pytest.approx(0.5)


def test_without_stalls_a_deadline_is_exact() -> None:
    stalls = ledger()
    mark = stalls.total_s
    beat_on_time(stalls, 0.4)
    assert stalls.extended(0.4, mark, 0.4) == 0.4
    assert stalls.extended(0.4, mark, 0.45) == 0.4  # the next beat overdue by the tolerance


def test_a_deadline_moves_by_the_stalls_since_its_wait_began() -> None:
    stalls = ledger()
    beat_on_time(stalls, 0.1)
    mark = stalls.total_s  # a wait begins at 0.1 with deadline 1.0
    beat_on_time(stalls, 0.2)
    assert stalls.beat(0.8) == pytest.approx(0.5)  # stalled from about 0.2 to 0.8
    beat_on_time(stalls, 1.0)
    assert stalls.extended(1.0, mark, 1.0) == pytest.approx(1.5)  # moved by the 0.5 s stall
    after = stalls.total_s  # a wait that began after the stall is not moved by it
    beat_on_time(stalls, 2.0)
    assert stalls.extended(2.0, after, 2.0) == 2.0


def test_a_deadline_due_in_a_stall_waits_a_heartbeat_after_it_whatever_the_beat_missed() -> None:
    # The beat due at 0.4 comes after the deadline at 0.35; the loop stalls from 0.36 to 1.0.
    # The heartbeat sees the stall only from 0.4 (0.6 s), so the moved deadline (0.95) alone
    # would be judged at once, before the loop read the replies that came during the stall.
    stalls = ledger()
    beat_on_time(stalls, 0.3)
    mark = stalls.total_s
    assert stalls.extended(0.35, mark, 1.0) == pytest.approx(1.1)  # in progress: a period on
    assert stalls.beat(1.0) == pytest.approx(0.6)  # the heartbeat runs right after
    assert stalls.extended(0.35, mark, 1.05) == pytest.approx(1.1)
    assert stalls.extended(0.35, mark, 1.1) == pytest.approx(1.1)  # now it is judged


def test_without_a_running_monitor_nothing_is_overdue() -> None:
    never = StallLedger()
    assert never.stalled(1e6) == 0.0 and never.extended(5.0, 0.0, 1e6) == 5.0
    stopped = ledger()
    stopped.beat(0.5)
    stopped.stop()
    assert stopped.stalled(100.0) == pytest.approx(0.4)  # what it measured, nothing more
