"""EngineClient: one engine's prefill and decode legs, for Python callers.

Rule kept here: this is a convenience face over the core's leg readers — it makes no decision
the router does not make the same way (descriptor validation, fault mapping, timeouts all come
from ``narwhal.core``). ``prefill()``'s result passes straight to ``decode()``; ``decode()``
refuses a result whose endpoint or connector does not match before any I/O happens.

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
from typing import TYPE_CHECKING, Any

from narwhal.core.config import EngineSettings
from narwhal.core.decode_events import stream_events
from narwhal.core.descriptor import prefill_kv_params
from narwhal.core.errors import Fault, FaultKind, fault
from narwhal.core.legs import LegFault, connect_fault, http_fault, read_prefill
from narwhal.core.ports import Clock, ConnectFailed, Reply, StreamOpened, TimedOut, Transport
from narwhal.core.requests import COMPLETIONS, decode_body, parse_client_request, prefill_body
from narwhal.core.retry import handoff_too_old
from narwhal.core.sse import SseEvent
from narwhal.engines.connector import PrefillResult

if TYPE_CHECKING:
    from narwhal.live.transport import HttpxTransport


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
        self._owned: HttpxTransport | None = None  # the pool http() opened for this client

    @classmethod
    def http(cls, url: str, **options: Any) -> EngineClient:
        """A client over real HTTP (its own httpx keep-alive pool, anyio clock)."""
        from narwhal.live.clock import AnyioClock
        from narwhal.live.transport import HttpxTransport

        clock = AnyioClock()
        transport = HttpxTransport(clock)
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
        started = self._clock.now()
        request = parse_client_request(endpoint, body, request_id=backend_id, arrival=started)
        kv = prefill_kv_params(self.connector, transfer_id=backend_id)
        deadline = started + min(self.settings.max_handoff_age_s, self.settings.request_timeout_s)
        reply = await self._transport.call(
            self.url,
            "POST",
            endpoint,
            prefill_body(request, kv),
            {"X-Request-Id": backend_id},
            deadline,
        )
        if isinstance(reply, TimedOut):
            raise EngineError(
                fault(
                    FaultKind.HANDOFF_TOO_OLD,
                    "prefill took too long",
                    engine=self.url,
                    phase="prefill",
                )
            )
        if isinstance(reply, ConnectFailed):
            raise EngineError(connect_fault(reply, self.url, "prefill"))
        assert isinstance(reply, Reply)
        descriptor = read_prefill(reply, self.url, self.connector, self.kv_endpoint)
        if isinstance(descriptor, Fault):
            raise EngineError(descriptor)
        return PrefillResult.create(
            producer_url=self.url,
            endpoint=endpoint,
            backend_request_id=backend_id,
            connector=self.connector,
            started_at=started,
            descriptor=descriptor,
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
        if handoff_too_old(result.started_at, now, settings.max_handoff_age_s):
            raise EngineError(
                fault(
                    FaultKind.HANDOFF_TOO_OLD,
                    f"handoff older than max_handoff_age_s ({settings.max_handoff_age_s:g} s)",
                    engine=None,
                    phase="decode",
                )
            )
        request_deadline = now + settings.request_timeout_s
        first_token_at = min(request_deadline, now + settings.first_token_timeout_s)
        opened = await self._transport.open_stream(
            self.url, endpoint, body, {"X-Request-Id": decode_id}, first_token_at
        )
        if isinstance(opened, TimedOut):
            raise EngineError(
                fault(
                    FaultKind.FIRST_TOKEN_TIMEOUT,
                    "no response headers within first_token_timeout_s",
                    engine=self.url,
                    phase="decode",
                )
            )
        if isinstance(opened, ConnectFailed):
            raise EngineError(connect_fault(opened, self.url, "decode"))
        assert isinstance(opened, StreamOpened)
        try:
            if opened.status != 200:
                raise EngineError(http_fault(opened.status, opened.body, self.url, "decode"))
            events = stream_events(
                self._transport,
                self._clock,
                opened.handle,
                self.url,
                first_token_at=first_token_at,
                first_token_timeout_s=settings.first_token_timeout_s,
                decode_read_timeout_s=settings.decode_read_timeout_s,
                request_deadline=request_deadline,
            )
            async for _, event in events:
                yield event
        except LegFault as leg:
            raise EngineError(leg.fault) from None
        finally:
            self._transport.close_stream(opened.handle)
