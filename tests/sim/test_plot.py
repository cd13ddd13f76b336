"""The simulate plot's fault labels: one per cluster of windows, so labels never overprint."""

from __future__ import annotations

from narwhal.sim.faults import FaultWindow
from narwhal.sim.plot import _labels


def _window(kind: str, start: float) -> FaultWindow:
    return FaultWindow(url="http://sim-d0", kind=kind, start=start, end=start + 5.0)


def test_windows_starting_close_together_share_one_label() -> None:
    windows = [_window("stall", 10.0), _window("slow", 11.0), _window("stall", 11.3),
               _window("hang", 14.0)]  # fmt: skip
    assert _labels(windows, gap_s=2.0) == [(10.0, "stall, slow"), (14.0, "hang")]
    assert _labels(windows, gap_s=0.5) == [(10.0, "stall"), (11.0, "slow, stall"), (14.0, "hang")]
    assert _labels([], gap_s=1.0) == []
