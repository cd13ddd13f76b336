"""The engine emulator: a raw ASGI app that speaks vLLM's HTTP protocol, with scripted faults.

Rule kept here: one emulated engine is one :class:`EmulatorApp`, and this module only routes:
each path goes to the module of its concern, all of them sharing the engine's
:class:`~narwhal.emulator.state.EngineState`. A client disconnect cancels the request's work
(counted as ``aborted``), and ``freeze`` holds every path but ``/admin``.

Theory of operation (paths):
- ``POST /v1/completions`` and ``/v1/chat/completions``: :mod:`narwhal.emulator.inference`
  (parsing: :mod:`narwhal.emulator.request`; the KV handoff: :mod:`narwhal.emulator.handoff`).
- ``GET /kv/blocks/{id}`` and ``POST /kv/release``: the KV side channel
  (:mod:`narwhal.emulator.handoff`), a second listening socket served by the same app (``/kv``
  works on both ports; the router's ``release_handoff`` uses the HTTP port).
- ``/health``, ``/version``, ``/v1/models``, ``/metrics`` (:mod:`narwhal.emulator.surfaces`).
- ``POST /tokenize`` and ``/detokenize`` (:mod:`narwhal.emulator.tokenizer`).
- ``/admin/faults`` and ``/admin/state`` (:mod:`narwhal.emulator.admin`; the faults are acted
  out by :mod:`narwhal.emulator.acting`).
The lifespan opens the HTTP client for KV pulls and starts the engine-wide faults given before
the server ran.
"""

from __future__ import annotations

from starlette.types import Receive, Scope, Send

from narwhal.emulator.acting import FaultActor
from narwhal.emulator.admin import admin
from narwhal.emulator.asgi import NOT_FOUND, json_reply, read_body, reply, watched
from narwhal.emulator.faults import FaultSpec
from narwhal.emulator.handoff import Handoff
from narwhal.emulator.inference import Inference
from narwhal.emulator.kv_publisher import KvEventPublisher
from narwhal.emulator.state import EmulatorConfig, EngineState
from narwhal.emulator.surfaces import METRICS_HEADERS, metrics, models
from narwhal.emulator.tokenizer import detokenize, tokenize

INFERENCE_PATHS = ("/v1/completions", "/v1/chat/completions")
TOKENIZER_PATHS = {"/tokenize": tokenize, "/detokenize": detokenize}


class EmulatorApp:
    """An emulated vLLM engine (ASGI 3)."""

    def __init__(self, config: EmulatorConfig, faults: list[FaultSpec] | None = None) -> None:
        self.config = config
        self.engine = EngineState.create(config)
        # the prefix cache's KV events (vLLM --kv-events-config), bound now so the endpoints
        # are known before the engine serves
        self.kv_events: KvEventPublisher | None = None
        if config.kv_events_port is not None:
            self.kv_events = KvEventPublisher(
                config.host, config.kv_events_port, config.kv_events_topic
            )
            self.engine.prefix_cache.publish_to(self.kv_events)
        self.actor = FaultActor(self.engine.fault_rng)
        for spec in faults or []:
            self.actor.schedule(spec)
        self.handoff = Handoff(self.engine)
        self.inference = Inference(self.engine, self.actor, self.handoff)

    @property
    def engine_id(self) -> str:
        return self.engine.engine_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        raw = await read_body(receive)  # read first: the disconnect watchers share receive()
        if raw is None:
            return
        if path.startswith("/admin/"):
            await admin(self.engine, self.actor, method, path, raw, send)
            return
        if not await self.actor.wait_thaw(receive):
            return
        if method == "POST" and path in INFERENCE_PATHS:
            chat = path.endswith("chat/completions")
            self._note_traceparent(scope)

            def aborted() -> None:
                self.engine.counts["aborted"] += 1

            await watched(receive, lambda: self.inference.handle(scope, raw, send, chat), aborted)
        elif method == "GET" and path == "/health":
            await reply(send, 200, b"", [])
        elif method == "GET" and path == "/version":
            await json_reply(send, 200, {"version": self.config.version})
        elif method == "GET" and path == "/v1/models":
            await json_reply(send, 200, models(self.config))
        elif method == "GET" and path == "/metrics":
            await reply(send, 200, metrics(self.engine).encode(), METRICS_HEADERS)
        elif method == "POST" and path in TOKENIZER_PATHS:
            status, answer = TOKENIZER_PATHS[path](self.config, raw)
            await json_reply(send, status, answer)
        elif method == "GET" and path.startswith("/kv/blocks/"):
            await self.handoff.blocks(path.removeprefix("/kv/blocks/"), scope, send)
        elif method == "POST" and path == "/kv/release":
            await self.handoff.release(raw, send)
        else:
            await json_reply(send, 404, NOT_FOUND)

    def _note_traceparent(self, scope: Scope) -> None:
        """Keep the W3C trace context a request carried (``/admin/state`` shows it)."""
        headers = dict(scope["headers"])
        traceparent = headers.get(b"traceparent")
        if traceparent is not None:
            request_id = headers.get(b"x-request-id", b"").decode("latin-1")
            self.engine.traceparents.append((request_id, traceparent.decode("latin-1")))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.handoff.open()
                await self.actor.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.actor.aclose()
                await self.handoff.close()
                if self.kv_events is not None:
                    self.kv_events.close()
                await send({"type": "lifespan.shutdown.complete"})
                return
