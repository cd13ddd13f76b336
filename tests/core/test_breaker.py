"""The breaker at exact boundaries, and a state-machine test against a reference model."""

from __future__ import annotations

import random

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from narwhal.core.breaker import JITTER, Breaker, EngineState, ProbeOutcome
from narwhal.core.config import RecoverySettings, Role
from narwhal.core.records import DecisionLog
from narwhal.core.retry import RetryBudget

A, B, C = "http://a", "http://b", "http://c"


def breaker(
    eject_after: int = 3,
    quarantine: float = 0.0,
    interval: float = 5.0,
    engines: tuple[tuple[str, Role], ...] = ((A, Role.DECODE), (B, Role.DECODE), (C, Role.PREFILL)),
    contract: bool = False,
    max_ejection_percent: int = 100,
) -> Breaker:
    recovery = RecoverySettings(
        eject_after=eject_after,
        failure_quarantine_s=quarantine,
        probe_interval_s=interval,
        max_ejection_percent=max_ejection_percent,
    )
    return Breaker(engines, recovery, random.Random(0), DecisionLog(), contract_configured=contract)


def fail(b: Breaker, url: str, now: float) -> bool:
    return b.on_failure(url, b.epoch(url), now, phase="decode")


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_ejected_at_kth_consecutive_failure_not_before(k: int) -> None:
    b = breaker(eject_after=k)
    for i in range(k - 1):
        assert not fail(b, A, float(i))
        assert b.state(A, float(i)) is EngineState.READY
    assert fail(b, A, 10.0)
    assert b.state(A, 10.0) is EngineState.EJECTED
    assert not b.placeable(A, 10.0)


def test_success_resets_the_streak() -> None:
    b = breaker(eject_after=3)
    fail(b, A, 0)
    fail(b, A, 1)
    b.on_success(A, b.epoch(A), 2, phase="decode")
    fail(b, A, 3)
    fail(b, A, 4)
    assert b.state(A, 4) is EngineState.READY
    assert fail(b, A, 5)


def test_quarantine_edges() -> None:
    b = breaker(eject_after=5, quarantine=2.0)
    fail(b, A, 10.0)
    assert b.state(A, 10.0) is EngineState.QUARANTINED
    assert b.state(A, 11.999) is EngineState.QUARANTINED
    assert b.state(A, 12.0) is EngineState.READY  # excluded for exactly failure_quarantine_s
    assert b.placeable(B, 10.0)


def test_no_quarantine_when_zero() -> None:
    b = breaker(eject_after=5, quarantine=0.0)
    fail(b, A, 10.0)
    assert b.state(A, 10.0) is EngineState.READY


def test_late_result_from_before_ejection_is_ignored() -> None:
    b = breaker(eject_after=1)
    epoch = b.epoch(A)
    fail(b, A, 0.0)
    assert not b.on_failure(A, epoch, 1.0, phase="decode")  # a straggler from the same wave
    b.on_success(A, epoch, 1.0, phase="decode")  # cannot readmit either
    assert b.state(A, 1.0) is EngineState.EJECTED


def test_probe_cadence_with_jitter_and_one_probe_in_flight() -> None:
    b = breaker(eject_after=1, interval=10.0)
    fail(b, C, 0.0)  # the only producer: a whole wave of one — probed at once
    assert b.due_probes(0.0) == [C]
    assert b.state(C, 0.0) is EngineState.PROBING
    assert b.due_probes(100.0) == []  # at most one probe in flight per engine
    b.on_probe(C, 1.0, ProbeOutcome.FAILED)
    due_at = b.health(C).next_probe_at
    assert due_at is not None
    assert 1.0 + 20.0 * (1 - JITTER) <= due_at <= 1.0 + 20.0 * (1 + JITTER)  # doubled backoff
    assert b.due_probes(due_at - 1e-6) == []
    assert b.due_probes(due_at) == [C]
    b.on_probe(C, due_at, ProbeOutcome.PASSED)
    assert b.state(C, due_at) is EngineState.READY
    assert b.health(C).streak == 0


def test_inconclusive_probe_returns_to_normal_cadence_without_penalty() -> None:
    b = breaker(eject_after=1, interval=10.0)
    fail(b, A, 0.0)
    first = b.health(A).next_probe_at
    assert first is not None and b.due_probes(first) == [A]
    b.on_probe(A, first, ProbeOutcome.INCONCLUSIVE)
    assert b.health(A).failed_probes == 0
    nxt = b.health(A).next_probe_at
    assert nxt is not None and nxt - first <= 10.0 * (1 + JITTER)
    assert b.state(A, first) is EngineState.EJECTED


def test_inconclusive_probe_after_failed_ones_drops_the_backoff() -> None:
    b = breaker(eject_after=1, interval=10.0)
    fail(b, A, 0.0)
    at = b.health(A).next_probe_at
    assert at is not None
    for _ in range(2):  # two failed probes: the next one waits 4x the interval
        assert b.due_probes(at) == [A]
        b.on_probe(A, at, ProbeOutcome.FAILED)
        nxt = b.health(A).next_probe_at
        assert nxt is not None
        at = nxt
    assert b.due_probes(at) == [A]
    b.on_probe(A, at, ProbeOutcome.INCONCLUSIVE)
    nxt = b.health(A).next_probe_at
    assert nxt is not None and 10.0 * (1 - JITTER) <= nxt - at <= 10.0 * (1 + JITTER)
    assert b.health(A).failed_probes == 0
    assert b.due_probes(nxt) == [A]
    b.on_probe(A, nxt, ProbeOutcome.FAILED)  # backoff starts again from the first step
    after = b.health(A).next_probe_at
    assert after is not None and 20.0 * (1 - JITTER) <= after - nxt <= 20.0 * (1 + JITTER)


BOTH = ((A, Role.BOTH), (B, Role.BOTH))


def test_both_engine_with_passing_prefills_is_ejected_by_failing_decodes() -> None:
    # Each request's prefill passes on A, then its decode fails on A: the decode streak grows.
    b = breaker(eject_after=3, engines=BOTH)
    for i in range(2):
        b.on_success(A, b.epoch(A), float(i), phase="prefill")
        assert not b.on_failure(A, b.epoch(A), float(i), phase="decode")
    b.on_success(A, b.epoch(A), 2.0, phase="prefill")
    assert b.on_failure(A, b.epoch(A), 2.0, phase="decode")
    assert b.state(A, 2.0) is EngineState.EJECTED


def test_both_engine_with_passing_decodes_is_ejected_by_failing_prefills() -> None:
    b = breaker(eject_after=2, engines=BOTH)
    assert not b.on_failure(A, b.epoch(A), 0.0, phase="prefill")
    b.on_success(A, b.epoch(A), 0.5, phase="decode")  # a decode of another request passes
    assert b.health(A).streak == 1
    assert b.on_failure(A, b.epoch(A), 1.0, phase="prefill")


def test_readmission_clears_both_streaks() -> None:
    b = breaker(eject_after=2, engines=BOTH)
    b.on_failure(A, b.epoch(A), 0.0, phase="prefill")
    b.on_failure(A, b.epoch(A), 0.0, phase="decode")
    assert b.on_failure(A, b.epoch(A), 0.0, phase="decode")
    assert b.due_probes(100.0) == [A]
    b.on_probe(A, 100.0, ProbeOutcome.PASSED)
    health = b.health(A)
    assert (health.prefill_streak, health.decode_streak) == (0, 0)
    assert not b.on_failure(A, b.epoch(A), 101.0, phase="prefill")


def test_whole_wave_probes_all_at_once() -> None:
    b = breaker(eject_after=1, interval=10.0)
    fail(b, A, 0.0)
    assert b.due_probes(0.0) == []  # B still serves decode: normal cadence
    fail(b, B, 1.0)  # now every decode engine is ejected
    assert sorted(b.due_probes(1.0)) == [A, B]


def test_health_check_readmission_without_contract() -> None:
    b = breaker()
    b.on_health(A, 0.0, ok=False)
    assert b.state(A, 0.0) is EngineState.EJECTED
    assert A not in b.due_probes(100.0)  # a health-down engine waits for a passing check
    b.on_health(A, 1.0, ok=True)
    assert b.state(A, 1.0) is EngineState.READY


def test_health_check_does_not_readmit_with_contract() -> None:
    b = breaker(contract=True)
    b.on_health(A, 0.0, ok=False)
    b.on_health(A, 1.0, ok=True)
    assert b.state(A, 1.0) is EngineState.EJECTED  # needs probe + contract validation


def test_breaker_ejection_needs_an_inference_probe_even_if_healthy() -> None:
    b = breaker(eject_after=1)
    fail(b, A, 0.0)
    b.on_health(A, 1.0, ok=True)
    assert b.state(A, 1.0) is EngineState.EJECTED


# ---------------------------------------------------------------- state machine


class BreakerMachine(RuleBasedStateMachine):
    """Breaker + quarantine + retry budget against a tiny reference model of the contract."""

    def __init__(self) -> None:
        super().__init__()
        self.k = 3
        self.q = 2.0
        self.b = breaker(eject_after=self.k, quarantine=self.q, interval=5.0)
        self.now = 0.0
        self.streak = {A: 0, B: 0}
        self.ejected = {A: False, B: False}
        self.quarantined_until = {A: -1.0, B: -1.0}
        self.probing: set[str] = set()
        self.budget = RetryBudget(ratio=0.25, minimum=1)
        self.active = 0
        self.retries = 0

    @rule()
    def request_starts(self) -> None:
        self.budget.request_started()
        self.active += 1

    @precondition(lambda self: self.active > 0)
    @rule()
    def request_ends(self) -> None:
        self.budget.request_finished()
        self.active -= 1

    @rule()
    def retry_asked(self) -> None:
        granted = self.budget.try_acquire()
        assert granted == (self.retries < max(1, int(0.25 * self.active)))
        self.retries += granted

    @precondition(lambda self: self.retries > 0)
    @rule()
    def retry_ends(self) -> None:
        self.budget.release()
        self.retries -= 1

    @rule(dt=st.floats(0.0, 8.0))
    def advance(self, dt: float) -> None:
        self.now += dt

    @rule(url=st.sampled_from([A, B]))
    def failure(self, url: str) -> None:
        ejected = fail(self.b, url, self.now)
        if self.ejected[url]:
            assert not ejected  # a result for an ejected engine changes nothing
            return
        self.streak[url] += 1
        self.quarantined_until[url] = self.now + self.q
        assert ejected == (self.streak[url] == self.k)
        if ejected:
            self.ejected[url] = True

    @rule(url=st.sampled_from([A, B]))
    def success(self, url: str) -> None:
        self.b.on_success(url, self.b.epoch(url), self.now, phase="decode")
        if not self.ejected[url]:
            self.streak[url] = 0

    @rule()
    def probes_due(self) -> None:
        due = self.b.due_probes(self.now)
        assert all(self.ejected[u] and u not in self.probing for u in due)
        self.probing.update(due)

    @precondition(lambda self: bool(self.probing))
    @rule(outcome=st.sampled_from(list(ProbeOutcome)), data=st.data())
    def probe_done(self, outcome: ProbeOutcome, data: st.DataObject) -> None:
        url = data.draw(st.sampled_from(sorted(self.probing)))
        self.probing.discard(url)
        self.b.on_probe(url, self.now, outcome)
        if outcome is ProbeOutcome.PASSED:
            self.ejected[url] = False
            self.streak[url] = 0
            self.quarantined_until[url] = -1.0

    @invariant()
    def matches_reference(self) -> None:
        for url in (A, B):
            placeable = (
                not self.ejected[url]
                and url not in self.probing
                and self.now >= self.quarantined_until[url]
            )
            assert self.b.placeable(url, self.now) == placeable
            if not self.ejected[url]:
                assert self.b.health(url).streak == self.streak[url]


TestBreakerMachine = BreakerMachine.TestCase
TestBreakerMachine.settings = settings(
    max_examples=150, stateful_step_count=40, derandomize=True, deadline=None
)


def test_a_wave_member_down_by_health_check_does_not_keep_the_wave_due() -> None:
    # Without a contract, an engine marked down by a health check waits for a passing check;
    # its probe time must not make the other members of the wave due at every tick.
    b = breaker(eject_after=1, engines=((A, Role.PREFILL), (B, Role.PREFILL), (C, Role.DECODE)))
    b.on_health(A, 0.0, ok=False)
    fail(b, B, 10.0)  # now every prefill engine is out: a whole wave
    assert b.due_probes(10.0) == [B]
    b.on_probe(B, 10.5, ProbeOutcome.FAILED)
    retry_at = b.health(B).next_probe_at
    assert retry_at is not None and retry_at > 15.0  # backed off
    assert all(b.due_probes(t) == [] for t in (11.0, 12.0, 13.0, 14.0, 15.0))
    assert b.due_probes(retry_at) == [B]


D = "http://d"
FOUR_DECODERS = ((A, Role.DECODE), (B, Role.DECODE), (C, Role.DECODE), (D, Role.DECODE))


def capped_log(b: Breaker) -> list[str | None]:
    return [d.engine for d in b._log.entries if d.kind == "eject_capped"]


@pytest.mark.parametrize(
    ("percent", "allowed"), [(0, 1), (24, 1), (25, 1), (49, 1), (50, 2), (74, 2), (75, 3), (100, 4)]
)
def test_the_ejection_cap_at_its_boundaries(percent: int, allowed: int) -> None:
    b = breaker(eject_after=1, engines=FOUR_DECODERS, max_ejection_percent=percent)
    ejected = [fail(b, url, 1.0) for url in (A, B, C, D)]
    assert ejected == [i < allowed for i in range(4)]  # at least one may always be ejected
    assert [b.state(u, 1.0) for u in (A, B, C, D)].count(EngineState.EJECTED) == allowed
    assert capped_log(b) == [A, B, C, D][allowed:]


def test_a_capped_engine_is_a_last_resort_until_another_is_readmitted() -> None:
    b = breaker(eject_after=2, engines=FOUR_DECODERS, max_ejection_percent=25)
    fail(b, A, 0.0)
    assert fail(b, A, 0.0)
    fail(b, B, 1.0)
    assert not fail(b, B, 1.0)  # over the cap: B reached eject_after but stays in service
    assert b.state(B, 1.0) is EngineState.CAPPED
    assert b.in_service(B) and not b.placeable(B, 1.0)  # only a fallback
    assert not fail(b, B, 2.0)  # still capped: the streak goes on, nothing ejected
    assert b.health(B).streak == 3
    (due,) = b.due_probes(100.0)
    b.on_probe(due, 100.0, ProbeOutcome.PASSED)  # A readmitted: room under the cap again
    assert b.state(A, 100.0) is EngineState.READY
    assert b.state(B, 100.0) is EngineState.EJECTED  # B goes at once, and will be probed
    assert [d.kind for d in b._log.entries[-2:]] == ["readmit", "eject"]


def test_a_completed_leg_frees_a_capped_engine() -> None:
    b = breaker(eject_after=1, engines=FOUR_DECODERS, max_ejection_percent=25)
    assert fail(b, A, 0.0)
    assert not fail(b, B, 0.0)
    b.on_success(B, b.epoch(B), 1.0, phase="prefill")  # the other phase's streak: still capped
    assert b.state(B, 1.0) is EngineState.CAPPED
    b.on_success(B, b.epoch(B), 1.0, phase="decode")
    assert b.state(B, 1.0) is EngineState.READY


def test_the_cap_counts_an_engine_of_role_both_in_each_role_it_serves() -> None:
    engines = ((A, Role.BOTH), (B, Role.DECODE), (C, Role.PREFILL), (D, Role.PREFILL))
    b = breaker(eject_after=1, engines=engines, max_ejection_percent=50)
    assert fail(b, C, 0.0)  # prefill: A, C, D -> one may be ejected
    assert not fail(b, A, 0.0)  # would be a second prefill engine out
    assert not b.on_failure(D, b.epoch(D), 0.0, phase="prefill")
    assert fail(b, B, 0.0)  # decode: A, B -> one may be ejected


def test_health_checks_are_not_capped_but_count_against_the_cap() -> None:
    b = breaker(eject_after=1, engines=FOUR_DECODERS, max_ejection_percent=25)
    for url in (A, B, C, D):
        b.on_health(url, 0.0, ok=False)  # really down: the whole role goes, as a wave
    assert all(b.state(u, 0.0) is EngineState.EJECTED for u in (A, B, C, D))
    b.on_health(A, 1.0, ok=True)
    assert not fail(b, A, 2.0)  # three of four are down: no room for a breaker ejection
    assert b.state(A, 2.0) is EngineState.CAPPED and b.in_service(A)
