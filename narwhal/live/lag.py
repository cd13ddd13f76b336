"""The live router's lag monitor: a heartbeat that measures its own event loop's stalls.

Rule kept here: the monitor only measures and reports; what counts as a stall and how a stall
moves a deadline is :mod:`narwhal.core.stalls`, and the waits that honour it are
:mod:`narwhal.live.waits`.

Theory of operation: :meth:`LagMonitor.run` runs for the router's life in the lifespan's task
group (no task of its own). It sleeps a heartbeat period and reports when it woke to the ledger
(:meth:`~narwhal.core.stalls.StallLedger.beat`); a wake-up late by more than the tolerance is a
stall, logged as a warning when it is long enough for an operator to care. When the monitor
stops, the ledger is told, so nothing counts as overdue without a heartbeat.
"""

from __future__ import annotations

import logging

import anyio

from narwhal.core.ports import Clock
from narwhal.core.stalls import StallLedger

WARN_STALL_S = 0.5
"""A stall at least this long is logged (shorter ones are only counted)."""

log = logging.getLogger("narwhal.live")


class LagMonitor:
    """Beats every ``ledger.heartbeat_s`` and reports each beat to ``ledger``."""

    def __init__(self, clock: Clock, ledger: StallLedger, *, warn_s: float = WARN_STALL_S) -> None:
        self.clock = clock
        self.ledger = ledger
        self.warn_s = warn_s

    async def run(self) -> None:
        ledger = self.ledger
        ledger.start(self.clock.now())
        try:
            while True:
                await anyio.sleep(ledger.heartbeat_s)
                stall = ledger.beat(self.clock.now())
                if stall >= self.warn_s:
                    log.warning(
                        "event loop stalled for %.3f s: deadlines pending during it were "
                        "extended by as much, so no engine or client is blamed for it",
                        stall,
                    )
        finally:
            ledger.stop()
