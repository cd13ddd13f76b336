"""Tensor parallelism: the all-reduce term of the step model and per-rank KV pulls."""

from __future__ import annotations

import pytest
import simpy

from narwhal.sim.kvnet import KvNetwork
from narwhal.sim.model_shape import model_shape
from narwhal.sim.scenario import FleetSettings
from narwhal.sim.tensor_parallel import TensorParallelStep, allreduce_s, with_allreduce
from narwhal.sim.timing import step_model


def test_ring_allreduce_on_known_numbers() -> None:
    # 1 GB over 4 ranks at 100 GB/s: 2 x 3/4 x 1 GB / 100 GB/s = 15 ms, plus 10 us
    assert allreduce_s(1e9, 4, 100.0, 1e-5) == pytest.approx(0.015 + 1e-5, rel=1e-12)
    assert allreduce_s(1e9, 2, 100.0, 0.0) == pytest.approx(0.010, rel=1e-12)
    assert allreduce_s(1e9, 1, 100.0, 1e-5) == 0.0


def test_tp1_adds_nothing() -> None:
    shard = step_model("llama3-8b")
    assert with_allreduce(shard, model_shape("llama3-8b"), 360.0, 8e-6) is shard
    assert FleetSettings(prefill=1, decode=1).step_timing() is shard


def test_tp4_step_adds_two_allreduces_per_layer() -> None:
    shard = step_model("llama3-70b-tp4")
    timing = FleetSettings(prefill=1, decode=1, model="llama3-70b-tp4").step_timing()
    assert isinstance(timing, TensorParallelStep) and timing.shard is shard
    # 64 decodes: 160 all-reduces of 64 x 8192 x 2 bytes each, at 360 GB/s and 8 us
    per_call = 8e-6 + 2 * 3 / 4 * (64 * 8192 * 2) / 360e9
    added = timing.batch_s(64, 0, 64 * 1000, 0.0) - shard.batch_s(64, 0, 64 * 1000, 0.0)
    assert added == pytest.approx(160 * per_call, rel=1e-9)
    # a 2048-token prefill chunk: the same per token, so 32x the transfer part
    big = timing.batch_s(0, 2048, 0, 2048 * 1024.0) - shard.batch_s(0, 2048, 0, 2048 * 1024.0)
    assert big == pytest.approx(160 * (8e-6 + 2 * 3 / 4 * (2048 * 8192 * 2) / 360e9), rel=1e-9)
    assert timing.kv_bytes_per_token == shard.kv_bytes_per_token


def test_allreduce_parameters_are_the_scenarios() -> None:
    slow = FleetSettings(
        prefill=1,
        decode=1,
        model="llama3-70b-tp4",
        tp_allreduce_gbps=36.0,
        tp_allreduce_latency_us=0.0,
    ).step_timing()
    assert isinstance(slow, TensorParallelStep)
    assert slow.fixed_s == 0.0
    assert slow.per_token_s == pytest.approx(160 * 1.5 * 8192 * 2 / 36e9, rel=1e-12)
    with pytest.raises(ValueError, match="tp_allreduce_gbps"):
        FleetSettings(prefill=1, decode=1, timing="linear", tp_allreduce_gbps=100.0)


def test_allreduce_can_be_left_out() -> None:
    # tp_allreduce = false: the one-shard step the profile measured, whatever the TP
    shard = step_model("llama3-70b-tp4")
    off = FleetSettings(prefill=1, decode=1, model="llama3-70b-tp4", tp_allreduce=False)
    assert off.step_timing() is shard
    with pytest.raises(ValueError, match="tp_allreduce"):
        FleetSettings(prefill=1, decode=1, timing="linear", tp_allreduce=False)


def test_rank_links_at_a_quarter_bandwidth_match_one_link() -> None:
    # what experiments/capacity-old-model.toml relies on: 4 ranks at b/4 GB/s each take, for
    # every mix of concurrent pulls, the time of one link at b GB/s (each rank link carries the
    # same quarter of every transfer)
    def finish_times(ranks: int, gbps: float) -> list[float]:
        env = simpy.Environment()
        net = KvNetwork(env, bandwidth_gbps=gbps, setup_s=0.001, ranks=ranks)
        times: list[float] = []

        def start(nbytes: float, delay: float) -> None:
            timer = env.timeout(delay)
            timer.callbacks.append(
                lambda _e: net.transfer("p", "c", nbytes, lambda ok: times.append(env.now))
            )

        for nbytes, delay in ((4e9, 0.0), (1e9, 0.02), (2e9, 0.05)):
            start(nbytes, delay)
        env.run()
        return times

    assert finish_times(4, 10.0) == pytest.approx(finish_times(1, 40.0), abs=1e-9)


def test_each_rank_pulls_its_shard_on_its_own_link() -> None:
    env = simpy.Environment()
    net = KvNetwork(env, bandwidth_gbps=10.0, setup_s=0.001, ranks=4)
    done: list[tuple[str, float, bool]] = []
    net.transfer("p", "c", 4e9, lambda ok: done.append(("a", env.now, ok)))
    env.run()
    # four flows of 1 GB, each at 10 GB/s on its own link: 0.1 s after the setup, reported once
    assert done == [("a", pytest.approx(0.101, abs=1e-9), True)]
    assert sorted(net.links) == ["c#r0", "c#r1", "c#r2", "c#r3"]


def test_sharded_pulls_share_rank_links_and_fail_once() -> None:
    env = simpy.Environment()
    net = KvNetwork(env, bandwidth_gbps=10.0, setup_s=0.0, ranks=2)
    done: list[tuple[str, float, bool]] = []
    net.transfer("p", "c", 2e9, lambda ok: done.append(("a", env.now, ok)))
    net.transfer("p", "c", 2e9, lambda ok: done.append(("b", env.now, ok)), fail=True)
    env.run()
    # each rank link carries two 1 GB flows: 0.2 s for both; the failed one reports once
    assert [(n, ok) for n, _, ok in done] == [("a", True), ("b", False)]
    assert all(t == pytest.approx(0.2, abs=1e-9) for _, t, _ in done)
