"""The handler of the OpenAI inference routes: a client request's way into the core lifecycle.

Rule kept here: like the rest of :mod:`narwhal.live.app` this is a thin driver; the only
statuses it chooses are for requests the core never sees (401 bad key, 415 a body not sent as
JSON, 413 a body too large or holding too many JSON values, 400 malformed JSON or a request the
core's parser refuses), and every other answer is the core's.

Theory of operation: an :class:`Inference` serves one route (completions or chat) for its
router. A request enters through the core's one entry,
:func:`narwhal.core.entry.admit_and_serve`, once its whole body has arrived within
``admission.max_body_bytes`` and ``client.body_timeout_s`` (a client that sends a head and
never its body holds a connection, which ``client.max_connections`` bounds, never an inference
slot): it takes an admission slot (refused: the core's 503 with Retry-After), held until it
ends, then parses the body once within ``admission.max_json_values`` and runs the core's
lifecycle in a scope that the connection's end cancels
(:class:`narwhal.live.sink.CancelledOnDisconnect`): a client disconnect cancels the lifecycle,
whose ``finally`` releases every reservation and abandoned handoff. When the server's shutdown
grace period cancels it instead, the client gets the core's shutdown answer
(:mod:`narwhal.core.shutdown`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Mapping
from typing import Protocol

import anyio

from narwhal.core import wire
from narwhal.core.config import NarwhalConfig
from narwhal.core.entry import admit_and_serve
from narwhal.core.flow import FlowHeaderError, classify
from narwhal.core.lifecycle import serve_request
from narwhal.core.policies import Policies
from narwhal.core.ports import Ports
from narwhal.core.prompt_identity import prompt_fields
from narwhal.core.records import RequestRecord
from narwhal.core.requests import BadRequest, ClientRequest, parse_client_request
from narwhal.core.routing.prompt_tokens import PromptTokens
from narwhal.core.shutdown import answer_shutdown
from narwhal.core.stalls import StallLedger
from narwhal.live.bodies import BodyRefused, parse_body, read_bounded_body, too_large
from narwhal.live.clock import AnyioClock, EventWaiter
from narwhal.live.gate import json_refusal
from narwhal.live.h1request import EdgeRequest, Response
from narwhal.live.reporting import RequestReporter, ServedRequest
from narwhal.live.sink import CancelledOnDisconnect, ResponseSink

log = logging.getLogger("narwhal.live")


class InferenceRouter(Protocol):
    """What a handler reads of its router (:class:`narwhal.live.app.Router`)."""

    clock: AnyioClock
    stalls: StallLedger
    policies: Policies
    reporter: RequestReporter
    prompt_tokens: PromptTokens

    @property
    def config(self) -> NarwhalConfig: ...

    @property
    def ports(self) -> Ports: ...

    def request_id_for(self, headers: Mapping[str, str]) -> str: ...

    def authorized(self, headers: Mapping[str, str]) -> bool: ...

    def unauthorized(self) -> Response: ...


SHUTDOWN_WRITE_S = 1.0  # the most a request cut short by shutdown waits to tell its client


async def _answer_shutdown(sink: ResponseSink) -> None:
    """Give a request cut short by shutdown the core's answer, if its client can still get
    it."""
    if sink.gone or sink.finished or sink.cut:
        return
    log.warning("request cut short by the shutdown grace period")
    with contextlib.suppress(Exception):  # nothing more can be done for this client
        await answer_shutdown(sink, sink.started, math.inf)


class Inference:
    """The handler of one OpenAI route: body limits, parsing, then the core lifecycle."""

    def __init__(self, router: InferenceRouter, endpoint: str) -> None:
        self.router = router
        self.endpoint = endpoint

    async def __call__(self, request: EdgeRequest) -> Response | None:
        router = self.router
        arrival = router.clock.now()
        headers = request.headers
        request_id = router.request_id_for(headers)
        if not router.authorized(headers):
            return router.unauthorized()
        sink = ResponseSink(
            request, {"x-request-id": request_id}, clock=router.clock, stalls=router.stalls
        )
        not_json = json_refusal(headers)  # a web page's "simple" cross-origin POST (gate.py)
        if not_json is not None:
            await sink.respond(415, not_json, {})
            sink.done()
            return None

        raw = await self._read_body(request, sink)  # whole before a slot is taken
        if raw is None:
            sink.done()
            return None

        async def serve() -> RequestRecord | None:  # admitted: the body is whole
            served = router.reporter.begin(request_id, self.endpoint, headers, sink)
            try:
                parsed = await self._parse_request(raw, sink, request_id, arrival)
                if parsed is not None:
                    await self._serve(parsed, request, sink, served)
            finally:
                router.reporter.end(served)
            return None

        flow_key = None
        flow_settings = router.config.flow
        if flow_settings.enabled:  # queue by band and flow (narwhal.core.flow)
            try:
                flow_key = classify(headers, flow_settings)
            except FlowHeaderError as bad:
                error = wire.error_object(400, str(bad), "invalid_request_error")
                await sink.respond(400, error, {})
                sink.done()
                return None
        ports = router.ports
        if flow_key is not None:  # a queued request's wait ends when its client leaves
            closed = request.closed
            ports = dataclasses.replace(ports, waiter=lambda: EventWaiter(closed))
        await admit_and_serve(request_id, arrival, ports, router.policies, sink, serve, flow_key)
        sink.done()
        return None

    async def _parse_request(
        self, raw: bytes, sink: ResponseSink, request_id: str, arrival: float
    ) -> ClientRequest | None:
        """The client's request, or None once it has been answered (413, 400).

        The body is parsed once and handed to the core as it is (no copy); the parsed top
        level is dropped when this returns."""
        admission = self.router.config.admission
        try:
            body = parse_body(raw, admission.max_json_values)
        except BodyRefused as refused:
            await sink.respond(refused.status, refused.error, {})
            return None
        try:
            return parse_client_request(
                self.endpoint, body, request_id=request_id, arrival=arrival, detach=False
            )
        except BadRequest as error:
            await sink.respond(400, wire.error_object(400, str(error), "invalid_request_error"), {})
            return None

    async def _serve(
        self,
        parsed: ClientRequest,
        request: EdgeRequest,
        sink: ResponseSink,
        served: ServedRequest,
    ) -> None:
        router = self.router
        served.set_model(router.reporter.models, parsed.body.get("model"))
        if router.reporter.request_log is not None:
            served.prompt = prompt_fields(parsed)

        try:
            async with CancelledOnDisconnect(request.closed, sink):
                # token ids for kv_aware from an engine, when opted in (never charged)
                await router.prompt_tokens.fetch(parsed, router.ports, router.policies)
                await serve_request(parsed, router.ports, router.policies, sink)
                await sink.finish()
        except anyio.get_cancelled_exc_class():
            # The server cancels what is still running when its shutdown grace period ends:
            # the client gets a clear end (a 503, or one terminal SSE event after the 200)
            # instead of a cut connection. The core has already released everything; its
            # record of a cancelled request is reported as what this answer is.
            answering, committed = not (sink.gone or sink.finished or sink.cut), sink.started
            with anyio.move_on_after(SHUTDOWN_WRITE_S, shield=True):  # a client not reading
                await _answer_shutdown(sink)
            if answering:
                router.reporter.shut_down(served, committed)

    async def _read_body(self, request: EdgeRequest, sink: ResponseSink) -> bytes | None:
        """The whole body within ``admission.max_body_bytes``, or None once answered or gone.
        (The first read answers ``expect: 100-continue``: a body declared too large is refused
        before the client sends it.)"""
        limit = self.router.config.admission.max_body_bytes
        try:
            raw = await read_bounded_body(request, limit)
        except OSError:  # the connection was lost (or cut by client.body_timeout_s)
            sink.gone = True
            return None
        if raw is None:
            await sink.respond(413, too_large(limit), {})
        return raw
