"""The policy objects of one router (or one simulated router), built from the configuration.

Rule kept here: all randomness of a router derives from one seed, split into one independent
RNG per policy, so adding draws in one policy never shifts another's decisions.

A running router's configuration changes only through :meth:`Policies.reconfigure` (a reload:
:mod:`narwhal.core.fleet_changes` decides what may change and how the fleet moves), which
swaps :attr:`Policies.config` whole when the reload is applied; a request reads the
configuration once, when it starts.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from narwhal.core.admission import Admission
from narwhal.core.breaker import Breaker
from narwhal.core.config import NarwhalConfig, Role
from narwhal.core.fleet_changes import FleetChanges, Reload
from narwhal.core.flow import FlowControl
from narwhal.core.placement import Placement
from narwhal.core.records import DecisionLog, RequestRecord
from narwhal.core.retry import RetryBudget
from narwhal.core.routing.kv_aware import BlockChain


def replica_seed(seed: int, index: int) -> int:
    """The policy seed of router replica ``index`` of a router seeded ``seed`` (a worker of
    ``narwhal serve --workers``, a simulated ``[router] replicas``): replica 0 has ``seed``
    itself, so one replica is the single router; the others' seeds are drawn from ``seed`` and
    ``index`` alone."""
    if index == 0:
        return seed
    return random.Random(f"{seed}/replica-{index}").getrandbits(64)


class Policies:
    """Admission, breaker, placement, retry budget, id source and decision log of one router."""

    def __init__(
        self,
        config: NarwhalConfig,
        *,
        seed: int = 0,
        log: DecisionLog | None = None,
        on_record: Callable[[RequestRecord], None] | None = None,
        block_chain: BlockChain | None = None,
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
            roles,
            self.breaker,
            random.Random(root.getrandbits(64)),
            self.log,
            config.routing,
            block_chain=block_chain,
        )
        self.budget = RetryBudget(
            config.recovery.retry_budget_ratio, config.recovery.retry_budget_min
        )
        self._ids = random.Random(root.getrandbits(64))
        self.admission = Admission(config.admission, self.log)
        self.fleet = FleetChanges(self.breaker, self.placement, self.log)
        # read on every request (engine_contract, which names it, is not reloadable)
        self.kv_connector = config.kv_connector
        self._side_channels = {entry.url: entry.kv_endpoint for entry in config.engines}
        self.on_record = on_record or (lambda record: None)
        self.flow = FlowControl(  # drawn last: its RNG shifts no other policy's draws
            config.flow,
            self.admission,
            self.placement.load_reports,
            self.engines_known,
            random.Random(root.getrandbits(64)),
            self.log,
        )

    def new_id(self, prefix: str) -> str:
        """A fresh backend request id: ``prefix``, then six seeded random bytes in hex (so runs
        replay exactly)."""
        return f"{prefix}-{self._ids.getrandbits(48).to_bytes(6, 'big').hex()}"

    def pinned_side_channel(self, producer: str) -> str | None:
        return self._side_channels[producer]

    def reconfigure(self, new: NarwhalConfig, now: float) -> Reload:
        """Reload: take ``new`` whole, or refuse it and keep the configuration (the result
        says which, and why)."""
        outcome = self.fleet.apply(self.config, new, now)
        if outcome.applied:
            self.config = new
            # a draining producer keeps its side channel until it is forgotten
            self._side_channels.update({entry.url: entry.kv_endpoint for entry in new.engines})
            self._drop(outcome.forgotten)
        return outcome

    def reload_invalid(self, reason: str, now: float) -> Reload:
        """A new configuration could not be read or validated: it is recorded, and ignored."""
        return self.fleet.invalid(reason, now)

    def settle(self, now: float) -> list[str]:
        """Forget the draining engines that hold nothing any more (their urls)."""
        forgotten = self.fleet.settle(now)
        self._drop(forgotten)
        return forgotten

    def engines_known(self) -> list[tuple[str, Role]]:
        """Every engine the router holds, (url, role): the configuration's, in its order,
        then the draining ones."""
        listed = [(entry.url, entry.role) for entry in self.config.engines]
        return listed + list(self.fleet.draining.items())

    def _drop(self, urls: Iterable[str]) -> None:
        for url in urls:
            self._side_channels.pop(url, None)
