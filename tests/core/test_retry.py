"""Retry budget, deadline and handoff age at their boundaries."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from narwhal.core.retry import Deadline, RetryBudget, handoff_too_old


def test_budget_floor_and_ratio() -> None:
    budget = RetryBudget(ratio=0.2, minimum=3)
    for _ in range(10):
        budget.request_started()
    assert budget.allowance() == 3  # 20% of 10 = 2, floor 3
    assert [budget.try_acquire() for _ in range(4)] == [True, True, True, False]
    budget.release()
    assert budget.try_acquire()
    for _ in range(40):
        budget.request_started()
    assert budget.allowance() == 10  # 20% of 50


def test_budget_exhausted_with_no_floor() -> None:
    budget = RetryBudget(ratio=0.0, minimum=0)
    budget.request_started()
    assert not budget.try_acquire()


@settings(derandomize=True)
@given(st.integers(0, 500), st.floats(0, 1), st.integers(0, 20))
def test_budget_never_exceeds_allowance(active: int, ratio: float, minimum: int) -> None:
    budget = RetryBudget(ratio, minimum)
    for _ in range(active):
        budget.request_started()
    granted = sum(budget.try_acquire() for _ in range(active + minimum + 5))
    assert granted == max(minimum, int(ratio * active))


def test_deadline_too_short_to_start_an_attempt() -> None:
    deadline = Deadline(at=100.0)
    assert deadline.permits_attempt(99.0, shortest_attempt_s=0.5)
    assert not deadline.permits_attempt(99.5, shortest_attempt_s=0.5)  # exactly enough: no
    assert not deadline.permits_attempt(100.0)
    assert deadline.expired(100.0) and not deadline.expired(99.999)


def test_handoff_age_boundary() -> None:
    assert not handoff_too_old(10.0, 35.0, 25.0)  # exactly max age: still usable
    assert handoff_too_old(10.0, 35.001, 25.0)
