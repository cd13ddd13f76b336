"""What a request must be before the router reads it: addressed to a Host it answers, and, for
an inference route, sent as JSON.

Rule kept here: with ``client.allowed_hosts`` set, a request whose ``Host`` (its name, without
the port) is not listed gets 421 (liveness and readiness, ``/livez`` and ``/health``, are
answered whatever the Host, as orchestrators probe by address); an inference body must come
with ``content-type: application/json`` (parameters such as ``charset`` allowed, as is any
``+json`` type), else 415. Both answers are OpenAI error objects.

Why: a web page can make a browser send a "simple" cross-origin POST, with no preflight, when its
content type is ``text/plain``, ``application/x-www-form-urlencoded`` or ``multipart/form-data``,
or when it has none (a Blob or ArrayBuffer body); refusing all of those means a page cannot run
completions on a router on localhost, nor spend its engines. A page on a name the attacker
controls can still point that name at 127.0.0.1 (DNS rebinding) and then read the answers as
same-origin; its requests carry its own name in ``Host``, which the allow-list refuses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from narwhal.core import wire

UNCHECKED_PATHS = frozenset({"/livez", "/health"})


def host_name(header: str) -> str:
    """The name in a ``Host`` header value: lower case, without port, brackets or final dot."""
    value = header.strip().lower()
    if value.startswith("["):  # an IPv6 literal, [::1]:8000
        return value[1:].partition("]")[0]
    return value.rpartition(":")[0].rstrip(".") if ":" in value else value.rstrip(".")


class HostGate:
    """The ``client.allowed_hosts`` check (empty: every Host is answered)."""

    def __init__(self, allowed: Iterable[str]) -> None:
        self.allowed = frozenset(allowed)

    def refusal(self, path: str, headers: Mapping[str, str]) -> dict[str, object] | None:
        """The 421 error body for a request to a Host not listed, else None."""
        if not self.allowed or path in UNCHECKED_PATHS:
            return None
        given = headers.get("host")
        if given is not None and host_name(given) in self.allowed:
            return None
        return wire.error_object(
            421,
            f"this router does not answer for Host {given!r} (client.allowed_hosts)",
            "invalid_request_error",
        )


def json_refusal(headers: Mapping[str, str]) -> dict[str, object] | None:
    """The 415 error body for an inference request not declared as JSON, else None."""
    given = headers.get("content-type")
    media = (given or "").partition(";")[0].strip().lower()
    if media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    ):
        return None
    said = "no content-type" if given is None else f"content-type {given!r}"
    return wire.error_object(
        415,
        f"the request body must be JSON sent as content-type: application/json ({said})",
        "invalid_request_error",
    )
