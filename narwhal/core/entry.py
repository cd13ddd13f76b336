"""A client request's entry, for both worlds: admission first, then the request is served.

Rule kept here: this is the one way a client request enters the router; every request takes an
admission slot (:class:`~narwhal.core.admission.Admission`) before it holds anything and gives
it back exactly once, however its serving ends. A request the bound refuses is answered at once
with 503 and ``Retry-After: admission.retry_after_s``, in OpenAI's error shape, and gets one
record (outcome ``overloaded``, attempts 0, no engines): it never reaches placement, so no
engine is charged for it.

Theory of operation: :func:`admit_and_serve` takes the slot (or refuses), then runs the
driver's ``serve`` and releases the slot in ``finally``. What ``serve`` is differs only in what
a driver has to do before the lifecycle: the simulator's request is whole on arrival (its
``serve`` is :func:`~narwhal.core.lifecycle.serve_request`); the live router
admits once the request's whole body has arrived (a client that never sends its body must not
hold a slot), so a slot covers parsing the body, and its ``serve`` parses it, then runs the
lifecycle.

Why 503 and not 429: the bound is the router's capacity, not something one client did (429 is
"the user has sent too many requests", RFC 6585); 503 is "temporarily overloaded" (RFC 9110,
with ``Retry-After``), what Envoy answers when a circuit breaker's ``max_requests`` overflows,
and what Narwhal already answers, with ``Retry-After``, when no engine can serve. Clients retry
both (the OpenAI SDK retries 429 and 5xx, honouring ``Retry-After``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from narwhal.core.client_writes import CLIENT_GONE_STATUS
from narwhal.core.errors import FaultKind, fault
from narwhal.core.policies import Policies
from narwhal.core.ports import ClientGone, ClientSink, Ports
from narwhal.core.records import RequestRecord


async def refuse(
    request_id: str, arrival: float, ports: Ports, policies: Policies, sink: ClientSink
) -> RequestRecord:
    """Answer a request :meth:`Admission.try_admit` refused: 503 + Retry-After, one record."""
    admission = policies.admission
    failure = fault(FaultKind.OVERLOADED, admission.message(), engine=None, phase="admission")
    status, outcome = failure.status, failure.kind.value
    config = policies.config
    deadline = arrival + config.engine.request_timeout_s
    if config.client.write_timeout_s:  # a client that does not read its 503 holds nothing long
        deadline = min(deadline, ports.clock.now() + config.client.write_timeout_s)
    try:
        headers = {"retry-after": str(admission.retry_after_s)}
        if await sink.respond(status, failure.error_body(), headers, deadline) is not None:
            status, outcome = CLIENT_GONE_STATUS, "client_gone"  # it never read the refusal
    except ClientGone:
        status, outcome = CLIENT_GONE_STATUS, "client_gone"
    now = ports.clock.now()
    record = RequestRecord(
        request_id=request_id,
        arrival=arrival,
        status=status,
        outcome=outcome,
        committed=False,
        ttft_s=None,
        first_byte_s=None,
        finished_s=now - arrival,
        attempts=0,
        engines=(),
        output_tokens=0,
        error=failure.message,
    )
    policies.on_record(record)
    return record


async def admit_and_serve(
    request_id: str,
    arrival: float,
    ports: Ports,
    policies: Policies,
    sink: ClientSink,
    serve: Callable[[], Awaitable[RequestRecord | None]],
) -> RequestRecord | None:
    """Run ``serve`` under an admission slot, or refuse the request (503, one record); the
    slot is given back however ``serve`` ends. None: ``serve`` answered without a record."""
    admission = policies.admission
    if not admission.try_admit(arrival, request_id):
        return await refuse(request_id, arrival, ports, policies, sink)
    try:
        return await serve()
    finally:
        admission.release()
