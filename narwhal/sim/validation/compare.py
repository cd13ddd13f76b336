"""How far a simulated run is from the real one, per metric: summary errors and two tests.

Rule kept here: a metric (TTFT, TPOT, end-to-end latency) is compared as distributions over the
run's requests. Its mean, p50, p90 and p99 (linear-interpolated quantiles) are given real and
simulated with the simulated one's error in percent of the real; a two-sample Kolmogorov-Smirnov
test says whether the two distributions differ (``ks_d``, ``ks_p``; scipy's exact or asymptotic
method as it picks); a TOST (two one-sided Welch t-tests) says whether the means are equivalent
within +-10% of the real mean (``tost_p``: small means equivalent). A run published as means only
is compared on its means (:func:`compare_means`), beside other simulators' published figures.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy import stats

EQUIVALENCE_MARGIN = 0.10  # TOST: +-10% of the real mean
STATS = ("mean", "p50", "p90", "p99")


def summary_ms(seconds: list[float]) -> dict[str, float]:
    values = np.asarray(seconds, dtype=float) * 1e3
    return {
        "mean": float(values.mean()),
        "p50": float(np.percentile(values, 50)),
        "p90": float(np.percentile(values, 90)),
        "p99": float(np.percentile(values, 99)),
    }


def tost_p(real: np.ndarray, sim: np.ndarray, margin: float = EQUIVALENCE_MARGIN) -> float:
    """p-value of the TOST for |mean(sim) - mean(real)| < margin x mean(real) (Welch)."""
    delta = margin * float(real.mean())
    lower = stats.ttest_ind(sim + delta, real, equal_var=False, alternative="greater").pvalue
    upper = stats.ttest_ind(sim - delta, real, equal_var=False, alternative="less").pvalue
    return float(max(lower, upper))


def compare(real: list[float], sim: list[float]) -> dict[str, Any]:
    """One metric's entry of ``validation.json`` (values in seconds in, milliseconds out)."""
    if len(real) < 2 or len(sim) < 2:
        raise ValueError("a metric needs at least two requests on each side to compare")
    r, s = summary_ms(real), summary_ms(sim)
    ks = stats.ks_2samp(np.asarray(real), np.asarray(sim))
    return {
        "real": r,
        "sim": s,
        "error_pct": {k: 100.0 * (s[k] - r[k]) / r[k] if r[k] else 0.0 for k in STATS},
        "ks_d": float(ks.statistic),
        "ks_p": float(ks.pvalue),
        "tost_p": tost_p(np.asarray(real) * 1e3, np.asarray(sim) * 1e3),
    }


def sim_throughput(arrivals_s: list[float], latencies_s: list[float], outputs: list[int]) -> float:
    """Output tokens per second over the whole run, first arrival to last finish (as a
    benchmark client times its run)."""
    span = max(a + t for a, t in zip(arrivals_s, latencies_s, strict=True)) - min(arrivals_s)
    return sum(outputs) / span


def _error_pct(sim: float, real: float) -> float:
    return 100.0 * (sim - real) / real


def compare_means(
    real: dict[str, float],
    sim: dict[str, float],
    anchors: dict[str, dict[str, float]],
    ranges: dict[str, tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """A means-only run's ``validation.json``: per metric the real figure, the simulated one and
    the error; per anchor (another simulator's published figure) its figure and error. A real
    figure the source only brackets (``ranges``) also has its bracket, ``real.low`` and
    ``real.high``, and the error against each end (``error_pct.low`` against the low end: the
    largest error the bracket allows; ``error_pct.high`` against the high end: the smallest)."""
    ranges = ranges or {}
    out: dict[str, Any] = {}
    for metric, value in real.items():
        entry: dict[str, Any] = {
            "real": {"mean": value},
            "sim": {"mean": sim[metric]},
            "error_pct": {"mean": _error_pct(sim[metric], value)},
        }
        if metric in ranges:
            low, high = ranges[metric]
            entry["real"].update(low=low, high=high)
            entry["error_pct"].update(
                low=_error_pct(sim[metric], low), high=_error_pct(sim[metric], high)
            )
        out[metric] = entry
    out["anchors"] = {
        name: {
            metric: {"mean": figure, "error_pct": _error_pct(figure, real[metric])}
            for metric, figure in figures.items()
            if metric in real
        }
        for name, figures in anchors.items()
    }
    return out
