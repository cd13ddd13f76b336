"""Statistics of a sweep: is a cell better than the baseline, with what confidence, and how many
replicates would tell.

Rule kept here: a cell is named better than the baseline only when the confidence interval of
its difference from the baseline on the primary metric lies wholly on the better side, and no
guard metric's interval lies wholly on the worse side. Intervals are simultaneous over every
cell compared (Bonferroni: each is drawn at ``1 - (1 - confidence) / m`` for ``m`` cells), so
"95%" holds for the whole grid, not for each cell alone; twelve cells of noise do not produce a
winner one time in two.

Theory of operation. With common random numbers (``seed_by = "replicate"``: replicate *k* of
every cell faces the same arrivals and fault history) replicate *k* of a cell is paired with
replicate *k* of the baseline and the interval is Student's t on the per-replicate differences
(mean ± t · sd / √n). Without pairing (``seed_by = "point"``) it is Welch's t on the two
samples. A difference seen in every replicate alike (sd 0) is resolved at any n ≥ 2. How many
replicates would resolve an observed difference is the usual power calculation: the smallest n
with t(1 - a/2, n - 1) + t(power, n - 1) ≤ |d| · √n / sd for the observed mean difference d,
spread sd and a = 1 - the per-cell confidence (power 0.8). Pure functions of numbers; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scipy import stats as scipy_stats

POWER = 0.8
MAX_REPLICATES = 1_000_000  # beyond this a difference is called unresolvable


@dataclass(frozen=True)
class Interval:
    """An estimate with its interval (``low`` = ``high`` = ``mean`` when the spread is 0; NaN
    bounds when fewer than two values)."""

    mean: float
    low: float
    high: float
    n: int
    sd: float  # spread of the differences (paired) or the pooled spread (unpaired)
    confidence: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2.0


@dataclass(frozen=True)
class Metric:
    """A metric compared between cells and which way is better."""

    name: str
    higher_is_better: bool = True

    def gain(self, difference: float) -> float:
        """``difference`` (cell - baseline) signed so that positive is better."""
        return difference if self.higher_is_better else -difference


@dataclass(frozen=True)
class Comparison:
    """One cell against the baseline: an interval per metric and the verdicts."""

    cell: int
    intervals: dict[str, Interval]
    better: bool  # primary interval wholly on the better side
    worse_on: tuple[str, ...]  # guards whose interval is wholly on the worse side


@dataclass(frozen=True)
class Decision:
    """The recommendation: a cell, or none and why."""

    recommended: int | None
    reason: str
    confidence: float  # the stated (family-wise) confidence
    per_cell_confidence: float  # each interval's level after Bonferroni
    replicates: int
    replicates_needed: int | None  # to resolve the largest observed gain; None: cannot say
    comparisons: list[Comparison] = field(default_factory=list)


def _clean(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def _sd(values: list[float]) -> float:
    if len(values) < 2:
        return math.nan
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def mean_interval(values: Sequence[float | None], confidence: float) -> Interval:
    """Student's t interval of the mean of ``values`` (None and NaN skipped)."""
    xs = _clean(values)
    n = len(xs)
    mean = sum(xs) / n if xs else math.nan
    sd = _sd(xs)
    if n < 2:
        return Interval(mean, math.nan, math.nan, n, sd, confidence)
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2.0, n - 1)) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, sd, confidence)


def paired_interval(
    cell: Sequence[float | None], baseline: Sequence[float | None], confidence: float
) -> Interval:
    """t interval of the mean of ``cell[k] - baseline[k]`` (pairs with a missing side skipped)."""
    diffs = [
        float(c) - float(b)
        for c, b in zip(cell, baseline, strict=True)
        if c is not None and b is not None
    ]
    return mean_interval(diffs, confidence)


def welch_interval(
    cell: Sequence[float | None], baseline: Sequence[float | None], confidence: float
) -> Interval:
    """Welch's t interval of ``mean(cell) - mean(baseline)`` (unpaired samples)."""
    a, b = _clean(cell), _clean(baseline)
    if not a or not b:
        return Interval(math.nan, math.nan, math.nan, 0, math.nan, confidence)
    mean = sum(a) / len(a) - sum(b) / len(b)
    n = min(len(a), len(b))
    if len(a) < 2 or len(b) < 2:
        return Interval(mean, math.nan, math.nan, n, math.nan, confidence)
    va, vb = _sd(a) ** 2 / len(a), _sd(b) ** 2 / len(b)
    se = math.sqrt(va + vb)
    pooled = math.sqrt(_sd(a) ** 2 + _sd(b) ** 2)
    if se == 0.0:
        return Interval(mean, mean, mean, n, 0.0, confidence)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = float(scipy_stats.t.ppf(0.5 + confidence / 2.0, dof)) * se
    return Interval(mean, mean - half, mean + half, n, pooled, confidence)


def replicates_needed(
    difference: float, sd: float, confidence: float, power: float = POWER
) -> int | None:
    """The smallest number of replicates at which a paired t interval at ``confidence`` would
    exclude zero with probability ``power``, were the true difference ``difference`` and the
    spread ``sd``; None when there is no difference to resolve (or it needs more than
    :data:`MAX_REPLICATES`)."""
    if math.isnan(difference) or math.isnan(sd) or difference == 0.0:
        return None
    if sd == 0.0:
        return 2
    effect = abs(difference) / sd

    def enough(n: int) -> bool:
        needed = scipy_stats.t.ppf(0.5 + confidence / 2.0, n - 1) + scipy_stats.t.ppf(power, n - 1)
        return bool(needed <= effect * math.sqrt(n))

    high = 2
    while not enough(high):
        high *= 2
        if high > MAX_REPLICATES:
            return None
    low = max(2, high // 2)
    while low < high:  # the smallest n that is enough, between low and high
        mid = (low + high) // 2
        if enough(mid):
            high = mid
        else:
            low = mid + 1
    return high


def _fmt(value: float) -> str:
    return f"{value:+.4g}"


def compare(
    cells: Sequence[Mapping[str, Sequence[float | None]]],
    baseline: int,
    metrics: Sequence[Metric],
    per_cell_confidence: float,
    *,
    paired: bool = True,
) -> list[Comparison]:
    """Every cell but the baseline against it: an interval per metric, ``metrics[0]`` primary."""
    primary, guards = metrics[0], metrics[1:]
    interval = paired_interval if paired else welch_interval
    out = []
    for index, cell in enumerate(cells):
        if index == baseline:
            continue
        intervals = {
            m.name: interval(cell[m.name], cells[baseline][m.name], per_cell_confidence)
            for m in metrics
        }
        main = intervals[primary.name]
        better = (
            not math.isnan(main.low) and min(primary.gain(main.low), primary.gain(main.high)) > 0
        )
        worse = []
        for guard in guards:
            g = intervals[guard.name]
            mine, theirs = cell[guard.name], cells[baseline][guard.name]
            lost = any(c is None and b is not None for c, b in zip(mine, theirs, strict=True))
            if lost or (not math.isnan(g.low) and max(guard.gain(g.low), guard.gain(g.high)) < 0):
                worse.append(guard.name)
        out.append(Comparison(index, intervals, better, tuple(worse)))
    return out


def decide(
    cells: Sequence[Mapping[str, Sequence[float | None]]],
    baseline: int,
    metrics: Sequence[Metric],
    *,
    labels: Sequence[str],
    confidence: float = 0.95,
    paired: bool = True,
) -> Decision:
    """Recommend the cell with the largest gain on ``metrics[0]`` among those better than the
    ``baseline`` cell and not worse on any other metric (see the module's rule); ``cells[i]``
    maps each metric's name to its per-replicate values (replicate order, for pairing)."""
    primary = metrics[0]
    others = len(cells) - 1
    replicates = min((len(_clean(c[primary.name])) for c in cells), default=0)
    level = 1.0 - (1.0 - confidence) / max(1, others)
    how = "paired t" if paired else "Welch t"
    family = f"{confidence:.0%} simultaneous ({how}, Bonferroni over {others} cells)"
    if others == 0:
        return Decision(
            None, "the sweep has no cell besides the baseline", confidence, level, replicates, None
        )
    if replicates < 2:
        return Decision(
            None,
            f"no setting is distinguishable from the baseline at {replicates} replicate(s): an "
            "interval needs at least 2",
            confidence,
            level,
            replicates,
            None,
        )
    comparisons = compare(cells, baseline, metrics, level, paired=paired)
    chosen = [c for c in comparisons if c.better and not c.worse_on]
    if chosen:
        best = max(chosen, key=lambda c: (primary.gain(c.intervals[primary.name].mean), -c.cell))
        main = best.intervals[primary.name]
        guards = ", ".join(m.name for m in metrics[1:]) or "no guard"
        reason = (
            f"{labels[best.cell]} beats the baseline ({labels[baseline]}) on {primary.name} by "
            f"{_fmt(main.mean)} ({family} interval {_fmt(main.low)} to {_fmt(main.high)}, "
            f"{replicates} replicates) and is not worse on {guards}"
        )
        return Decision(best.cell, reason, confidence, level, replicates, None, comparisons)
    gains = [c for c in comparisons if not math.isnan(c.intervals[primary.name].mean)]
    top = max(
        gains, key=lambda c: (primary.gain(c.intervals[primary.name].mean), -c.cell), default=None
    )
    parts = [f"no setting is distinguishable from the baseline at {replicates} replicates"]
    needed: int | None = None
    blocked = [c for c in comparisons if c.better and c.worse_on]
    for c in blocked:
        parts.append(
            f"{labels[c.cell]} is better on {primary.name} but worse on {', '.join(c.worse_on)}"
        )
    if top is None or primary.gain(top.intervals[primary.name].mean) <= 0:
        parts.append(f"no cell is better than the baseline on {primary.name} on average")
    else:
        main = top.intervals[primary.name]
        needed = replicates_needed(main.mean, main.sd, level)
        resolve = (
            f"about {needed} replicates would resolve it (power {POWER:g})"
            if needed is not None
            else "no practical number of replicates would resolve it"
        )
        parts.append(
            f"the largest observed gain on {primary.name} is {labels[top.cell]}'s "
            f"{_fmt(main.mean)} ({family} interval {_fmt(main.low)} to {_fmt(main.high)}); "
            + resolve
        )
    return Decision(None, "; ".join(parts), confidence, level, replicates, needed, comparisons)
