"""The handler of ``/tokenize`` and ``/detokenize``: the HTTP side of
:mod:`narwhal.core.passthrough`.

Rule kept here: a thin driver. The statuses it chooses itself are for requests the core never
sees, as the inference routes choose them (401 bad key, 415 a body not sent as JSON, 413 a body
over ``admission.max_body_bytes`` or ``admission.max_json_values``, 400 malformed JSON or not a
JSON object); which engine answers, and what the client gets when it fails, is the core's.

Theory of operation: read and parse the body within the admission bounds
(:mod:`narwhal.live.bodies`), hand it to the router's :class:`~narwhal.core.passthrough.
PassThrough`, write what it returns. A client that leaves while the engine answers is noticed
when the answer is written (the engine's call is bounded by ``engine.first_token_timeout_s``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from narwhal.core import wire
from narwhal.core.config import NarwhalConfig
from narwhal.core.passthrough import PassThrough
from narwhal.core.policies import Policies
from narwhal.core.ports import Ports
from narwhal.live.bodies import BodyRefused, parse_body, read_bounded_body, too_large
from narwhal.live.gate import json_refusal
from narwhal.live.h1request import EdgeRequest, Response

JSON_HEADERS = {"content-type": "application/json"}


class PassThroughRouter(Protocol):
    """What the handler reads of its router (:class:`narwhal.live.app.Router`)."""

    policies: Policies
    passthrough: PassThrough

    @property
    def config(self) -> NarwhalConfig: ...

    @property
    def ports(self) -> Ports: ...

    def authorized(self, headers: Mapping[str, str]) -> bool: ...

    def unauthorized(self) -> Response: ...


def _json(status: int, body: Any, headers: Mapping[str, str] | None = None) -> Response:
    return Response(status, wire.to_json(body), {**(headers or {}), **JSON_HEADERS})


class PassThroughHandler:
    """Serves one pass-through path (``/tokenize`` or ``/detokenize``) for its router."""

    def __init__(self, router: PassThroughRouter, path: str) -> None:
        self.router = router
        self.path = path

    async def __call__(self, request: EdgeRequest) -> Response | None:
        router = self.router
        if not router.authorized(request.headers):
            return router.unauthorized()
        not_json = json_refusal(request.headers)
        if not_json is not None:
            return _json(415, not_json)
        admission = router.config.admission
        try:
            raw = await read_bounded_body(request, admission.max_body_bytes)
        except OSError:  # the client left (or was cut by client.body_timeout_s)
            return None
        if raw is None:
            return _json(413, too_large(admission.max_body_bytes))
        try:
            body = parse_body(raw, admission.max_json_values)
        except BodyRefused as refused:
            return _json(refused.status, refused.error)
        if not isinstance(body, dict):
            message = "request body must be a JSON object"
            return _json(400, wire.error_object(400, message, "invalid_request_error"))
        status, answer, headers = await router.passthrough.serve(
            self.path, body, router.ports, router.policies
        )
        return _json(status, answer, headers)
