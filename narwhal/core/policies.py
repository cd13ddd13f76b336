"""The policy objects of one router (or one simulated router), built from the configuration.

Rule kept here: all randomness of a router derives from one seed, split into one independent
RNG per policy, so adding draws in one policy never shifts another's decisions.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from narwhal.core.admission import Admission
from narwhal.core.breaker import Breaker
from narwhal.core.config import NarwhalConfig
from narwhal.core.placement import Placement
from narwhal.core.records import DecisionLog, RequestRecord
from narwhal.core.retry import RetryBudget


class Policies:
    """Admission, breaker, placement, retry budget, id source and decision log of one router."""

    def __init__(
        self,
        config: NarwhalConfig,
        *,
        seed: int = 0,
        log: DecisionLog | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
    ) -> None:
        root = random.Random(seed)
        self.config = config
        self.log = log if log is not None else DecisionLog()
        roles = {entry.url: entry.role for entry in config.engines}
        self.breaker = Breaker(
            roles.items(),
            config.recovery,
            random.Random(root.getrandbits(64)),
            self.log,
            contract_configured=config.engine_contract is not None,
        )
        self.placement = Placement(
            roles, self.breaker, random.Random(root.getrandbits(64)), self.log, config.routing
        )
        self.budget = RetryBudget(
            config.recovery.retry_budget_ratio, config.recovery.retry_budget_min
        )
        self._ids = random.Random(root.getrandbits(64))
        self.admission = Admission(config.admission, self.log)
        # read on every request; the configuration does not change under a router
        self.kv_connector = config.kv_connector
        self._side_channels = {entry.url: entry.kv_endpoint for entry in config.engines}
        self.on_record = on_record or (lambda record: None)

    def new_id(self, prefix: str) -> str:
        """A fresh backend request id: ``prefix``, then six seeded random bytes in hex (so runs
        replay exactly)."""
        return f"{prefix}-{self._ids.getrandbits(48).to_bytes(6, 'big').hex()}"

    def pinned_side_channel(self, producer: str) -> str | None:
        return self._side_channels[producer]
