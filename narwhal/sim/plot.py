"""One PNG per run: what the clients saw, and what each engine was doing meanwhile.

Rule kept here: plotting reads results only and uses matplotlib's Agg backend with fixed
metadata, so the same run gives the same PNG bytes and no display is needed.

Theory of operation: three panels sharing the time axis. (1) Time to first token at the client
per request (log scale), successes in blue and failures in red, with the TTFT SLO as a line.
(2) One row per engine: the router's view from the state samples (ejected, probing,
quarantined, capped) as coloured bars over the engine's own fault windows (grey hatch, each
labelled with its fault kind). (3) Running
decode sequences per engine (the batch the engine carries). The title names the scenario, the
seed, the success rate and SLO attainment, and the trace's source when one is used.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from narwhal.sim.faults import FaultWindow
from narwhal.sim.runner import RunResult

ROUTER_COLOURS = {
    "ejected": "#d62728",
    "probing": "#ff7f0e",
    "quarantined": "#bcbd22",
    "capped": "#9467bd",
}
# Legends sit above their panel, outside it, so they never cover a request or a fault band.
LEGEND_ABOVE: dict[str, Any] = {
    "loc": "lower right",
    "bbox_to_anchor": (1.0, 1.0),
    "borderaxespad": 0.2,
    "frameon": False,
}


def _spans(points: list[tuple[float, str]], step: float) -> list[tuple[str, float, float]]:
    """Collapse (t, state) samples into (state, start, width) runs."""
    spans: list[tuple[str, float, float]] = []
    for t, state in points:
        if spans and spans[-1][0] == state and abs(spans[-1][1] + spans[-1][2] - t) < 1e-9:
            name, start, width = spans[-1]
            spans[-1] = (name, start, width + step)
        else:
            spans.append((state, t, step))
    return spans


def _labels(windows: list[FaultWindow], gap_s: float) -> list[tuple[float, str]]:
    """One label per cluster of fault windows starting within ``gap_s`` of each other (their
    kinds joined), so labels on one row never overprint."""
    labels: list[tuple[float, list[str]]] = []
    for window in windows:
        if labels and window.start - labels[-1][0] < gap_s:
            if window.kind not in labels[-1][1]:
                labels[-1][1].append(window.kind)
        else:
            labels.append((window.start, [window.kind]))
    return [(start, ", ".join(kinds)) for start, kinds in labels]


def plot(
    result: RunResult,
    rows: list[dict[str, Any]],
    summary: dict[str, Any],
    path: Path,
    samples: list[dict[str, Any]] | None = None,
) -> None:
    """Draw the run; ``samples`` default to the run's own (a streamed run's are on disk)."""
    samples = result.samples if samples is None else samples
    sim = result.scenario.sim
    urls = list(result.engines)
    fig, (ax1, ax2, ax3) = plt.subplots(
        3, 1, figsize=(11, 9), sharex=True, gridspec_kw={"height_ratios": [2.2, 1.6, 1.6]}
    )
    ok = [
        (r["arrival"], r["first_byte_s"])
        for r in rows
        if r["status"] == 200 and r["first_byte_s"] is not None
    ]
    bad = [(r["arrival"], r["finished_s"]) for r in rows if r["status"] != 200]
    if ok:
        ax1.scatter([a for a, _ in ok], [b for _, b in ok], s=2, c="#1f77b4", label="200")
    if bad:
        ax1.scatter(
            [a for a, _ in bad],
            [b for _, b in bad],
            s=6,
            c="#d62728",
            marker="x",
            label="error (time to error)",
        )
    ax1.axhline(sim.slo_ttft_s, color="k", lw=0.8, ls="--", label="TTFT SLO")
    ax1.set_yscale("log")
    ax1.set_ylabel("TTFT at client (s)")
    ax1.legend(fontsize=7, markerscale=3, ncol=3, **LEGEND_ABOVE)

    span_s = max(result.sim_end_s, 1.0)
    for row, url in enumerate(urls):
        windows = sorted((w for w in result.fault_windows if w.url == url), key=lambda w: w.start)
        for window in windows:
            ax2.broken_barh(
                [(window.start, window.end - window.start)],
                (row - 0.4, 0.8),
                facecolors="#dddddd",
                edgecolor="#888888",
                hatch="//",
                lw=0.3,
            )
        for start, kinds in _labels(windows, span_s * 0.04):
            ax2.text(  # the faults' kinds, at the band's start, above the router's bars
                start, row + 0.28, f" {kinds}", fontsize=5.5, va="center", clip_on=True
            )
        states = [(s["t"], s["router_state"]) for s in samples if s["engine"] == url]
        for state, start, width in _spans(states, sim.sample_interval_s):
            if state in ROUTER_COLOURS:
                ax2.broken_barh(
                    [(start, width)], (row - 0.25, 0.5), facecolors=ROUTER_COLOURS[state]
                )
    ax2.set_yticks(range(len(urls)))
    ax2.set_yticklabels([u.removeprefix("http://") for u in urls], fontsize=7)
    ax2.set_ylabel("router view")
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in ROUTER_COLOURS.values()]
    handles.append(Rectangle((0, 0), 1, 1, facecolor="#dddddd", hatch="//"))
    ax2.legend(handles, [*ROUTER_COLOURS, "engine fault"], fontsize=7, ncol=5, **LEGEND_ABOVE)

    for url in urls:
        pts = [(s["t"], s["decoding"]) for s in samples if s["engine"] == url]
        if any(v for _, v in pts):
            ax3.plot(
                [t for t, _ in pts], [v for _, v in pts], lw=0.8, label=url.removeprefix("http://")
            )
    ax3.set_xlim(0.0, max(result.sim_end_s, 1.0) * 1.01)  # later fault windows are not shown
    ax3.set_ylabel("decoding seqs")
    ax3.set_xlabel("simulated time (s)")
    if ax3.get_legend_handles_labels()[0]:
        ax3.legend(fontsize=6, ncol=8, **LEGEND_ABOVE)

    title = (
        f"narwhal simulate: {summary['scenario']} (seed {summary['seed']}) - "
        f"{summary['success_pct']:.2f}% ok, SLO attainment "
        f"{summary['slo_attainment_pct']:.1f}%"
    )
    if "trace" in summary:
        title += f"\ntrace: {summary['trace']}"
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _number(text: str) -> float | None:
    return float(text) if text else None


def plot_files(result: RunResult, summary: dict[str, Any], out: Path) -> None:
    """Draw ``out/plot.png`` from the run's ``records.csv`` and ``timeline.csv`` (a streamed run
    keeps neither in memory; this reads back what the plot shows)."""
    with (out / "records.csv").open(newline="", encoding="utf-8") as handle:
        rows = [
            {
                "arrival": float(r["arrival"]),
                "status": int(r["status"]) if r["status"] else None,
                "first_byte_s": _number(r["first_byte_s"]),
                "finished_s": _number(r["finished_s"]),
            }
            for r in csv.DictReader(handle)
        ]
    samples: list[dict[str, Any]] = []
    timeline = out / "timeline.csv"
    if timeline.exists():
        with timeline.open(newline="", encoding="utf-8") as handle:
            samples = [
                {
                    "t": float(s["t"]),
                    "engine": s["engine"],
                    "router_state": s["router_state"],
                    "decoding": int(s["decoding"]),
                }
                for s in csv.DictReader(handle)
            ]
    plot(result, rows, summary, out / "plot.png", samples)
