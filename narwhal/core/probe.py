"""Probes, health checks and the background loop that drives readmission.

Rule kept here: an ejected engine is readmitted only through :func:`probe_engine` (a real
inference: a prefill leg, and for a consumer a short decode of a fresh handoff), or, for an engine
marked down by health checks in a fleet without an engine contract, a passing health check.
Each probe leg is bounded by ``engine.first_token_timeout_s``. Written once against the ports.

Theory of operation: :func:`maintenance_loop` wakes every ``tick`` seconds, spawns a probe for
each engine the breaker says is due (the breaker guarantees one in flight per engine, and
whole-wave restarts), and every ``recovery.probe_interval_s`` a health check of each engine.
A consumer (of role ``decode`` or ``both``) ejected after a crossed decode is probed with a
fresh handoff from that same producer;
if that producer (or any producer) cannot make one, the probe is inconclusive: the consumer
goes back to the normal cadence without penalty.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from narwhal.core.breaker import ProbeOutcome
from narwhal.core.jsonparse import parse_json
from narwhal.core.legs import DecodeLeg, prefill_leg
from narwhal.core.policies import Policies
from narwhal.core.ports import ConnectFailed, Ports, Reply, TimedOut
from narwhal.core.requests import COMPLETIONS, ClientRequest

PROBE_PROMPT = "narwhal probe"
HEALTH_TIMEOUT_S = 5.0


def probe_request(policies: Policies, max_tokens: int) -> dict[str, Any]:
    """The client body of a probe: a short greedy completion (of the pinned model, if any)."""
    body: dict[str, Any] = {"prompt": PROBE_PROMPT, "max_tokens": max_tokens, "temperature": 0}
    if policies.config.engine_contract is not None:
        body["model"] = policies.config.engine_contract.model
    return body


def probe_client_request(
    policies: Policies, max_tokens: int, request_id: str, now: float
) -> ClientRequest:
    """:func:`probe_request` as the client request the legs are built from."""
    return ClientRequest(request_id, COMPLETIONS, probe_request(policies, max_tokens), now)


async def contract_problems(url: str, ports: Ports, policies: Policies) -> list[str]:
    """What about ``url`` breaks the pinned engine contract (empty: it conforms)."""
    contract = policies.config.engine_contract
    if contract is None:
        return []
    timeout = policies.config.engine.first_token_timeout_s
    problems: list[str] = []
    version = await ports.transport.call(
        url, "GET", "/version", None, {}, ports.clock.now() + timeout
    )
    if isinstance(version, ConnectFailed | TimedOut):  # say so, not "version None"
        reason = "timed out" if isinstance(version, TimedOut) else version.reason
        return [f"unreachable: GET /version {reason}"]
    found = _json_field(version, "version")
    if found != contract.vllm_version:
        problems.append(f"version {found!r} != pinned {contract.vllm_version!r}")
    models = await ports.transport.call(
        url, "GET", "/v1/models", None, {}, ports.clock.now() + timeout
    )
    listed = _json_field(models, "data")
    names = [m.get("id") for m in listed if isinstance(m, dict)] if isinstance(listed, list) else []
    if contract.model not in names:
        problems.append(f"model {contract.model!r} not served (found {names})")
    return problems


def _json_field(result: object, key: str) -> Any:
    if not isinstance(result, Reply) or result.status != 200:
        return None
    try:
        payload = parse_json(result.body)
    except ValueError:
        return None
    return payload.get(key) if isinstance(payload, dict) else None


async def _prefill_leg(producer: str, ports: Ports, policies: Policies) -> dict[str, Any] | None:
    """A probe prefill on ``producer``: the validated descriptor, or None if it failed."""
    request_id = policies.new_id("probe-p")
    now = ports.clock.now()
    prefilled = await prefill_leg(
        ports.transport,
        ports.clock,
        producer,
        probe_client_request(policies, 1, request_id, now),
        backend_request_id=request_id,
        connector=policies.kv_connector,
        pinned_side_channel=policies.pinned_side_channel(producer),
        deadline=now + policies.config.engine.first_token_timeout_s,
        max_handoff_age_s=None,  # bounded by first_token_timeout_s alone, as every probe leg
    )
    return prefilled.descriptor


async def _decode_leg(
    consumer: str,
    descriptor: dict[str, Any] | None,
    ports: Ports,
    policies: Policies,
    producer: str | None = None,
) -> bool:
    """A short streamed decode of ``recovery.probe_decode_tokens`` tokens: passes on a
    generated token and [DONE] within the leg's bound (a stream that goes silent before its
    end fails it). With the ``producer`` of ``descriptor``, a handoff the consumer never got is
    released there."""
    body = probe_request(policies, policies.config.recovery.probe_decode_tokens)
    body["stream"] = True
    if descriptor is not None:
        body["kv_transfer_params"] = descriptor
    timeout = policies.config.engine.first_token_timeout_s
    leg = DecodeLeg(  # the whole leg within first_token_timeout_s
        ports.transport,
        ports.clock,
        consumer,
        first_token_timeout_s=timeout,
        decode_read_timeout_s=timeout,
        request_deadline=ports.clock.now() + timeout,
    )
    headers = {"X-Request-Id": policies.new_id("probe-d")}
    try:
        failure = await leg.open(COMPLETIONS, body, headers)
        if producer is not None and descriptor is not None and not leg.delivered:
            ports.transport.release_handoff(producer, descriptor)
        return failure is None and await leg.read_to_end() is None
    finally:
        leg.close()


async def probe_engine(url: str, ports: Ports, policies: Policies) -> ProbeOutcome:
    """Judge an ejected engine by real inference (and the contract, when one is pinned)."""
    if await contract_problems(url, ports, policies):
        return ProbeOutcome.FAILED
    role = policies.breaker.health(url).role  # (held until a probe in flight has ended)
    crossed = policies.breaker.health(url).probe_producer is not None
    if role.produces and not crossed:  # a producer, or a `both` engine: its own legs
        descriptor = await _prefill_leg(url, ports, policies)
        if descriptor is None:
            return ProbeOutcome.FAILED
        if not role.consumes:
            ports.transport.release_handoff(url, descriptor)
            return ProbeOutcome.PASSED
        ports.transport.release_handoff(url, descriptor)
        passed = await _decode_leg(url, None, ports, policies)  # same-worker decode
        return ProbeOutcome.PASSED if passed else ProbeOutcome.FAILED
    producer = _probe_producer(url, ports, policies)
    if producer is None:
        return ProbeOutcome.INCONCLUSIVE
    descriptor = await _prefill_leg(producer, ports, policies)
    if descriptor is None:
        return ProbeOutcome.INCONCLUSIVE  # the producer failed: nothing learned about url
    passed = await _decode_leg(url, descriptor, ports, policies, producer)
    return ProbeOutcome.PASSED if passed else ProbeOutcome.FAILED


def _probe_producer(url: str, ports: Ports, policies: Policies) -> str | None:
    """The original producer of a crossed-decode failure, else any placeable producer."""
    now = ports.clock.now()
    original = policies.breaker.health(url).probe_producer
    if original is not None:
        return original
    candidates = [u for u in policies.placement.candidates("prefill", now) if u != url]
    return candidates[0] if candidates else None


async def run_probe(url: str, ports: Ports, policies: Policies) -> ProbeOutcome:
    """Probe ``url`` (already marked PROBING by the breaker) and record the outcome."""
    outcome = ProbeOutcome.INCONCLUSIVE
    try:
        outcome = await probe_engine(url, ports, policies)
    finally:
        policies.breaker.on_probe(url, ports.clock.now(), outcome)
    return outcome


async def check_health(url: str, ports: Ports, policies: Policies) -> bool:
    """GET /health; marks the engine down on failure and readmits per the breaker's rules."""
    deadline = ports.clock.now() + min(
        HEALTH_TIMEOUT_S, policies.config.engine.first_token_timeout_s
    )
    reply = await ports.transport.call(url, "GET", "/health", None, {}, deadline)
    ok = isinstance(reply, Reply) and reply.status == 200
    policies.breaker.on_health(url, ports.clock.now(), ok)
    return ok


async def maintenance_loop(
    ports: Ports,
    policies: Policies,
    *,
    stop: Callable[[], bool],
    tick_s: float | None = None,
    health_checks: bool = True,
) -> None:
    """The background loop: due probes every tick, health checks every probe interval."""
    interval = policies.config.recovery.probe_interval_s
    tick = tick_s if tick_s is not None else min(1.0, interval / 2)
    next_health = ports.clock.now()
    checking: set[str] = set()

    def spawn_health(url: str) -> None:
        async def run() -> None:
            try:
                await check_health(url, ports, policies)
            finally:
                checking.discard(url)

        checking.add(url)
        ports.spawn(run)

    def spawn_probe(url: str) -> None:
        async def run() -> None:
            await run_probe(url, ports, policies)

        ports.spawn(run)

    while not stop():
        now = ports.clock.now()
        for url in policies.breaker.due_probes(now):
            spawn_probe(url)
        if health_checks and now >= next_health:
            next_health = now + interval
            for url in policies.breaker.in_fleet:  # not the draining engines
                if url not in checking:
                    spawn_health(url)
        await ports.clock.sleep(tick)
