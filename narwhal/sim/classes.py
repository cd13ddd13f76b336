"""Workload classes' results: per class request counts, success, SLO attainment, shedding and
first-byte percentiles.

Rule kept here: a class is judged by its own objective (its ``slo_ttft_s``, else
``[sim] slo_ttft_s``; TPOT by ``[sim] slo_tpot_s``), the same test the run's own attainment
applies; a request flow control refused (outcome ``shed``) counts as shed, never as on time.

Theory of operation: :class:`ClassStats` takes the rows as they are made (held in memory by a
plain run, streamed by a streamed one) and keeps per class the counters and the first-byte
times of its succeeded requests (one float each: the percentiles are exact).
"""

from __future__ import annotations

from typing import Any

from narwhal.sim.workload import WorkloadClass


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    pos = (len(values) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(values) - 1)
    return round(values[low] + (values[high] - values[low]) * (pos - low), 6)


class ClassStats:
    """Per-class counters over a run's rows (rows carry a ``class`` field)."""

    def __init__(
        self, classes: tuple[WorkloadClass, ...], slo_ttft_s: float, slo_tpot_s: float
    ) -> None:
        self._slo = {c.name: c.slo_ttft_s or slo_ttft_s for c in classes}
        self._tpot = slo_tpot_s
        self._counts = {
            c.name: {"requests": 0, "succeeded": 0, "on_time": 0, "shed": 0} for c in classes
        }
        self._first: dict[str, list[float]] = {c.name: [] for c in classes}

    def add(self, row: dict[str, Any]) -> None:
        name = row["class"]
        counts = self._counts[name]
        counts["requests"] += 1
        if row["outcome"] == "shed":
            counts["shed"] += 1
        if row["status"] != 200:
            return
        counts["succeeded"] += 1
        first, tpot = row["first_byte_s"], row["tpot_s"]
        if first is not None:
            self._first[name].append(first)
            if first <= self._slo[name] and (tpot is None or tpot <= self._tpot):
                counts["on_time"] += 1

    def summary(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for name, counts in self._counts.items():
            n = counts["requests"]
            first = sorted(self._first[name])
            out[name] = {
                "requests": n,
                "success_pct": round(100.0 * counts["succeeded"] / n, 3) if n else 0.0,
                "slo_attainment_pct": round(100.0 * counts["on_time"] / n, 3) if n else 0.0,
                "slo_ttft_s": self._slo[name],
                "shed": counts["shed"],
                "first_byte_s": {
                    q: _percentile(first, v) for q, v in (("p50", 50), ("p90", 90), ("p99", 99))
                },
            }
        return out


def class_lines(classes: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """The printed summary's line per class."""
    lines = []
    for name, c in classes.items():
        p90 = c["first_byte_s"]["p90"]
        shown = "-" if p90 is None else f"{p90 * 1e3:.1f} ms"
        lines.append(
            (
                f"class {name}",
                f"{c['requests']} requests, {c['success_pct']:.2f}% ok, SLO "
                f"{c['slo_attainment_pct']:.2f}% (TTFT <= {c['slo_ttft_s']:g} s), shed "
                f"{c['shed']}, TTFT p90 {shown}",
            )
        )
    return lines
