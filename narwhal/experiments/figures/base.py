"""What every recipe's drawing shares: byte-stable PNG and CSV writing, captions.

Rule kept here: figures use matplotlib's Agg backend, a fixed size and dpi, and no software
metadata, and are stored as 128-colour palette PNGs (Pillow's median cut, no dithering: a
deterministic step that keeps plots crisp at a third of the size), so the same sweep gives the
same PNG bytes; every PNG is written together with a CSV of the numbers it shows, under the
same stem.

Theory of operation: :func:`pyplot` imports matplotlib lazily (a sweep that draws nothing
never pays for it); :func:`save_figure` writes ``<stem>.png`` and ``<stem>.csv`` and closes the
figure; :func:`provenance` is the small print every figure carries (sweep name, seed,
replicates, quick or not, the command that redraws it) so a PNG found alone can be reproduced.
"""

from __future__ import annotations

import io
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

from narwhal.experiments.aggregate import csv_text, unrun_faults

if TYPE_CHECKING:
    from narwhal.experiments.aggregate import SweepResult

DPI = 100
PALETTE_COLOURS = 128  # PNGs are palette images: a third of the RGBA size, same look


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(
    fig: Any, out: Path, stem: str, fields: list[str], rows: list[dict[str, Any]]
) -> list[Path]:
    """``<stem>.png`` and its ``<stem>.csv``; closes the figure."""
    out.mkdir(parents=True, exist_ok=True)
    png, table = out / f"{stem}.png", out / f"{stem}.csv"
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    from PIL import Image

    image = Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")
    palette = image.quantize(
        colors=PALETTE_COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE
    )
    palette.save(png, format="PNG", optimize=True)
    pyplot().close(fig)
    table.write_text(csv_text(fields, rows), "utf-8")
    return [png, table]


def provenance(result: SweepResult) -> str:
    spec = result.spec
    quick = " --quick" if result.quick else ""
    reps = spec.sweep.replicates
    return (
        f"narwhal sweep {spec.source} --seed {spec.sweep.seed}{quick}  |  "
        f"{len(result.plan.tasks)} runs, {result.requests:,} simulated requests, "
        f"{reps} replicate{'s' if reps != 1 else ''}, seeds by {spec.sweep.seed_by}"
    )


def short(key: str) -> str:
    """The last part of a dotted key, for axis labels."""
    return key.rsplit(".", 1)[-1]


def trace_note(result: SweepResult) -> str | None:
    """The citation of the trace a sweep's workload replays, if any."""
    from narwhal.sim.traces import trace_citation

    if not result.plan.tasks:
        return None
    workload = result.plan.tasks[0].scenario.get("workload", {})
    kind = workload.get("kind", "trace")
    # a trace's arrivals, or (poisson/gamma without length distributions) its lengths
    if kind == "trace" or (kind in ("poisson", "gamma") and "prompt" not in workload):
        name = workload.get("trace", "azure2023_conv")
        return f"{name}: {trace_citation(name)}"
    return None


def add_footer(
    fig: Any,
    result: SweepResult,
    *,
    width: int,
    fontsize: float = 7,
    lead: tuple[str, ...] = (),
    line_height: float = 0.03,
    top: float = 0.95,
) -> None:
    """The small print under every figure: ``lead`` notes, faults, trace and provenance."""
    notes = [*lead, fault_note(result)]
    trace = trace_note(result)
    if trace:
        notes.append(f"trace {trace}")
    notes.append(provenance(result))
    footer = "\n".join(textwrap.fill(n, width) for n in notes)
    fig.text(0.01, 0.01, footer, fontsize=fontsize, va="bottom", ha="left", color="#333333")
    fig.tight_layout(rect=(0, 0.03 + line_height * footer.count("\n"), 1, top))


def fault_note(result: SweepResult) -> str:
    """The fault mix of the first run, in words; a scheduled fault that runs ended before is
    marked as not run (in how many runs), never listed as if it happened."""
    if not result.plan.tasks:
        return "no faults"
    unrun = {index: (missed, total) for index, _, missed, total in unrun_faults(result)}
    parts = []
    for index, fault in enumerate(result.plan.tasks[0].scenario.get("faults", [])):
        target = fault.get("engine") or fault.get("role", "any")
        when = (
            f"{fault['rate_per_hour']:g}/h/engine"
            if "rate_per_hour" in fault
            else f"at {fault.get('at_s', 0):g}s"
        )
        extra = ""
        if "probability" in fault:
            extra = f" p={fault['probability']:g}"
        if fault.get("kind") == "slow":
            extra = f" x{fault.get('factor', 3.0):g}"
        text = f"{fault['kind']} ({target}, {when}, {fault.get('duration_s', 30):g}s{extra})"
        if index in unrun:
            missed, total = unrun[index]
            text += (
                " NOT RUN: every run ended first"
                if missed == total
                else f" (not run in {missed} of {total} runs: they ended first)"
            )
        parts.append(text)
    return "faults: " + ("; ".join(parts) if parts else "none")
