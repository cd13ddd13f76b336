"""Retry policy: the retry budget, the request deadline and the handoff age.

Rule kept here: every retry decision needs all of (a) no visible output yet, (b) a transient
fault, (c) attempts left, (d) the deadline permits another attempt, (e) budget room — and each
is a pure function of the values passed in.

Theory of operation: :class:`RetryBudget` follows Envoy's retry budget: concurrent retries may
not exceed ``max(retry_budget_min, retry_budget_ratio x active requests)``. :class:`Deadline` is
the original request's absolute deadline; an attempt is only started when the time left covers
the shortest attempt seen so far (a retry that cannot even reach its handoff before the deadline
only wastes an engine). The handoff age starts when the producer HTTP leg starts.

The prefill fallback (``[routing] prefill_fallback = "local"``) is decided by
:func:`falls_back_locally` once no retry is left: a request whose last attempt failed on its
producer, before any visible output and before its deadline, gets one more attempt in which its
consumer prefills the prompt itself (no transfer parameters). It takes no retry budget (it is at
most one per request and asks no producer) and needs only time left, not the failed producer
attempt's duration: a producer that hung until its timeout says nothing of how long a consumer
takes.
"""

from __future__ import annotations

from typing import Final

from narwhal.core.errors import Fault


class RetryBudget:
    """Bounds concurrent retries to a share of active requests, with a floor."""

    def __init__(self, ratio: float, minimum: int) -> None:
        self.ratio = ratio
        self.minimum = minimum
        self.active_requests = 0
        self.active_retries = 0

    def allowance(self) -> int:
        return max(self.minimum, int(self.ratio * self.active_requests))

    def request_started(self) -> None:
        self.active_requests += 1

    def request_finished(self) -> None:
        self.active_requests -= 1

    def try_acquire(self) -> bool:
        """Take room for one retry; False when the budget is exhausted."""
        if self.active_retries >= self.allowance():
            return False
        self.active_retries += 1
        return True

    def release(self) -> None:
        self.active_retries -= 1


class Deadline:
    """The original request's deadline (absolute time on the port clock)."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at: Final = at

    def remaining(self, now: float) -> float:
        return self.at - now

    def expired(self, now: float) -> bool:
        return now >= self.at

    def permits_attempt(self, now: float, shortest_attempt_s: float = 0.0) -> bool:
        """True when an attempt needing at least ``shortest_attempt_s`` can still finish."""
        return self.remaining(now) > shortest_attempt_s


def handoff_too_old(prefill_started: float, now: float, max_age_s: float) -> bool:
    """A handoff older than ``max_age_s`` is not used: the producer may have freed its blocks."""
    return now - prefill_started > max_age_s


def falls_back_locally(
    failure: Fault,
    *,
    enabled: bool,
    committed: bool,
    fell_back: bool,
    producer: str | None,
    now: float,
    deadline: Deadline,
) -> bool:
    """Whether a request whose attempt ended in ``failure`` (and that may not retry) has its
    consumer prefill the prompt instead (module docstring): the fallback is ``enabled``, it was
    not taken already, nothing is visible, the deadline has not passed, and ``failure`` is a
    transient fault charged to this attempt's ``producer`` in its prefill phase."""
    return (
        enabled
        and not fell_back
        and not committed
        and failure.retryable
        and producer is not None
        and failure.engine == producer
        and failure.phase == "prefill"
        and not deadline.expired(now)
    )
