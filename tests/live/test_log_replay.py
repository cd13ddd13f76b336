"""A live router's own request log, replayed in the simulator (``narwhal replay``).

The proof (docs/experiments.md, Replaying the router's own traffic): a live router in front of
three emulated engines (one producer, two consumers) serves a scripted run — consumer ``d1``
hangs for HANG_S (first-token timeouts: the router ejects it after EJECT_AFTER, probes it, and
readmits it once the hang is over), and while ``d1`` is out consumer ``d0`` stalls one stream
after two tokens (a silence after the commit). Its JSON request log, written as ``narwhal
serve`` writes it, goes through ``narwhal replay``; the scenario it writes, simulated, gives:
- the same number of requests, at the same arrival times;
- per HTTP status, a count within STATUS_TOLERANCE of the live one (the simulated fleet's
  timing is not the emulators', and which of two idle consumers takes a request is a seeded
  draw in each world, so a one-request fault on a consumer may miss in the other world);
- the same engines ejected.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from narwhal.cli import main
from narwhal.emulator.timing import LinearTiming
from narwhal.experiments.overrides import resolve
from narwhal.sim.replay import replay_scenario
from narwhal.sim.request_log import LogError, read_request_log
from narwhal.sim.runner import run
from narwhal.sim.scenario import load_scenario
from narwhal.sim.workload import WorkloadSettings, generate
from tests.live.conftest import HTTP, Emulator, RouterHandle

EJECT_AFTER = 2
HANG_S = 2.5
REQUESTS = 36
GAP_S = 0.05  # between one request's end and the next one's start
STATUS_TOLERANCE = 1  # requests, per status
# 2,117 bytes: one full 2,048-byte block shared
SYSTEM = "You are a careful assistant. " * 73
TIMING = LinearTiming(prefill_s_per_token=1e-5, decode_s_per_token=0.002, overhead_s=0.002)


def ask(handle: RouterHandle, number: int) -> int:
    body = {"prompt": f"{SYSTEM}question {number}", "max_tokens": 6, "stream": True}
    with HTTP.stream("POST", handle.url + "/v1/completions", json=body) as reply:
        reply.read()
        return reply.status_code


def live_run(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle], path: Path
) -> list[dict[str, object]]:
    """The scripted live run; its request log written to ``path``, its lines returned."""
    engine = {"timing": TIMING, "max_model_len": 4096}  # a prompt is about 2,130 tokens
    producer = emulator("prefill", **engine)
    d0, d1 = emulator("decode", **engine), emulator("decode", **engine)
    handle = router(
        [
            {"url": producer.url, "role": "prefill", "kv_endpoint": producer.side_channel},
            {"url": d0.url, "role": "decode"},
            {"url": d1.url, "role": "decode"},
        ],
        recovery={"eject_after": EJECT_AFTER, "max_attempts": 1},
    )
    stalled = False
    for number in range(REQUESTS):
        if number == 8:
            d1.faults({"kind": "hang", "seconds": HANG_S})
        if not stalled and handle.engine(d1.url)["state"] == "ejected":
            d0.faults({"kind": "stall", "after_tokens": 2, "count": 1})
            stalled = True
        ask(handle, number)
        time.sleep(GAP_S)
    outcomes = Counter(line.get("outcome") for line in handle.logged())
    assert stalled, f"d1 was never ejected; outcomes {dict(outcomes)}"
    handle.wait_for(lambda: handle.engine(d1.url)["state"] == "ready", timeout=10)
    ask(handle, REQUESTS)  # after the readmission
    path.write_bytes(b"".join(handle.request_lines))
    return handle.logged()


def test_a_live_run_replayed_gives_its_statuses_and_ejections(
    emulator: Callable[..., Emulator], router: Callable[..., RouterHandle], tmp_path: Path
) -> None:
    log_path = tmp_path / "requests.jsonl"
    lines = live_run(emulator, router, log_path)
    live = [line for line in lines if line["event"] == "request"]
    live_statuses = Counter(line["status"] for line in live)
    live_ejected = {line["engine"] for line in lines if line["event"] == "engine_ejected"}
    assert live_statuses[504] >= EJECT_AFTER + 1 and len(live_ejected) == 1, live_statuses

    out = tmp_path / "scenario.toml"
    assert main(["replay", str(log_path), "--out", str(out)]) == 0
    text = out.read_text()
    assert '[workload]\nkind = "log"' in text and "until the readmission" in text, text
    scenario = load_scenario(out)
    assert {f.kind for f in scenario.faults} == {"stall"}
    # the replayed traffic: the same arrivals; prompts sharing the system prompt's blocks
    arrivals = generate(scenario.workload, random.Random(0))
    assert len(arrivals) == len(live)
    wall = sorted(float(line["arrival"]) for line in live)  # type: ignore[arg-type]
    assert [round(a.t, 6) for a in arrivals] == [round(t - wall[0], 6) for t in wall]
    assert len({a.prefix[:1] for a in arrivals}) == 1 and len(arrivals[0].prefix) == 2

    result = run(scenario)
    sim_statuses = Counter(r.status for r in result.records)
    sim_ejected = {d["engine"] for d in result.decisions if d["kind"] == "eject"}
    print(f"live statuses {dict(live_statuses)}, simulated {dict(sim_statuses)}")
    assert len(result.records) == len(live)
    for status in set(live_statuses) | set(sim_statuses):
        assert abs(live_statuses[status] - sim_statuses[status]) <= STATUS_TOLERANCE, status
    assert sim_ejected == live_ejected


def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


REQUEST = {
    "event": "request",
    "request_id": "r1",
    "arrival": 1_700_000_000.0,
    "status": 200,
    "outcome": "ok",
    "committed": True,
    "ttft_s": 0.01,
    "finished_s": 0.1,
    "attempts": 1,
    "engines": ["http://p", "http://d"],
    "output_tokens": 4,
    "prompt_tokens": 12,
}


@pytest.mark.parametrize(
    ("lines", "blamed"),
    [
        (["not json"], "line 1: not a JSON line"),
        ([json.dumps(REQUEST), "[1, 2]"], 'line 2: not a log line (a JSON object with an "event")'),
        ([json.dumps({**REQUEST, "status": "200"})], "line 1: 'status' must be a non-negative"),
        (
            [json.dumps({k: v for k, v in REQUEST.items() if k != "arrival"})],
            "line 1: the 'request' line has no 'arrival'",
        ),
        (
            [json.dumps({"event": "engine_ejected", "time": 1.0})],
            "line 1: the 'engine_ejected' line has no 'engine'",
        ),
        ([json.dumps({"event": "router", "time": 1.0, "engines": [1]})], "line 1: 'engines'"),
        (["", json.dumps({"event": "role_panic", "time": 1.0})], "no request lines"),
    ],
)
def test_a_malformed_log_is_refused_with_its_line_and_problem(
    tmp_path: Path, lines: list[str], blamed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_lines(tmp_path / "bad.jsonl", *lines)
    with pytest.raises(LogError) as caught:
        read_request_log(path)
    assert blamed in str(caught.value) and str(path) in str(caught.value)
    assert main(["replay", str(path)]) == 2
    assert blamed in capsys.readouterr().err


def test_an_engine_the_router_never_readmitted_stays_faulty_to_the_end(tmp_path: Path) -> None:
    """Derived from the log alone: a consumer that failed twice, was ejected and never came
    back is faulty from its first failure to the log's end; the fleet's roles are inferred
    from where each engine stood in the requests (no router line)."""
    t = REQUEST["arrival"]
    assert isinstance(t, float)
    requests = [
        {**REQUEST, "request_id": f"r{i}", "arrival": t + i, "engines": ["http://p", d]}
        for i, d in enumerate(["http://d0", "http://d1", "http://d1", "http://d0"])
    ]
    for failed in requests[1:3]:
        failed.update(status=504, outcome="first_token_timeout", output_tokens=0)
    ejected = {"event": "engine_ejected", "time": t + 2.5, "engine": "http://d1"}
    retried = {"event": "attempt_failed", "time": t + 3.2, "engine": "http://d0"}
    retried |= {"fault": "engine_5xx", "request": "r3"}
    path = write_lines(tmp_path / "log.jsonl", *(json.dumps(r) for r in requests))
    with path.open("a") as log:
        log.write(json.dumps({**ejected, "reason": "first_token_timeout", "streak": 2}) + "\n")
        log.write(json.dumps(retried) + "\n")
        log.write(json.dumps({"event": "role_panic", "time": t + 3.3, "engine": ""}) + "\n")
    replay = replay_scenario(path)
    assert replay.roles == {"http://p": "prefill", "http://d0": "decode", "http://d1": "decode"}
    assert "# lines not used: role_panic x 1" in replay.text
    # the retried attempt: an HTTP 5xx on d0 from its request's arrival
    window, retry = replay.history.windows
    assert (retry.engine, retry.kind, retry.start, retry.lines) == (
        "http://d0",
        "http_5xx",
        2.99,
        (6, 6),
    )
    assert (window.engine, window.kind, window.probability) == ("http://d1", "stall", 1.0)
    assert window.start == pytest.approx(1.0 + 0.01 - 0.01)
    assert window.end == pytest.approx(3.2 + 0.01)  # the last line used: the retried attempt
    assert window.until.startswith("end of log")
    assert replay.history.ejected == ["http://d1"]


def test_a_log_workload_needs_its_log_and_only_it_takes_one() -> None:
    with pytest.raises(ValueError, match="needs 'log'"):
        WorkloadSettings(kind="log")
    with pytest.raises(ValueError, match="'log' is only for kind"):
        WorkloadSettings(kind="poisson", log="requests.jsonl", max_requests=3)
    with pytest.raises(ValueError, match='rate: not used by kind = "log"'):
        WorkloadSettings(kind="log", log="requests.jsonl", rate=10.0)
    with pytest.raises(ValueError, match="no rate to scale"):
        resolve({"workload": {"kind": "log", "log": "requests.jsonl", "rate_multiplier": 2.0}})
