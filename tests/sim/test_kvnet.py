"""KV transfers share a link's bandwidth (processor sharing) after a setup latency."""

from __future__ import annotations

import simpy

from narwhal.sim.kvnet import KvNetwork


def test_two_flows_share_the_link() -> None:
    env = simpy.Environment()
    net = KvNetwork(env, bandwidth_gbps=10.0, setup_s=0.001)
    done: list[tuple[str, float, bool]] = []
    net.transfer("p", "c", 1e9, lambda ok: done.append(("a", env.now, ok)))
    net.transfer("p", "c", 1e9, lambda ok: done.append(("b", env.now, ok)))
    net.transfer("p", "other", 1e9, lambda ok: done.append(("c", env.now, ok)))
    env.run()
    times = {name: t for name, t, _ in done}
    assert abs(times["a"] - 0.201) < 1e-6 and abs(times["b"] - 0.201) < 1e-6  # 2 GB at 10 GB/s
    assert abs(times["c"] - 0.101) < 1e-6  # its own consumer link
    assert all(ok for _, _, ok in done)


def test_failed_flow_reports_failure_and_shared_topology() -> None:
    env = simpy.Environment()
    net = KvNetwork(env, bandwidth_gbps=1.0, setup_s=0.0, topology="shared")
    done: list[bool] = []
    net.transfer("p", "c1", 1e6, done.append, fail=True)
    net.transfer("p", "c2", 1e6, done.append)
    env.run()
    assert sorted(done) == [False, True]
    assert abs(env.now - 0.002) < 1e-9
