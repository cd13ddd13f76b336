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

With ``[flow] enabled`` and a request that carries a :class:`~narwhal.core.flow.FlowKey`, the
request queues instead (:mod:`narwhal.core.flow`): it waits on a driver's
:class:`~narwhal.core.ports.Waiter` until flow control dispatches it (with its admission slot
taken) or refuses it, and is answered 503 + ``Retry-After`` with outcome ``shed`` and an error
naming the reason; one whose request deadline (``engine.request_timeout_s``) passes before its
queue TTL gets the deadline's answer instead, as any request past its deadline: 504, outcome
``deadline``, reason ``deadline`` in flow control's counts. Each finished request pumps the
queue; while it is gated by saturation, one background loop per router pumps it every
``flow.poll_interval_s``.

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
from narwhal.core.flow import (
    CLIENT_GONE,
    DEADLINE,
    PROBABILISTIC,
    QUEUE_FULL,
    QUEUE_TTL,
    FlowKey,
)
from narwhal.core.policies import Policies
from narwhal.core.ports import ClientGone, ClientSink, Ports
from narwhal.core.records import RequestRecord


async def refuse(
    request_id: str,
    arrival: float,
    ports: Ports,
    policies: Policies,
    sink: ClientSink,
    shed: str | None = None,
) -> RequestRecord:
    """Answer a request :meth:`Admission.try_admit` refused, or flow control refused for the
    reason ``shed``: 503 + Retry-After (504 when its request deadline passed), one record."""
    admission = policies.admission
    if shed is None:
        failure = fault(FaultKind.OVERLOADED, admission.message(), engine=None, phase="admission")
    elif shed == DEADLINE:
        failure = fault(FaultKind.DEADLINE, shed_message(shed, policies), engine=None, phase="flow")
    else:
        failure = fault(FaultKind.SHED, shed_message(shed, policies), engine=None, phase="flow")
    status, outcome = failure.status, failure.kind.value
    config = policies.config
    deadline = arrival + config.engine.request_timeout_s
    if config.client.write_timeout_s:  # a client that does not read its 503 holds nothing long
        deadline = min(deadline, ports.clock.now() + config.client.write_timeout_s)
    try:
        headers = {} if shed == DEADLINE else {"retry-after": str(admission.retry_after_s)}
        if shed == CLIENT_GONE:  # it left while queued: nobody to answer
            raise ClientGone()
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
    flow_key: FlowKey | None = None,
) -> RequestRecord | None:
    """Run ``serve`` under an admission slot, or refuse the request (503, one record); the
    slot is given back however ``serve`` ends. None: ``serve`` answered without a record."""
    admission = policies.admission
    flow = policies.flow
    if flow_key is not None and flow.enabled and ports.waiter is not None:
        shed = await _queue(request_id, arrival, flow_key, ports, policies)
        if shed is not None:
            return await refuse(request_id, arrival, ports, policies, sink, shed)
    elif not admission.try_admit(arrival, request_id):
        return await refuse(request_id, arrival, ports, policies, sink)
    try:
        return await serve()
    finally:
        admission.release()
        if flow.enabled:
            flow.released(ports.clock.now())


def shed_message(reason: str, policies: Policies) -> str:
    """The error text of a flow-control refusal: names the reason and the setting behind it."""
    if reason == DEADLINE:
        timeout = policies.config.engine.request_timeout_s
        return (
            "request deadline passed while queued by flow control (deadline): "
            f"engine.request_timeout_s = {timeout:g} s"
        )
    flow = policies.config.flow
    why = {
        QUEUE_FULL: f"its priority band's queue is full (flow.max_queue_per_band = "
        f"{flow.max_queue_per_band})",
        QUEUE_TTL: f"it waited in the queue past flow.queue_ttl_s ({flow.queue_ttl_s:g} s)",
        PROBABILISTIC: "it is sheddable and the fleet is saturated (flow.probabilistic_shedding)",
        CLIENT_GONE: "its client left while it was queued",
    }[reason]
    retry = policies.admission.retry_after_s
    return f"flow control shed the request ({reason}): {why}; retry after {retry} s"


async def _queue(
    request_id: str, arrival: float, key: FlowKey, ports: Ports, policies: Policies
) -> str | None:
    """Wait in flow control's queue until dispatched (None: the request holds an admission
    slot) or refused (the reason). A client that leaves while queued (its wait raises
    ``ClientGone``, or the driver cancels it) takes its ticket out of the queue."""
    flow = policies.flow
    now = ports.clock.now()
    deadline = arrival + policies.config.engine.request_timeout_s
    ticket = flow.offer(now, request_id, key, deadline)
    if isinstance(ticket, str):
        return ticket
    if ticket.dispatched:
        return None
    assert ports.waiter is not None
    waiter = ports.waiter()
    ticket.waiter = waiter
    if not flow.poller_running and flow.settings.saturation_gate:
        flow.poller_running = True
        ports.spawn(lambda: _poll(ports, policies))
    served = False
    try:
        while not ticket.dispatched:
            if not await waiter.wait(ticket.expires) and not ticket.dispatched:
                reason = QUEUE_TTL if ticket.expires < deadline else DEADLINE
                flow.expire(ticket, ports.clock.now(), reason)
                return reason
        served = True
    except ClientGone:
        return CLIENT_GONE
    finally:
        if not served and ticket.dispatched:  # cancelled once dispatched: give its slot back
            policies.admission.release()
            flow.released(ports.clock.now())
        flow.expire(ticket, ports.clock.now(), CLIENT_GONE)  # nothing once it left the queue
    return None


async def _poll(ports: Ports, policies: Policies) -> None:
    """While requests are queued, look again every ``flow.poll_interval_s``: a saturated
    fleet reopens the gate only by its next load reports, which wake no one."""
    flow = policies.flow
    try:
        while flow.queued:
            await ports.clock.sleep(flow.settings.poll_interval_s)
            flow.pump(ports.clock.now())
    finally:
        flow.poller_running = False
