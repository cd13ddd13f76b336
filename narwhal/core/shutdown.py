"""How a request the router's own shutdown cuts short ends, and how it is recorded.

Rule kept here: a request still running when the server's shutdown grace period ends gets a
clear end, not a cut connection: before the commit a 503 with ``Retry-After: 1``, after it one
terminal SSE error event (nothing follows it), both saying :data:`SHUTDOWN_MESSAGE`. It is
recorded once, as what its client got: outcome ``shutdown``, status 503, ``committed`` as it was
(a committed failure records the fault's status, as every other one does), the rest of the
lifecycle's record kept.

Theory of operation: only a driver sees its server shut down (the core sees a cancellation,
which it records as a request whose client left, ``client_gone``). The live driver, on that
cancellation, calls :func:`answer_shutdown` through the client sink and reports the core's
record rewritten by :func:`shutdown_record`. The simulator never shuts a router down mid-run, so
it never calls either.
"""

from __future__ import annotations

from typing import Any

from narwhal.core import wire
from narwhal.core.ports import ClientGone, ClientSink
from narwhal.core.records import RequestRecord

SHUTDOWN = "shutdown"
"""The outcome of a request the shutdown ended."""
SHUTDOWN_STATUS = 503
SHUTDOWN_MESSAGE = "the router is shutting down; retry the request"
SHUTDOWN_RETRY_AFTER_S = 1
CANCELLED = "client_gone"
"""What the lifecycle records for a request its driver cancelled (the shutdown's among them)."""


def shutdown_error() -> dict[str, Any]:
    """The error the client of a request the shutdown ended gets."""
    return wire.error_object(SHUTDOWN_STATUS, SHUTDOWN_MESSAGE, "service_unavailable")


async def answer_shutdown(sink: ClientSink, committed: bool, deadline: float) -> None:
    """Tell the client its request was ended by the shutdown: a 503 with Retry-After before the
    commit, one terminal SSE error event after it; each within ``deadline`` (a client that has
    left is not told)."""
    error = shutdown_error()
    try:
        if not committed:
            headers = {"retry-after": str(SHUTDOWN_RETRY_AFTER_S)}
            await sink.respond(SHUTDOWN_STATUS, error, headers, deadline)
        else:
            await sink.end(wire.sse_event(wire.to_json(error)), deadline)
    except ClientGone:
        pass


def shutdown_record(record: RequestRecord, committed: bool) -> RequestRecord:
    """``record`` (the lifecycle's, of a cancelled request) as its client got it when the
    shutdown ended it (``committed``: the 200 had gone out)."""
    values = record.as_dict()
    values.update(
        outcome=SHUTDOWN,
        status=SHUTDOWN_STATUS,
        committed=committed,
        error=SHUTDOWN_MESSAGE,
        engines=record.engines,
    )
    return RequestRecord(**values)
