"""Engine-reported load: the EngineLoad value, report staleness at its exact edge, and
least_loaded's score, its unknown-load fallback and its count of placements since a report."""

from __future__ import annotations

import random

import pytest

from narwhal.core.config import LeastLoadedSettings
from narwhal.core.routing.load import EngineLoad, LeastLoaded, LoadReports
from narwhal.core.routing.policy import Counts, least_reserved

URLS = ["http://e0", "http://e1", "http://e2"]


def load(waiting: float = 0, running: float = 0, kv: float = 0.0) -> EngineLoad:
    return EngineLoad(num_requests_waiting=waiting, num_requests_running=running,
                      kv_cache_usage_perc=kv)  # fmt: skip


def fresh_counts() -> Counts:
    return {url: {"prefill": 0, "decode": 0} for url in URLS}


def policy(
    reports: LoadReports, counts: Counts | None = None, seed: int = 0, **weights: float
) -> LeastLoaded:
    return LeastLoaded(
        "decode",
        counts if counts is not None else fresh_counts(),
        random.Random(seed),
        reports,
        LeastLoadedSettings(max_report_age_s=2.0, **weights),
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_requests_waiting": -1}, "num_requests_waiting must be finite and at least 0"),
        ({"num_requests_running": float("nan")}, "num_requests_running must be finite"),
        ({"num_requests_running": float("inf")}, "num_requests_running must be finite"),
        ({"kv_cache_usage_perc": 1.01}, "kv_cache_usage_perc is a fraction 0..1"),
        ({"kv_cache_usage_perc": -0.1}, "kv_cache_usage_perc must be finite and at least 0"),
    ],
)
def test_engine_load_refuses_what_no_engine_reports(
    fields: dict[str, object], message: str
) -> None:
    values: dict[str, object] = {
        "num_requests_waiting": 0,
        "num_requests_running": 0,
        "kv_cache_usage_perc": 0.0,
        **fields,
    }
    with pytest.raises(ValueError, match=message):
        EngineLoad(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["3", None])
def test_engine_load_refuses_what_is_not_a_number(value: object) -> None:
    # (the compiled build refuses them on construction, with its own message)
    with pytest.raises(TypeError):
        EngineLoad(num_requests_waiting=value, num_requests_running=0, kv_cache_usage_perc=0)  # type: ignore[arg-type]


def test_engine_load_is_immutable_and_takes_gauge_floats() -> None:
    value = EngineLoad(num_requests_waiting=3.0, num_requests_running=2, kv_cache_usage_perc=1)
    with pytest.raises(AttributeError):
        value.num_requests_waiting = 1  # type: ignore[misc]
    assert value == load(3, 2, 1.0)


def test_a_report_counts_up_to_its_age_bound_exactly() -> None:
    reports = LoadReports(URLS)
    assert reports.fresh("http://e0", 0.0, 2.0) is None  # never reported: unknown
    reports.report("http://e0", load(1), 10.0)
    assert reports.fresh("http://e0", 12.0, 2.0) is not None  # exactly max_report_age_s old
    assert reports.fresh("http://e0", 12.0 + 1e-9, 2.0) is None  # older: unknown
    assert reports.latest("http://e0") is not None  # still held, for what it is


def test_an_older_report_never_replaces_a_newer_one() -> None:
    reports = LoadReports(URLS)
    reports.report("http://e0", load(5), 10.0)
    reports.report("http://e0", load(1), 9.0)  # answered out of order
    held = reports.latest("http://e0")
    assert held is not None and held.load == load(5) and held.at == 10.0
    reports.report("http://e0", load(2), 10.0)  # the same instant: the later call wins
    held = reports.latest("http://e0")
    assert held is not None and held.load == load(2)


def test_an_unknown_engine_cannot_report() -> None:
    with pytest.raises(KeyError, match="no engine 'http://nope' in the fleet"):
        LoadReports(URLS).report("http://nope", load(), 0.0)


def report_all(reports: LoadReports, now: float, *loads: EngineLoad) -> None:
    for url, value in zip(URLS, loads, strict=True):
        reports.report(url, value, now)


def test_the_lowest_weighted_score_wins() -> None:
    reports = LoadReports(URLS)
    report_all(reports, 0.0, load(2, 1, 0.0), load(0, 3, 0.0), load(1, 1, 0.5))
    assert policy(reports).choose(URLS, None, 0.0) == "http://e2"  # 2.5 against 3 and 3
    # the weights are the settings': running counts nothing, so e1 (0 waiting) wins
    assert policy(reports, running_weight=0).choose(URLS, None, 0.0) == "http://e1"
    # KV usage dominating: e0 and e1 (no KV used) tie on score; reservations break it
    counts = fresh_counts()
    counts["http://e0"]["decode"] = 1
    heavy = policy(reports, counts, waiting_weight=0, running_weight=0, kv_cache_weight=10)
    assert heavy.choose(URLS, None, 0.0) == "http://e1"


def test_equal_scores_go_to_least_reserved_among_them() -> None:
    reports = LoadReports(URLS)
    report_all(reports, 0.0, load(1), load(1), load(0, 2))  # scores 1, 1, 2
    counts = fresh_counts()
    picks = {policy(reports, counts, seed).choose(URLS, None, 0.0) for seed in range(30)}
    assert picks == {"http://e0", "http://e1"}  # a seeded tie-break between the two
    expected = least_reserved(URLS[:2], counts, "decode", random.Random(4))
    assert policy(reports, counts, seed=4).choose(URLS, None, 0.0) == expected


def test_unknown_load_of_any_candidate_means_least_reserved_over_all() -> None:
    reports = LoadReports(URLS)
    counts = fresh_counts()
    counts["http://e0"]["decode"] = 0
    counts["http://e1"]["decode"] = 2
    counts["http://e2"]["decode"] = 1
    report_all(reports, 0.0, load(9), load(0), load(1))
    p = policy(reports, counts)
    assert p.choose(URLS, None, 1.0) == "http://e1"  # by the reports
    # still fresh (2.0 s old exactly): e1 (its pick) and e2 tie at 1; e2 has fewer reservations
    assert p.choose(URLS, None, 2.0) == "http://e2"
    # 2.5 s after: every report is stale, so reservations decide: e0, although it reported 9
    assert p.choose(URLS, None, 2.5) == "http://e0"
    reports.report("http://e1", load(0), 2.5)
    reports.report("http://e2", load(0), 2.5)
    assert p.choose(URLS, None, 2.5) == "http://e0"  # e0's report is stale: still reservations
    # only among the candidates: a stale report of an engine that is not one does not matter
    assert p.choose(URLS[1:], None, 2.5) in ("http://e1", "http://e2")


def test_placements_since_a_report_count_as_waiting_requests() -> None:
    reports = LoadReports(URLS)
    report_all(reports, 0.0, load(0), load(1), load(3))
    p = policy(reports)
    picks = [p.choose(URLS, None, 0.0) for _ in range(5)]
    # e0 scores 0, 1, 2...; e1 1, 2...; e2 3: the picks spread instead of all going to e0
    assert picks.count("http://e0") == 3 and picks.count("http://e1") == 2
    assert p.placements_since_report("http://e0") == 3
    reports.report("http://e0", load(0), 1.0)  # the new report includes them: count anew
    assert p.placements_since_report("http://e0") == 0
    assert p.choose(URLS, None, 1.0) == "http://e0"


def test_a_placement_told_counts_like_a_chosen_one() -> None:
    reports = LoadReports(URLS)
    report_all(reports, 0.0, load(0), load(0), load(1))
    p = policy(reports)
    p.placed("http://e0", None, 0.0)  # a quarantine fallback placed a request there
    p.placed("http://e0", None, 0.0)
    assert p.placements_since_report("http://e0") == 2
    assert p.choose(URLS, None, 0.0) == "http://e1"
    p.placed("http://e1", None, 0.0)
    fresh = LeastLoaded(
        "decode", fresh_counts(), random.Random(0), LoadReports(URLS), LeastLoadedSettings()
    )
    fresh.placed("http://e0", None, 0.0)  # never reported: nothing to count against
    assert fresh.placements_since_report("http://e0") == 0
