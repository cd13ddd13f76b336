"""The router's own stalls: what counts as one, and how it moves a deadline.

Rule kept here: time the router's event loop spent stalled (not running: a blocking call, a
burst of CPU work) is charged to nobody. Every deadline the live router enforces on an engine or
a client (a read, a call, a write) counts only time the loop was running: the stalls measured
while it was pending push it back by their length, and it is never judged within a heartbeat
period of a stall's end. So a reply that arrived during a stall is read before its deadline is
judged, and no engine is blamed for the router's lag.

Theory of operation: a heartbeat (the live driver's lag monitor) calls :meth:`StallLedger.beat`
every :data:`HEARTBEAT_S`; a beat later than due by more than :data:`STALL_TOLERANCE_S` (more
than the jitter of a busy but healthy loop) measured a stall of that lateness, added to
:attr:`StallLedger.total_s`. :meth:`StallLedger.stalled` is that total plus the stall still in
progress (a beat overdue by more than the tolerance), so a deadline whose timer runs right after
a stall, before the heartbeat does, sees it too. A wait records the total when it starts
(its *mark*); when its deadline comes due, :meth:`StallLedger.extended` is the deadline pushed
back by what was stalled since the mark, and at least a heartbeat period after the stall ended
(a stall still in progress ends now): the loop then has turned, read its sockets and beaten, so
the replies that came during the stall are in, whatever part of the stall the heartbeat could
not see (it cannot tell when in its period a stall began). The wait ends only once that time has
passed. A stall shorter than the tolerance plus a heartbeat period can go unseen: the precision
of a deadline under stalls. The ledger reads no clock; callers pass ``now``.

Only the live router uses the ledger: a simulated router is never stalled (the core's work takes
no simulated time, and simulated time does not pass while it runs), so in a simulation every
deadline is exact and nothing needs pushing back; the decision lives here all the same, and the
live waits (:mod:`narwhal.live.waits`) only apply it.
"""

from __future__ import annotations

import math

HEARTBEAT_S = 0.05
"""How often the lag monitor beats."""

STALL_TOLERANCE_S = 0.05
"""A beat later than this is a stall; anything less is a healthy loop's jitter."""


class StallLedger:
    """The router's measured stalls (seconds), from the heartbeats the lag monitor reports."""

    __slots__ = ("count", "due", "heartbeat_s", "last_stall_at", "tolerance_s", "total_s")

    def __init__(
        self, heartbeat_s: float = HEARTBEAT_S, tolerance_s: float = STALL_TOLERANCE_S
    ) -> None:
        self.heartbeat_s = heartbeat_s
        self.tolerance_s = tolerance_s
        self.total_s = 0.0  # stalled seconds measured so far
        self.count = 0  # stalls measured so far
        self.last_stall_at = -math.inf  # when the heartbeat last reported a stall (its end)
        self.due: float | None = None  # when the next beat is due (None: no monitor running)

    def start(self, now: float) -> None:
        """The monitor starts beating (its first beat due a period from ``now``)."""
        self.due = now + self.heartbeat_s

    def stop(self) -> None:
        """The monitor stopped: nothing is overdue any more."""
        self.due = None

    def _overdue(self, now: float) -> float:
        due = self.due
        if due is None:
            return 0.0
        late = now - due
        return late if late > self.tolerance_s else 0.0

    def beat(self, now: float) -> float:
        """The heartbeat ran at ``now``: the stall it measured (0.0: none)."""
        stall = self._overdue(now)
        if stall > 0.0:
            self.total_s += stall
            self.count += 1
            self.last_stall_at = now
        self.due = now + self.heartbeat_s
        return stall

    def stalled(self, now: float) -> float:
        """Stalled seconds up to ``now``, the stall still in progress included."""
        return self.total_s + self._overdue(now)

    def extended(self, deadline: float, mark: float, now: float) -> float:
        """``deadline`` of a wait that started when :attr:`total_s` was ``mark``, pushed back by
        the stalls since and to a heartbeat period after the last of them ended; the wait ends
        once ``now`` reaches it."""
        in_progress = self._overdue(now)
        moved = self.total_s + in_progress - mark
        if moved <= 0.0:
            return deadline
        ended = now if in_progress > 0.0 else self.last_stall_at
        return max(deadline + moved, ended + self.heartbeat_s)
