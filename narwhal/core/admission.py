"""Admission control: the router's own bound on requests in flight.

Rule kept here: a request that would be one more than ``admission.max_requests_in_flight`` is
refused at once, before it holds anything (live: before its body is read; no placement, no
engine touched). A refusal is the router's own: no engine is charged, and the decision log says
``admission_refused`` (with the request id and the count in flight).

Theory of operation: :class:`Admission` is a counter, one per router (``Policies.admission``):
:meth:`~Admission.try_admit` takes a slot or logs the refusal, :meth:`~Admission.release` gives
the slot back; every admitted request releases exactly once, in a ``finally``. How a refused
request is answered (503 with ``Retry-After``) and where each driver admits is
:mod:`narwhal.core.entry`.
"""

from __future__ import annotations

from narwhal.core.config import AdmissionSettings
from narwhal.core.records import DecisionLog

REFUSED = "admission_refused"
"""The decision kind of a refusal."""


class Admission:
    """Requests in flight against ``max_requests_in_flight``; refusals counted and logged."""

    def __init__(self, settings: AdmissionSettings, log: DecisionLog) -> None:
        self.limit = settings.max_requests_in_flight
        self.retry_after_s = settings.retry_after_s
        self.in_flight = 0
        self.refused = 0
        self._log = log

    def try_admit(self, now: float, request_id: str) -> bool:
        """Take a slot for ``request_id``; False (and a logged refusal) when none is free."""
        if self.in_flight < self.limit:
            self.in_flight += 1
            return True
        self.refused += 1
        self._log.add(now, REFUSED, None, request=request_id, in_flight=self.in_flight)
        return False

    def take(self) -> bool:
        """Take a slot without logging a refusal (flow control's dispatch); False when full."""
        if self.in_flight < self.limit:
            self.in_flight += 1
            return True
        return False

    def release(self) -> None:
        """Give back the slot of an admitted request (once per admitted request)."""
        if self.in_flight <= 0:
            raise RuntimeError("admission released more often than admitted")
        self.in_flight -= 1

    def message(self) -> str:
        return (
            f"the router is at its limit of {self.limit} requests in flight "
            f"(admission.max_requests_in_flight); retry after {self.retry_after_s} s"
        )
