"""Router replicas: N independent routers in front of one simulated fleet, as N worker
processes (``narwhal serve --workers N``) or N router instances behind an L4 balancer are.

Rule kept here: replicas share nothing but the fleet. Each has its own
:class:`~narwhal.core.policies.Policies` (breaker, quarantine, retry budget, admission,
reservations and load reports, prefix index, id source, decision log) and its own maintenance
loop (its own probes and health checks); a client request is served whole by the one replica
its connection landed on. With ``replicas = 1`` the run is exactly the single router's: replica
0 gets the router's seed and the router's decision log, and spreading draws nothing.

Theory of operation: ``[router]`` (:class:`RouterReplicaSettings`) gives the count and how
arrivals are spread. ``spread = "random"`` (the default) picks a replica uniformly at random
per request from a seeded RNG of its own: that is what Linux's ``SO_REUSEPORT`` does (it hashes
each new connection's 4-tuple onto one of the listening sockets, so a fresh connection lands on
a replica independently of the others, and no replica is told what the others hold), and what
a hashing L4 balancer does; a request is modelled as one connection. ``spread =
"round_robin"`` deals requests in turn, the most even split any balancer achieves, to separate
the cost of unshared state from the cost of uneven load. Replica ``k`` gets
:func:`~narwhal.core.policies.replica_seed` (drawn from the router's seed and ``k``, never from
the run's root RNG, so no other part's draws move), the seed worker ``k`` of ``narwhal serve
--workers`` gets. Results: :attr:`RouterReplicas.replica_of` says which replica served each request;
:func:`replica_summary` counts per replica.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from narwhal.core.config import NarwhalConfig
from narwhal.core.policies import Policies, replica_seed
from narwhal.core.records import DecisionLog, RequestRecord
from narwhal.core.routing.kv_aware import BlockChain

MAX_REPLICAS = 64


class RouterReplicaSettings(BaseModel):
    """``[router]``: how many independent router replicas serve the fleet, and how requests
    are spread over them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    spread: Literal["random", "round_robin"] = "random"


class RouterReplicas:
    """The replicas of one run and the spreading of arrivals over them."""

    def __init__(
        self,
        settings: RouterReplicaSettings,
        config: NarwhalConfig,
        *,
        seed: int,
        log: DecisionLog,
        on_record: Callable[[RequestRecord], None],
        block_chain: BlockChain | None = None,
    ) -> None:
        self.settings = settings
        self.logs = [log] + [DecisionLog(enabled=log.enabled) for _ in range(1, settings.replicas)]
        self.members = [
            Policies(
                config,
                seed=replica_seed(seed, k),
                log=self.logs[k],
                on_record=on_record,
                block_chain=block_chain,
            )
            for k in range(settings.replicas)
        ]
        self._spread_rng = random.Random(f"{seed}/spread")
        self.replica_of: dict[str, int] = {}  # request id -> the replica that served it

    def route(self, request_id: str, index: int) -> Policies:
        """The replica the ``index``-th arrival (``request_id``) lands on."""
        count = len(self.members)
        if count == 1:
            return self.members[0]
        if self.settings.spread == "round_robin":
            k = index % count
        else:
            k = self._spread_rng.randrange(count)
        self.replica_of[request_id] = k
        return self.members[k]

    def decisions(self) -> list[dict[str, Any]]:
        """Every replica's decision log as dicts, in time order; with more than one replica
        each carries ``replica`` (its index), ties in replica order."""
        if len(self.logs) == 1:
            return [d.as_dict() for d in self.logs[0].entries]
        merged = [
            {**d.as_dict(), "replica": k} for k, log in enumerate(self.logs) for d in log.entries
        ]
        merged.sort(key=lambda d: d["t"])  # stable: replica order within one instant
        return merged

    def times_ejected(self, url: str) -> int:
        """Ejections of ``url`` summed over replicas (each replica ejects it on its own)."""
        return sum(p.breaker.health(url).times_ejected for p in self.members)

    def reserved(self, url: str, phase: str) -> int:
        """Reservations of ``phase`` on ``url`` over every replica (what the engine holds)."""
        return sum(p.placement.counts[url][phase] for p in self.members)

    def ejected_by(self, url: str, now: float) -> int:
        """How many replicas hold ``url`` out of service now (ejected or probing)."""
        return sum(
            1 for p in self.members if p.breaker.state(url, now).value in ("ejected", "probing")
        )


class ReplicaCounts:
    """Per replica: requests served, succeeded and attempts that failed, counted as records
    come in."""

    def __init__(self, members: int) -> None:
        self.members = members
        self.requests = [0] * members
        self.succeeded = [0] * members
        self.failed_attempts = [0] * members

    def add(self, replica: int, record: RequestRecord) -> None:
        ok = record.status == 200
        self.requests[replica] += 1
        self.succeeded[replica] += ok
        self.failed_attempts[replica] += record.attempts - (1 if ok else 0)

    def summary(self, ejections: list[int]) -> dict[str, Any]:
        return {
            "count": self.members,
            "requests": self.requests,
            "succeeded": self.succeeded,
            "failed_attempts": self.failed_attempts,
            "ejections": ejections,
        }


def replica_summary(
    replica_of: dict[str, int], records: list[RequestRecord], members: int, ejections: list[int]
) -> dict[str, Any]:
    """Per replica: requests served, succeeded, attempts that failed, and ejections."""
    counts = ReplicaCounts(members)
    for record in records:
        counts.add(replica_of.get(record.request_id, 0), record)
    return counts.summary(ejections)
