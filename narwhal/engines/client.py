"""EngineClient: one engine's prefill and decode legs, for Python callers.

Rule kept here: this is a convenience face over the core's legs (:mod:`narwhal.core.legs`) — it
makes no decision the router does not make the same way (descriptor validation, fault mapping,
timeouts all come from ``narwhal.core``). ``prefill()``'s result passes straight to
``decode()``; ``decode()`` refuses a result whose endpoint or connector does not match before any
I/O happens.

Usage::

    async with (
        EngineClient.http("http://127.0.0.1:8100") as producer,
        EngineClient.http("http://127.0.0.1:8200") as consumer,
    ):
        result = await producer.prefill({"prompt": "Hello", "max_tokens": 8})
        async for event in consumer.decode(result, {"prompt": "Hello", "max_tokens": 8}):
            ...

A client made by :meth:`EngineClient.http` owns its connection pool: leaving ``async with`` (or
:meth:`aclose`) closes it. A client given a transport leaves that transport to its owner.

Faults raise :class:`EngineError` carrying the core's :class:`~narwhal.core.errors.Fault`
(with the status the router would have answered).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

from narwhal.core.config import EngineSettings
from narwhal.core.errors import Fault
from narwhal.core.legs import DecodeLeg, prefill_leg, stale_handoff
from narwhal.core.ports import Clock, Transport
from narwhal.core.requests import COMPLETIONS, decode_body, parse_client_request
from narwhal.core.sse import SseEvent
from narwhal.engines.connector import PrefillResult
from narwhal.live.clock import AnyioClock
from narwhal.live.transport import EngineTransport


class EngineError(RuntimeError):
    """An engine leg failed; ``fault.status`` is what Narwhal would answer for it."""

    def __init__(self, failure: Fault) -> None:
        super().__init__(f"{failure.status}: {failure.message}")
        self.fault = failure


class EngineClient:
    """Prefill and decode legs against one engine."""

    def __init__(
        self,
        url: str,
        *,
        transport: Transport,
        clock: Clock,
        connector: str = "NixlConnector",
        kv_endpoint: str | None = None,
        settings: EngineSettings | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.connector = connector
        self.kv_endpoint = kv_endpoint
        self.settings = settings or EngineSettings()
        self._transport = transport
        self._clock = clock
        self._owned: EngineTransport | None = None  # the pool http() opened for this client

    @classmethod
    def http(cls, url: str, **options: Any) -> EngineClient:
        """A client over real HTTP (its own keep-alive pool, the live clock)."""
        clock = AnyioClock()
        transport = EngineTransport(clock)
        client = cls(url, transport=transport, clock=clock, **options)
        client._owned = transport
        return client

    async def aclose(self) -> None:
        """Close the connection pool this client opened (after its pending stream closes)."""
        if self._owned is not None:
            await self._owned.aclose()

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def prefill(
        self, body: dict[str, Any], endpoint: str = COMPLETIONS, request_id: str | None = None
    ) -> PrefillResult:
        """Run the one-token prefill leg here and return the validated handoff."""
        backend_id = request_id or f"narwhal-{uuid.uuid4().hex}"
        now = self._clock.now()
        request = parse_client_request(endpoint, body, request_id=backend_id, arrival=now)
        prefilled = await prefill_leg(
            self._transport,
            self._clock,
            self.url,
            request,
            backend_request_id=backend_id,
            connector=self.connector,
            pinned_side_channel=self.kv_endpoint,
            deadline=now + self.settings.request_timeout_s,
            max_handoff_age_s=self.settings.max_handoff_age_s,
        )
        if prefilled.fault is not None:
            raise EngineError(prefilled.fault)
        assert prefilled.descriptor is not None
        return PrefillResult.create(
            producer_url=self.url,
            endpoint=endpoint,
            backend_request_id=backend_id,
            connector=self.connector,
            started_at=prefilled.started_at,
            descriptor=prefilled.descriptor,
        )

    def decode(
        self,
        result: PrefillResult,
        body: dict[str, Any],
        endpoint: str = COMPLETIONS,
        request_id: str | None = None,
    ) -> AsyncIterator[SseEvent]:
        """Stream the decode of ``result`` here; raises HandoffMismatch before any I/O."""
        result.check_decodable(endpoint, self.connector)
        request = parse_client_request(
            endpoint, body, request_id=request_id or "", arrival=self._clock.now()
        )
        same_worker = result.producer_url == self.url
        upstream = decode_body(request, None if same_worker else result.parameters())
        return self._stream(result, endpoint, upstream, request_id or f"narwhal-{uuid.uuid4().hex}")

    async def _stream(
        self, result: PrefillResult, endpoint: str, body: dict[str, Any], decode_id: str
    ) -> AsyncIterator[SseEvent]:
        settings, now = self.settings, self._clock.now()
        too_old = stale_handoff(result.started_at, now, settings.max_handoff_age_s)
        if too_old is not None:
            raise EngineError(too_old)
        leg = DecodeLeg(
            self._transport,
            self._clock,
            self.url,
            first_token_timeout_s=settings.first_token_timeout_s,
            decode_read_timeout_s=settings.decode_read_timeout_s,
            request_deadline=now + settings.request_timeout_s,
        )
        try:
            failure = await leg.open(endpoint, body, {"X-Request-Id": decode_id})
            while failure is None and not leg.done:
                for event in (await leg.next_read()).events:
                    yield event
                failure = leg.fault
            if failure is not None:
                raise EngineError(failure)
        finally:
            leg.close()
