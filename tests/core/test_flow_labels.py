"""Fairness flows as metric labels (narwhal.core.flow_labels): the set stays bounded whatever
clients name, the heaviest flows get their own label even behind a crowd of one-off flows, a
label once given never changes, and per-label counts add up to flow control's per-band ones."""

from __future__ import annotations

import random

from narwhal.core.flow import FlowKey
from narwhal.core.flow_labels import OTHER, TRACKED_PER_LABEL, UNNAMED, FlowLabels
from narwhal.core.policies import Policies
from tests.core.test_flow import config, run


def test_labels_stay_bounded_and_go_to_the_heaviest_flows() -> None:
    labels = FlowLabels(max_labels=4, min_requests=10)
    rng = random.Random(7)
    heavy = [f"tenant-{i}" for i in range(3)]
    given: dict[str, str] = {}
    for step in range(50_000):
        # 60% of the traffic from 3 heavy flows, the rest from 20,000 distinct one-off flows
        flow = rng.choice(heavy) if rng.random() < 0.6 else f"crowd-{step}"
        label = labels.label(flow)
        assert given.get(flow) in (None, OTHER, label)  # only ever promoted from "other"
        given[flow] = label
        assert len(labels._counts) <= 4 * TRACKED_PER_LABEL
    distinct = set(given.values())
    assert set(heavy) <= distinct  # every heavy flow has its own label
    assert len(distinct - {OTHER}) <= 4 and OTHER in distinct
    for flow in heavy:  # and keeps it
        assert labels.label(flow) == flow


def test_a_label_once_given_is_kept_and_unnamed_or_other_flows_never_get_one() -> None:
    labels = FlowLabels(max_labels=1, min_requests=2)
    assert [labels.label("a") for _ in range(3)] == [OTHER, "a", "a"]
    assert [labels.label("b") for _ in range(5)] == [OTHER] * 5  # the one label is taken
    assert {labels.label(flow) for flow in ("", "-", "other") for _ in range(5)} == {
        UNNAMED,
        OTHER,
    }
    assert labels.labelled("a") == "a" and labels.labelled("b") == OTHER


def test_per_flow_counts_add_up_to_the_bands() -> None:
    policies = Policies(
        config(max_queue_per_band=3, queue_ttl_s=0.5, max_flow_labels=1, flow_label_min_requests=2),
        seed=1,
    )
    arrivals = [
        (0.01 * i, f"r{i}", FlowKey(0, "big" if i % 2 else f"small-{i}")) for i in range(12)
    ]
    run(policies, arrivals, work_s=1.0)
    flow = policies.flow
    bands = flow.snapshot()["0"]
    flows = flow.flow_snapshot()
    assert set(flows) == {"big", OTHER}
    for field in ("queued", "dispatched"):
        assert sum(f[field] for f in flows.values()) == bands[field]
    for reason, count in bands["refused"].items():
        assert sum(f["refused"][reason] for f in flows.values()) == count
    assert bands["refused"]["queue_full"] > 0 and bands["refused"]["queue_ttl"] > 0
    assert all(f["queue_length"] == 0 for f in flows.values())
