"""``narwhal preflight``: check every engine and every producer -> consumer pair before serving.

Rule kept here: preflight judges engines with the core's own readers only: the pinned contract
through :func:`narwhal.core.probe.contract_problems`, a prefill through
:class:`narwhal.engines.client.EngineClient` (the core's descriptor validation, with the pinned
side channel) and a decode through the core's stream reader (a generated token, then
``[DONE]``). It passes only if every check passes, and each failure names its reason.

Theory of operation: for each engine, (1) the contract (``/version``, ``/v1/models``), (2) its
role: a producer must answer a prefill with a valid KV descriptor (released afterwards), a
consumer must stream a plain decode, a ``both`` engine must also decode its own handoff
(same-worker). Then (3) every role-permitted pair of distinct engines runs a real handoff: a
prefill on the producer, a decode carrying that descriptor on the consumer, which must pull the
KV. The result is a list of :class:`Check` rows, printed as a table.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import anyio

from narwhal.core.config import NarwhalConfig
from narwhal.core.decode_events import stream_events
from narwhal.core.errors import Fault, FaultKind, fault
from narwhal.core.legs import LegFault, connect_fault, http_fault
from narwhal.core.policies import Policies
from narwhal.core.ports import ConnectFailed, Ports, StreamOpened, TimedOut
from narwhal.core.probe import contract_problems, probe_request
from narwhal.core.requests import COMPLETIONS
from narwhal.core.sse import EventKind
from narwhal.engines.client import EngineClient, EngineError
from narwhal.live.clock import AnyioClock
from narwhal.live.transport import HttpxTransport


@dataclass(frozen=True)
class Check:
    """One row of the preflight table."""

    check: str  # contract | role | pair
    target: str
    passed: bool
    detail: str


class _Preflight:
    def __init__(self, config: NarwhalConfig, ports: Ports, seed: int) -> None:
        self.config = config
        self.ports = ports
        self.policies = Policies(config, seed=seed)

    def client(self, url: str) -> EngineClient:
        return EngineClient(
            url,
            transport=self.ports.transport,
            clock=self.ports.clock,
            connector=self.config.kv_connector,
            kv_endpoint=self.config.engine_by_url(url).kv_endpoint,
            settings=self.config.engine,
        )

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
        body = probe_request(self.policies, 2)
        try:
            result = await self.client(producer).prefill(body)
        except EngineError as error:
            return f"prefill on {producer}: {error.fault.message}"
        try:
            async for _ in self.client(consumer).decode(result, body):
                pass
        except EngineError as error:
            return f"decode on {consumer}: {error.fault.message}"
        return None

    async def produces(self, url: str) -> str | None:
        try:
            result = await self.client(url).prefill(probe_request(self.policies, 1))
        except EngineError as error:
            return f"prefill: {error.fault.message}"
        self.ports.transport.release_handoff(url, result.parameters())
        return None

    async def decodes(self, url: str) -> str | None:
        """A plain streamed decode (no handoff): a token, then [DONE]."""
        failure = await self._plain_decode(url)
        return None if failure is None else f"decode: {failure.message}"

    async def _plain_decode(self, url: str) -> Fault | None:
        body = probe_request(self.policies, 2)
        body["stream"] = True
        settings, clock = self.config.engine, self.ports.clock
        deadline = clock.now() + settings.first_token_timeout_s
        opened = await self.ports.transport.open_stream(url, COMPLETIONS, body, {}, deadline)
        if isinstance(opened, TimedOut):
            return fault(
                FaultKind.FIRST_TOKEN_TIMEOUT,
                "no response headers in time",
                engine=url,
                phase="decode",
            )
        if isinstance(opened, ConnectFailed):
            return connect_fault(opened, url, "decode")
        assert isinstance(opened, StreamOpened)
        try:
            if opened.status != 200:
                return http_fault(opened.status, opened.body, url, "decode")
            events = stream_events(
                self.ports.transport,
                clock,
                opened.handle,
                url,
                first_token_at=deadline,
                first_token_timeout_s=settings.first_token_timeout_s,
                decode_read_timeout_s=settings.decode_read_timeout_s,
                request_deadline=clock.now() + settings.request_timeout_s,
            )
            async for _, event in events:
                if event.kind is EventKind.DONE:
                    return None
            return None
        except LegFault as leg:
            return leg.fault
        finally:
            self.ports.transport.close_stream(opened.handle)

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

    async def run(self) -> list[Check]:
        urls = [entry.url for entry in self.config.engines]
        rows: list[Check] = []
        for url in urls:
            rows.append(await self.contract(url))
            rows.append(await self.role(url))
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
    async with HttpxTransport(clock) as transport, anyio.create_task_group() as group:

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
