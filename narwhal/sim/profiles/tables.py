"""Interpolation over measured operator tables: what a profile says between its grid points.

Rule kept here: a measured table is the model. Between two measured sizes the time is linear in
the size; past the last one it continues the last segment's slope (GEMMs and attention grow
linearly once the GPU is saturated), never below the last measured time; below the first it is
the first time (launch-bound kernels do not get faster with fewer tokens).

Theory of operation: :class:`Curve` is one operator's time against one size (tokens or
sequences), kept as two sorted tuples and searched with :func:`bisect`. :class:`AttentionGrid`
is the attention table over (prefill chunk tokens, their cached context, decode sequences, the
decodes' mean context). Profilers sweep it as a union of lattices, not one full lattice, so it
is kept as slices keyed by (chunk, decodes); a query brackets both keys among the values that
exist, interpolates each corner slice over (cached context, decode context) and blends the four
corners. A missing corner slice takes the nearest slice that exists. :class:`AdditiveAttention`
is a table whose prefill and decode attention were measured apart (LLMServingSim's older layout):
two such grids, one over (chunk, cached context), one over (decodes, mean context), a step paying
both. :func:`leave_one_out` is the interpolation's own error: each interior point predicted from
its two neighbours.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence


def _bracket(keys: Sequence[float], x: float) -> tuple[int, int, float]:
    """Indices ``lo, hi`` of ``keys`` around ``x`` and the weight of ``hi`` (extrapolating past
    the last key, clamped below the first)."""
    n = len(keys)
    if n == 1 or x <= keys[0]:
        return 0, 0, 0.0
    i = bisect_right(keys, x)
    lo, hi = (n - 2, n - 1) if i >= n else (i - 1, i)
    return lo, hi, (x - keys[lo]) / (keys[hi] - keys[lo])


class Curve:
    """One operator's measured time (seconds) against one size."""

    __slots__ = ("sizes", "times")

    def __init__(self, points: Iterable[tuple[float, float]]) -> None:
        merged: dict[float, list[float]] = {}
        for size, seconds in points:
            merged.setdefault(float(size), []).append(float(seconds))
        if not merged:
            raise ValueError("a curve needs at least one measured point")
        ordered = sorted(merged.items())
        self.sizes = tuple(size for size, _ in ordered)
        self.times = tuple(sum(ts) / len(ts) for _, ts in ordered)

    def at(self, size: float) -> float:
        sizes, times = self.sizes, self.times
        lo, hi, w = _bracket(sizes, size)
        value = times[lo] + w * (times[hi] - times[lo])
        if size > sizes[-1]:
            return max(value, times[-1])
        return value


def leave_one_out(curve: Curve) -> list[float]:
    """Relative errors of predicting each interior point from its two neighbours."""
    s, t = curve.sizes, curve.times
    errors = []
    for i in range(1, len(s) - 1):
        w = (s[i] - s[i - 1]) / (s[i + 1] - s[i - 1])
        guess = t[i - 1] + w * (t[i + 1] - t[i - 1])
        if t[i] > 0:
            errors.append((guess - t[i]) / t[i])
    return errors


class _Slice:
    """The attention table at one (chunk, decodes): a curve over decode context per cached
    context."""

    __slots__ = ("cached", "rows")

    def __init__(self, points: dict[float, list[tuple[float, float]]]) -> None:
        self.cached = tuple(sorted(points))
        self.rows = tuple(Curve(points[k]) for k in self.cached)

    def at(self, cached: float, decode_context: float) -> float:
        lo, hi, w = _bracket(self.cached, cached)
        low = self.rows[lo].at(decode_context)
        if w == 0.0:
            return low
        return low + w * (self.rows[hi].at(decode_context) - low)


class AttentionGrid:
    """One layer's attention time (seconds) for a step: ``at(chunk, cached, decodes, ctx)``."""

    def __init__(self, points: Iterable[tuple[float, float, float, float, float]]) -> None:
        raw: dict[tuple[float, float], dict[float, list[tuple[float, float]]]] = {}
        for chunk, cached, decodes, ctx, seconds in points:
            rows = raw.setdefault((float(chunk), float(decodes)), {})
            rows.setdefault(float(cached), []).append((float(ctx), float(seconds)))
        if not raw:
            raise ValueError("the attention table is empty")
        self.measured = {key: _Slice(rows) for key, rows in raw.items()}
        self.slices = dict(self.measured)  # plus each missing corner's stand-in, once looked up
        self.chunks = tuple(sorted({c for c, _ in self.slices}))
        self.decodes = tuple(sorted({d for _, d in self.slices}))

    def _corner(self, chunk: float, decodes: float, cached: float, ctx: float) -> float:
        piece = self.slices.get((chunk, decodes))
        if piece is None:
            nearest = min(self.slices, key=lambda key: (abs(key[0] - chunk), abs(key[1] - decodes)))
            piece = self.slices[nearest]
            self.slices[(chunk, decodes)] = piece  # remembered: the lookup is on the hot path
        return piece.at(cached, ctx)

    def at(self, chunk: float, cached: float, decodes: float, ctx: float) -> float:
        c_lo, c_hi, wc = _bracket(self.chunks, chunk)
        d_lo, d_hi, wd = _bracket(self.decodes, decodes)
        c0, c1 = self.chunks[c_lo], self.chunks[c_hi]
        d0, d1 = self.decodes[d_lo], self.decodes[d_hi]
        v00 = self._corner(c0, d0, cached, ctx)
        v01 = v00 if wd == 0.0 else self._corner(c0, d1, cached, ctx)
        low = v00 + wd * (v01 - v00)
        if wc == 0.0:
            return max(low, 0.0)
        v10 = self._corner(c1, d0, cached, ctx)
        v11 = v10 if wd == 0.0 else self._corner(c1, d1, cached, ctx)
        high = v10 + wd * (v11 - v10)
        return max(low + wc * (high - low), 0.0)

    def leave_one_out(self) -> list[float]:
        """Each slice row's interior points predicted from their neighbours (relative errors)."""
        errors: list[float] = []
        for piece in self.measured.values():
            for row in piece.rows:
                errors.extend(leave_one_out(row))
        return errors


class AdditiveAttention:
    """Attention measured as two tables, prefill and decode apart: rows ``(chunk, cached, 0, 0,
    t)`` time a prefill chunk after its cached context, rows ``(0, 0, decodes, context, t)`` a
    batch of decodes at their mean context; a mixed step costs the sum."""

    def __init__(self, points: Iterable[tuple[float, float, float, float, float]]) -> None:
        rows = list(points)
        prefill = [row for row in rows if row[0] > 0 and row[2] == 0]
        decode = [row for row in rows if row[0] == 0 and row[2] > 0]
        if len(prefill) + len(decode) != len(rows):
            raise ValueError("an additive attention row has both a prefill chunk and decodes")
        if not prefill or not decode:
            raise ValueError("an additive attention table needs prefill rows and decode rows")
        self.prefill = AttentionGrid(prefill)
        self.decode = AttentionGrid(decode)

    def at(self, chunk: float, cached: float, decodes: float, ctx: float) -> float:
        seconds = self.prefill.at(chunk, cached, 0.0, 0.0) if chunk > 0 else 0.0
        if decodes > 0:
            seconds += self.decode.at(0.0, 0.0, decodes, ctx)
        return seconds

    def leave_one_out(self) -> list[float]:
        return self.prefill.leave_one_out() + self.decode.leave_one_out()
