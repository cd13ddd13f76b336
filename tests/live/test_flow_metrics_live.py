"""Per fairness flow metrics over real HTTP, the real router in front of emulators: the label
set of ``narwhal_flow_fairness_*`` stays bounded under many flows (the heaviest flows by name,
every other one as ``other``), and /status reports the same counts."""

from __future__ import annotations

import re
from collections.abc import Callable

import httpx

from narwhal.core.flow import REASONS
from tests.live.conftest import Emulator, RouterHandle, metric_value
from tests.live.test_flow_live import MODEL

FAIRNESS = "x-gateway-inference-fairness-id"


def test_per_flow_metric_labels_stay_bounded_under_many_flows(
    router: Callable[..., RouterHandle], emulator: Callable[..., Emulator]
) -> None:
    producer, consumer = emulator("prefill"), emulator("decode")
    handle = router(
        [
            {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
            {"url": consumer.url, "role": "decode"},
        ],
        flow={"enabled": True, "max_flow_labels": 2, "flow_label_min_requests": 3},
    )
    sent: list[str] = ["team-a"] * 5 + ["team-b"] * 4 + ["team-c"] * 3
    sent += [f"one-off-{i}" for i in range(60)]  # a crowd of flows that never earn a label
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1}
    with httpx.Client(timeout=10) as client:
        for flow in sent:
            reply = client.post(handle.url + "/v1/completions", json=body, headers={FAIRNESS: flow})
            assert reply.status_code == 200, reply.text
        reply = client.post(handle.url + "/v1/completions", json=body)  # names no flow
        assert reply.status_code == 200
    metrics = handle.metrics()
    labels = set(re.findall(r'narwhal_flow_fairness_dispatched_total\{flow="([^"]*)"\}', metrics))
    assert labels == {"team-a", "team-b", "other", "-"}  # max_flow_labels = 2, plus the two
    # a flow's requests before it earned its label (flow_label_min_requests) count as "other"
    expected = {"team-a": 5 - 2, "team-b": 4 - 2, "other": 2 + 2 + 3 + 60, "-": 1}
    for flow, count in expected.items():
        assert metric_value(metrics, "narwhal_flow_fairness_dispatched_total", flow=flow) == count
        assert metric_value(metrics, "narwhal_flow_fairness_queue_length", flow=flow) == 0
        for reason in REASONS:
            assert (
                metric_value(
                    metrics, "narwhal_flow_fairness_refused_total", flow=flow, reason=reason
                )
                == 0
            )
    refused_series = re.findall(r"^narwhal_flow_fairness_refused_total\{", metrics, re.M)
    assert len(refused_series) == len(expected) * len(REASONS)
    status = handle.status()["flow_fairness"]
    assert {flow: status[flow]["dispatched"] for flow in status} == expected
