"""The live router: request handlers (on the edge server, :mod:`narwhal.live.h1server`) around
the core lifecycle.

Rule kept here: this module is a thin driver. It parses HTTP into the core's values, hands each
request to :func:`narwhal.core.lifecycle.serve_request` and the fleet to
:func:`narwhal.core.probe.maintenance_loop`, both unchanged, and reports what the core recorded.
It makes no routing, timeout, breaker, retry or admission decision of its own; the only statuses
it or its inference handler (:mod:`narwhal.live.inference`) chooses are for requests the core
never sees (401 bad key, 415 a body not sent as JSON and 421 a Host not allowed
(:mod:`narwhal.live.gate`), 413 body too large or holding too many JSON values, 400 malformed
JSON or a request the core's parser refuses).

Theory of operation: :meth:`Router.running` (entered by the server, :mod:`narwhal.live.serving`,
around everything it serves, and left after its shutdown) opens the engine transport and a task
group; the task group is the core's ``spawn`` port (probes, health checks, load scrapes) and
runs the maintenance loop and the load scrape loop (:mod:`narwhal.core.loadscrape`, idle unless
a phase is placed by ``least_loaded``), and, for a router given its configuration file, the
reload loop (:mod:`narwhal.live.reload`). The inference routes are served by
:class:`narwhal.live.inference.Inference` (admission, the body, the core's lifecycle);
``/tokenize`` and ``/detokenize`` by :class:`narwhal.live.passthrough.PassThroughHandler` (one
ready engine answers, :mod:`narwhal.core.passthrough`). Requests
are routed by a dict of path and method (:meth:`Router.handle`); an unknown path is a 404 and a
wrong method a 405, both OpenAI error objects, and no path is ever redirected (a redirect built
from the request would echo its Host header). Every finished request yields one
:class:`~narwhal.core.records.RequestRecord` (through ``Policies(on_record=...)``), which feeds
the metrics and one structured JSON log line.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import re
import secrets
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from narwhal.core import wire
from narwhal.core.config import NarwhalConfig
from narwhal.core.jsonparse import parse_json
from narwhal.core.loadscrape import load_scrape_loop
from narwhal.core.passthrough import DETOKENIZE, TOKENIZE, PassThrough
from narwhal.core.policies import Policies
from narwhal.core.ports import Ports, Reply
from narwhal.core.probe import maintenance_loop
from narwhal.core.records import Decision, DecisionLog
from narwhal.core.requests import (
    CHAT,
    COMPLETIONS,
)
from narwhal.core.routing.kv_aware import kv_aware_phases
from narwhal.core.routing.prompt_tokens import PromptTokens
from narwhal.core.stalls import StallLedger
from narwhal.live.clock import AnyioClock, EventWaiter
from narwhal.live.edge_counts import ClientConnections
from narwhal.live.engine_log import EngineEventLog
from narwhal.live.gate import HostGate
from narwhal.live.h1request import EdgeRequest, Response
from narwhal.live.h1server import Handler
from narwhal.live.inference import Inference
from narwhal.live.kv_events import KvEventSubscriber, live_block_chain
from narwhal.live.lag import LagMonitor
from narwhal.live.metrics import RouterMetrics, status_document
from narwhal.live.passthrough import PassThroughHandler
from narwhal.live.reload import DEFAULT_POLL_S, ConfigReloader
from narwhal.live.reporting import ModelLabels, RequestLog, RequestReporter
from narwhal.live.tracing import start_tracing
from narwhal.live.transport import EngineTransport

FLEET_QUERY_TIMEOUT_S = 2.0
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
# A client's X-Request-Id is kept when it is a short token of these characters (what request
# ids in the wild use: UUIDs, hex, `req_...`, dotted trace ids); anything else gets a fresh id.
CLIENT_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@+=/-]{1,128}")
DECISIONS_KEPT = 10_000  # the decision log a router holds in memory (it runs for weeks)

log = logging.getLogger("narwhal.live")


def _warn_line(line: bytes) -> None:
    """A JSON log line, as a warning on ``narwhal.live`` (a router given no JSON log)."""
    log.warning("%s", line.decode().rstrip("\n"))


def json_response(
    body: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """A JSON response (what every endpoint but ``/metrics`` and the streams answers)."""
    return Response(
        status, wire.to_json(body), {**(headers or {}), "content-type": "application/json"}
    )


class Router:
    """One live router: its policies, metrics and request handlers (``router.handle``)."""

    def __init__(
        self,
        config: NarwhalConfig,
        *,
        seed: int = 0,
        api_key: str | None = None,
        tick_s: float | None = None,
        announce: Callable[[str], None] | None = None,
        config_path: str | Path | None = None,
        reload_poll_s: float = DEFAULT_POLL_S,
        reload_on_sighup: bool = False,
        tracer_provider: Any = None,
        request_log: RequestLog | None = None,
    ) -> None:
        self.clock = AnyioClock()
        self.stalls = StallLedger()  # the event loop's stalls: they extend every deadline
        self.metrics = RouterMetrics()
        # its client connections, counted by the edge server that serves it (/status, /metrics)
        self.connections = ClientConnections(config.client.max_connections)
        # tracing off: None, and nothing below is wrapped (tracer_provider: tests, embedders)
        self.tracing = start_tracing(config.tracing, tracer_provider)
        pinned = config.engine_contract.model if config.engine_contract else None
        self.reporter = RequestReporter(
            self.metrics, self.clock, ModelLabels(pinned), self.tracing, request_log
        )
        # engine health in the JSON log (without one, an embedder's: the warnings on stderr)
        self.engine_log = EngineEventLog(
            request_log or _warn_line, self.clock, replay_lines=request_log is not None
        )
        metrics_hook = self.metrics.on_decision
        engine_log = self.engine_log

        def observed(decision: Decision) -> None:
            metrics_hook(decision)
            engine_log(decision)

        on_decision = observed if self.tracing is None else self.tracing.observing(observed)
        decisions = DecisionLog(on_decision=on_decision, keep=DECISIONS_KEPT)
        self.policies = Policies(
            config,
            seed=seed,
            log=decisions,
            on_record=self.reporter.on_record,
            block_chain=live_block_chain(config),
        )
        # the engines' KV cache events, for kv_aware (None: no phase uses it)
        self.kv_events = (
            KvEventSubscriber(
                lambda: self.policies.config.engines, lambda: self.policies.placement.kv_index
            )
            if kv_aware_phases(config.routing)
            else None
        )
        # config_path: reloaded on SIGHUP (when told) and when it changes (narwhal.live.reload)
        self.reloader = (
            None
            if config_path is None
            else ConfigReloader(
                config_path,
                self.policies,
                self.clock,
                poll_s=reload_poll_s,
                sighup=reload_on_sighup,
                say=announce,
                on_config=self._reloaded,
            )
        )
        self.metrics.attach(self.policies, self.clock)
        self.engine_log.attach(self.policies)
        self.metrics.attach_stalls(self.stalls)
        self.metrics.attach_connections(self.connections)
        if self.kv_events is not None:
            self.metrics.registry.register(self.kv_events)
        self._api_key = api_key or None
        self._tick_s = tick_s
        self._announce = announce
        self._stopping = False
        self._ports: Ports | None = None
        self.passthrough = PassThrough()
        # text and chat prompts' token ids for kv_aware ([routing.kv_aware] tokenize)
        self.prompt_tokens = PromptTokens(self.passthrough)
        inference = Inference(self, COMPLETIONS), Inference(self, CHAT)
        # path -> method -> handler (HEAD is answered by GET's handler, without a body)
        self.routes: dict[str, dict[str, Handler]] = {
            COMPLETIONS: {"POST": inference[0]},
            CHAT: {"POST": inference[1]},
            "/v1/models": {"GET": self._models},
            "/health": {"GET": self._health},
            "/livez": {"GET": self._livez},
            "/metrics": {"GET": self._metrics},
            "/status": {"GET": self._status},
            # vLLM's tokenizer routes, answered by a ready engine (narwhal.core.passthrough)
            TOKENIZE: {"POST": PassThroughHandler(self, TOKENIZE)},
            DETOKENIZE: {"POST": PassThroughHandler(self, DETOKENIZE)},
        }
        self.hosts = HostGate(config.client.allowed_hosts)

    def _reloaded(self, config: NarwhalConfig) -> None:
        """After a reload: the fleet now, for a replay; the KV event streams follow it."""
        self.engine_log.router_started(config)
        if self.kv_events is not None:
            self.kv_events.engines_changed()

    @property
    def config(self) -> NarwhalConfig:
        """The configuration in force (a reload replaces it whole)."""
        return self.policies.config

    # ------------------------------------------------------------------ lifespan and ports

    @property
    def ports(self) -> Ports:
        if self._ports is None:
            raise RuntimeError("the router is not started (Router.running not entered)")
        return self._ports

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The router's resources and background loops, for as long as it serves: the engine
        transport, and one task group holding the lag monitor, the maintenance and load scrape
        loops, the reload loop and every job spawned through the ports."""
        transport_cm = EngineTransport(self.clock, stalls=self.stalls)
        async with transport_cm as transport, anyio.create_task_group() as group:
            group.start_soon(LagMonitor(self.clock, self.stalls).run)

            def spawn(job: Callable[[], Coroutine[Any, Any, None]]) -> None:
                async def guarded() -> None:
                    try:
                        await job()
                    except Exception:
                        log.exception("background task failed")

                group.start_soon(guarded)

            traced = transport if self.tracing is None else self.tracing.wrap(transport)
            self._ports = Ports(self.clock, traced, spawn, EventWaiter)
            self.engine_log.router_started(self.config)
            if self._announce is not None:
                for line in await self.describe_fleet():
                    self._announce(line)
            group.start_soon(
                partial(
                    maintenance_loop,
                    self._ports,
                    self.policies,
                    stop=lambda: self._stopping,
                    tick_s=self._tick_s,
                )
            )
            # engine load for least_loaded (returns at once when no phase uses it)
            group.start_soon(
                partial(load_scrape_loop, self._ports, self.policies, stop=lambda: self._stopping)
            )
            if self.kv_events is not None:
                group.start_soon(self.kv_events.run)
            if self.reloader is not None:
                group.start_soon(partial(self.reloader.run, stop=lambda: self._stopping))
            try:
                yield
            finally:
                self._stopping = True
                group.cancel_scope.cancel()

    async def _ask_engines(self, path: str) -> dict[str, Any]:
        """GET ``path`` on every engine concurrently: url -> parsed JSON (or None)."""
        answers: dict[str, Any] = {}

        async def ask(url: str) -> None:
            reply = await self.ports.transport.call(
                url, "GET", path, None, {}, self.clock.now() + FLEET_QUERY_TIMEOUT_S
            )
            answers[url] = None
            if isinstance(reply, Reply) and reply.status == 200:
                with contextlib.suppress(ValueError):
                    answers[url] = parse_json(reply.body)

        async with anyio.create_task_group() as group:
            for entry in self.config.engines:
                group.start_soon(ask, entry.url)
        return answers

    async def describe_fleet(self) -> list[str]:
        """One line per engine: role, vLLM version and models it serves (or unreachable)."""
        versions = await self._ask_engines("/version")
        models = await self._ask_engines("/v1/models")
        lines = []
        for entry in self.config.engines:
            version = versions.get(entry.url)
            listed = models.get(entry.url)
            if version is None and listed is None:
                lines.append(f"  {entry.url:<28} {entry.role.value:<8} unreachable")
                continue
            data = listed.get("data") if isinstance(listed, dict) else None
            names = [
                m.get("id") for m in (data if isinstance(data, list) else ()) if isinstance(m, dict)
            ]
            self.reporter.models.learn(names)
            found = version.get("version") if isinstance(version, dict) else None
            lines.append(
                f"  {entry.url:<28} {entry.role.value:<8} vllm {found or '?'}  "
                f"models {', '.join(str(n) for n in names) or '?'}"
            )
        return lines

    # ------------------------------------------------------------------ request ids

    @staticmethod
    def request_id_for(headers: Mapping[str, str]) -> str:
        """The client's ``X-Request-Id`` when it is a sane token, else a fresh random id: unique
        across restarts and replicas (a counter would repeat), so client, router and engine
        logs join on it. The engine legs' ids are derived from it (``<id>-p1-...``)."""
        given = headers.get("x-request-id")
        if given is not None and CLIENT_REQUEST_ID.fullmatch(given):
            return given
        return f"req-{secrets.token_hex(16)}"

    # ------------------------------------------------------------------ plain endpoints

    def authorized(self, headers: Mapping[str, str]) -> bool:
        if self._api_key is None:
            return True
        given = headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            token.strip().encode(), self._api_key.encode()
        )

    @staticmethod
    def unauthorized() -> Response:
        return json_response(
            wire.error_object(
                401,
                "Incorrect API key provided.",
                "invalid_request_error",
                code="invalid_api_key",
            ),
            401,
        )

    async def _models(self, request: EdgeRequest) -> Response | None:
        if not self.authorized(request.headers):
            return self.unauthorized()
        merged: dict[str, dict[str, Any]] = {}
        for answer in (await self._ask_engines("/v1/models")).values():
            data = answer.get("data") if isinstance(answer, dict) else None
            for model in data if isinstance(data, list) else []:
                if isinstance(model, dict) and isinstance(model.get("id"), str):
                    merged.setdefault(model["id"], model)
        self.reporter.models.learn(merged)
        if not merged:
            return json_response(
                wire.error_object(503, "no engine answered /v1/models", "no_engine_available"), 503
            )
        return json_response({"object": "list", "data": list(merged.values())})

    async def _livez(self, request: EdgeRequest) -> Response | None:
        """Liveness: the process serves. Apart from readiness (``/health``) so that an outage
        of the engines, which ``/health`` reports, never gets the router restarted and its
        breaker state thrown away."""
        return json_response({"status": "alive"})

    async def _health(self, request: EdgeRequest) -> Response | None:
        now = self.clock.now()
        placement = self.policies.placement
        ready = {phase: len(placement.candidates(phase, now)) for phase in ("prefill", "decode")}
        # a role whose engines are only quarantined still serves (placement falls back)
        ok = all(placement.any_eligible(phase, now) for phase in ("prefill", "decode"))
        return json_response(
            {"status": "ok" if ok else "degraded", "eligible": ready}, 200 if ok else 503
        )

    async def _metrics(self, request: EdgeRequest) -> Response | None:
        return Response(200, self.metrics.render(), {"content-type": PROMETHEUS_TEXT})

    async def _status(self, request: EdgeRequest) -> Response | None:
        streams = None if self.kv_events is None else self.kv_events.status
        document = status_document(self.policies, self.clock, streams, self.connections)
        if self.config.routing.kv_aware.tokenize:  # text and chat prompts tokenized, by outcome
            document["tokenize"] = dict(self.prompt_tokens.counts)
        return json_response(document)

    # ------------------------------------------------------------------ routing

    async def handle(self, request: EdgeRequest) -> Response | None:
        """Every request the server accepts: the Host gate, then its route's handler."""
        if self.hosts.allowed:  # client.allowed_hosts
            refusal = self.hosts.refusal(request.path, request.headers)
            if refusal is not None:
                return json_response(refusal, 421)
        methods = self.routes.get(request.path)
        if methods is None:
            return _route_error(request, 404, "Not Found", "not_found_error")
        method = "GET" if request.method == "HEAD" else request.method
        handler = methods.get(method)
        if handler is None:
            allow = {"allow": ", ".join(sorted(methods))}
            return _route_error(request, 405, "Method Not Allowed", "invalid_request_error", allow)
        return await handler(request)


def _route_error(
    request: EdgeRequest, status: int, what: str, kind: str, headers: dict[str, str] | None = None
) -> Response:
    """An unknown path (404) or a wrong method (405), in OpenAI's error shape."""
    body = wire.error_object(status, f"{what}: {request.method} {request.path}", kind)
    return json_response(body, status, headers)
