"""``narwhal preflight``: check every engine and every producer -> consumer pair before serving.

Rule kept here: preflight judges engines with the core's own legs only: the pinned contract
through :func:`narwhal.core.probe.contract_problems`, a prefill through
:func:`narwhal.core.legs.prefill_leg` (the core's descriptor validation, with the pinned side
channel) and a decode through :class:`narwhal.core.legs.DecodeLeg` (a generated token, then
``[DONE]``), timed by ``[engine]`` as the router times them. It passes only if every check
passes, and each failure names its reason.

Theory of operation: for each engine, (1) the contract (``/version``, ``/v1/models``), (2) its
role: a producer must answer a prefill with a valid KV descriptor (released afterwards), a
consumer must stream a plain decode, a ``both`` engine must also decode its own handoff
(same-worker). Then (3) every role-permitted pair of distinct engines runs a real handoff: a
prefill on the producer, a decode carrying that descriptor on the consumer, which must pull the
KV. (4) Every engine a ``kv_aware`` phase places on must publish KV cache events the router can
read, naming its blocks as the router does (:mod:`narwhal.live.kv_events_check`). The result
is a list of :class:`Check` rows, printed as a table.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import anyio

from narwhal.core.config import EngineEntry, NarwhalConfig
from narwhal.core.errors import Fault
from narwhal.core.legs import DecodeLeg, PrefillOutcome, prefill_leg, stale_handoff
from narwhal.core.policies import Policies
from narwhal.core.ports import ConnectFailed, Ports, TimedOut
from narwhal.core.probe import contract_problems, probe_client_request, probe_request
from narwhal.core.requests import COMPLETIONS, ClientRequest, decode_body
from narwhal.core.routing.kv_aware import kv_aware_phases
from narwhal.live.clock import AnyioClock
from narwhal.live.kv_events import live_block_chain
from narwhal.live.kv_events_check import check_kv_events
from narwhal.live.transport import EngineTransport


@dataclass(frozen=True)
class Check:
    """One row of the preflight table."""

    check: str  # contract | role | pair | kv_events
    target: str
    passed: bool
    detail: str


class _Preflight:
    def __init__(self, config: NarwhalConfig, ports: Ports, seed: int) -> None:
        self.config = config
        self.ports = ports
        self.policies = Policies(config, seed=seed, block_chain=live_block_chain(config))

    def request(self, max_tokens: int) -> ClientRequest:
        """A probe request with a fresh backend id (unseeded: a real producer may still hold
        the blocks of an earlier run's handoff under the same transfer id)."""
        request_id = f"narwhal-{uuid.uuid4().hex}"
        return probe_client_request(self.policies, max_tokens, request_id, self.ports.clock.now())

    async def prefill(self, producer: str, request: ClientRequest) -> PrefillOutcome:
        """The prefill leg of ``request`` on ``producer``, as the router runs it."""
        settings = self.config.engine
        return await prefill_leg(
            self.ports.transport,
            self.ports.clock,
            producer,
            request,
            backend_request_id=request.request_id,
            connector=self.config.kv_connector,
            pinned_side_channel=self.config.engine_by_url(producer).kv_endpoint,
            deadline=request.arrival + settings.request_timeout_s,
            max_handoff_age_s=settings.max_handoff_age_s,
        )

    async def decode(
        self, consumer: str, body: dict[str, Any], headers: dict[str, str]
    ) -> Fault | None:
        """A streamed decode on ``consumer``: None after a generated token and [DONE], else
        the fault."""
        settings, clock = self.config.engine, self.ports.clock
        leg = DecodeLeg(
            self.ports.transport,
            clock,
            consumer,
            first_token_timeout_s=settings.first_token_timeout_s,
            decode_read_timeout_s=settings.decode_read_timeout_s,
            request_deadline=clock.now() + settings.request_timeout_s,
        )
        try:
            return await leg.open(COMPLETIONS, body, headers) or await leg.read_to_end()
        finally:
            leg.close()

    async def contract(self, url: str) -> Check:
        if self.config.engine_contract is None:
            reply = await self.ports.transport.call(
                url, "GET", "/version", None, {}, self.ports.clock.now() + 5.0
            )
            if isinstance(reply, ConnectFailed | TimedOut):
                return Check("contract", url, False, "unreachable (GET /version)")
            return Check("contract", url, True, "no [engine_contract] pinned: not checked")
        problems = await contract_problems(url, self.ports, self.policies)
        contract = self.config.engine_contract
        ok = f"vllm {contract.vllm_version}, model {contract.model}"
        return Check("contract", url, not problems, "; ".join(problems) or ok)

    async def handoff(self, producer: str, consumer: str) -> str | None:
        """Prefill on ``producer``, decode on ``consumer``; None when it worked, else why."""
        request = self.request(2)
        prefilled = await self.prefill(producer, request)
        if prefilled.fault is not None:
            return f"prefill on {producer}: {prefilled.fault.message}"
        failure = stale_handoff(
            prefilled.started_at, self.ports.clock.now(), self.config.engine.max_handoff_age_s
        )
        if failure is None:
            crossed = producer != consumer
            body = decode_body(request, prefilled.descriptor if crossed else None)
            decode_id = f"narwhal-{uuid.uuid4().hex}"
            failure = await self.decode(consumer, body, {"X-Request-Id": decode_id})
        return None if failure is None else f"decode on {consumer}: {failure.message}"

    async def produces(self, url: str) -> str | None:
        prefilled = await self.prefill(url, self.request(1))
        if prefilled.fault is not None:
            return f"prefill: {prefilled.fault.message}"
        assert prefilled.descriptor is not None
        self.ports.transport.release_handoff(url, prefilled.descriptor)
        return None

    async def decodes(self, url: str) -> str | None:
        """A plain streamed decode (no handoff): a token, then [DONE]."""
        body = probe_request(self.policies, 2)
        body["stream"] = True
        failure = await self.decode(url, body, {})
        return None if failure is None else f"decode: {failure.message}"

    async def role(self, url: str) -> Check:
        role = self.config.engine_by_url(url).role
        problems: list[str] = []
        if role.produces:
            problems.append(await self.produces(url) or "")
        if role.consumes:
            problems.append(await self.decodes(url) or "")
        if role.produces and role.consumes:
            same = await self.handoff(url, url)
            problems.append(f"same-worker {same}" if same else "")
        found = [p for p in problems if p]
        what = {
            "prefill": "produces a valid KV descriptor",
            "decode": "decodes",
            "both": "produces, decodes and decodes its own handoff",
        }[role.value]
        return Check("role", f"{url} ({role.value})", not found, "; ".join(found) or what)

    async def kv_events(self, entry: EngineEntry, phases: list[str]) -> Check:
        body = probe_request(self.policies, 1)
        settings = self.config.routing.kv_aware
        passed, detail = await check_kv_events(entry, phases, settings, self.ports, body)
        return Check("kv_events", entry.url, passed, detail)

    async def run(self) -> list[Check]:
        urls = [entry.url for entry in self.config.engines]
        rows: list[Check] = []
        for url in urls:
            rows.append(await self.contract(url))
            rows.append(await self.role(url))
        placed_on_events = kv_aware_phases(self.config.routing)
        for entry in self.config.engines:
            phases = [
                phase
                for phase in placed_on_events
                if (entry.role.produces if phase == "prefill" else entry.role.consumes)
            ]
            if phases:
                rows.append(await self.kv_events(entry, phases))
        producers = [e.url for e in self.config.engines if e.role.produces]
        consumers = [e.url for e in self.config.engines if e.role.consumes]
        for producer in producers:
            for consumer in consumers:
                if producer == consumer:
                    continue
                failure = await self.handoff(producer, consumer)
                rows.append(
                    Check(
                        "pair",
                        f"{producer} -> {consumer}",
                        failure is None,
                        failure or "KV handoff decoded",
                    )
                )
        return rows


async def run_preflight(config: NarwhalConfig, *, seed: int = 0) -> list[Check]:
    """Every check of the fleet of ``config``, in order."""
    clock = AnyioClock()
    async with EngineTransport(clock) as transport, anyio.create_task_group() as group:

        def spawn(job: Callable[[], Coroutine[Any, Any, None]]) -> None:
            group.start_soon(job)

        rows = await _Preflight(config, Ports(clock, transport, spawn), seed).run()
    return rows


def format_table(rows: list[Check]) -> str:
    """A plain-text table, one row per check, and a summary line."""
    width = max([len(r.target) for r in rows] + [6])
    lines = [f"{'CHECK':<9} {'TARGET':<{width}}  RESULT  DETAIL"]
    for row in rows:
        result = "pass" if row.passed else "FAIL"
        lines.append(f"{row.check:<9} {row.target:<{width}}  {result:<6}  {row.detail}")
    failed = sum(not r.passed for r in rows)
    lines.append(
        f"{len(rows) - failed}/{len(rows)} checks passed"
        + ("" if not failed else f"; {failed} failed")
    )
    return "\n".join(lines)
