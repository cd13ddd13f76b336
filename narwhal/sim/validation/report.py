"""Writing and printing a validation: ``validation.json``, the CDFs as CSV and PNG, a table.

Rule kept here: ``validation.json`` has exactly the keys ``narwhal validate`` documents
(``ttft_ms``, ``tpot_ms``, ``latency_ms``, each with ``real``, ``sim``, ``error_pct``, ``ks_d``,
``ks_p``, ``tost_p``); the CSV holds every point the PNG draws, so a figure can be checked
without the picture. A run published as means only has, per metric it published, ``real``,
``sim`` and ``error_pct`` of the mean alone (with ``low`` and ``high`` where the source only
brackets the real figure), plus ``anchors`` (other simulators' figures and their errors), and no
CDFs.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

METRICS = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "latency_ms": "End-to-end latency"}


def write_json(result: dict[str, Any], out: Path) -> Path:
    path = out / "validation.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n", "utf-8")
    return path


def write_cdfs(
    samples: dict[str, tuple[list[float], list[float]]], out: Path, title: str
) -> tuple[Path, Path]:
    """``cdf.csv`` (metric, side, value_ms, cumulative fraction) and ``cdf.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    csv_path, png_path = out / "cdf.csv", out / "cdf.png"
    fig, axes = plt.subplots(1, len(samples), figsize=(4.2 * len(samples), 3.6))
    with csv_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["metric", "side", "value_ms", "fraction"])
        for ax, (metric, (real, sim)) in zip(np.atleast_1d(axes), samples.items(), strict=True):
            # seconds on the axis once values run past 10 s (the CSV stays in ms)
            in_s = max(max(real), max(sim)) > 10.0
            for side, values, style in (("real", real, "-"), ("sim", sim, "--")):
                xs = np.sort(np.asarray(values) * 1e3)
                ys = np.arange(1, len(xs) + 1) / len(xs)
                for x, y in zip(xs, ys, strict=True):
                    writer.writerow([metric, side, f"{x:.3f}", f"{y:.6f}"])
                label = "real vLLM" if side == "real" else "Narwhal sim"
                ax.plot(xs / 1e3 if in_s else xs, ys, style, label=label)
            ax.set_title(METRICS[metric])
            ax.set_xlabel("s" if in_s else "ms")
            ax.set_ylabel("fraction of requests")
            ax.grid(alpha=0.3)
            ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return csv_path, png_path


MEAN_LABELS = {
    "ttft_ms": "TTFT mean (ms)",
    "tpot_ms": "TPOT mean (ms)",
    "latency_ms": "E2E mean (ms)",
    "throughput_tok_s": "output tok/s",
}


def means_table(result: dict[str, Any]) -> str:
    """A means-only run's table: real, simulated, error, and each anchor with its error."""
    anchors = result.get("anchors", {})
    head = f"{'metric':<18}{'real':>10}{'sim':>10}{'error':>9}"
    head += "".join(f"{name:>26}" for name in anchors)
    lines = [head, "-" * len(head)]
    for metric, label in MEAN_LABELS.items():
        if metric not in result:
            continue
        entry = result[metric]
        line = (
            f"{label:<18}{entry['real']['mean']:>10.1f}{entry['sim']['mean']:>10.1f}"
            f"{entry['error_pct']['mean']:>+8.1f}%"
        )
        for figures in anchors.values():
            if metric in figures:
                cell = f"{figures[metric]['mean']:.1f} ({figures[metric]['error_pct']:+.1f}%)"
            else:
                cell = "-"
            line += f"{cell:>26}"
        lines.append(line)
    for metric, label in MEAN_LABELS.items():
        entry = result.get(metric)
        if entry is not None and "low" in entry["real"]:
            real, error = entry["real"], entry["error_pct"]
            lines.append(
                f"{label}: real bracketed {real['low']:.1f} .. {real['high']:.1f}, "
                f"sim error {error['high']:+.1f}% .. {error['low']:+.1f}% across it"
            )
    return "\n".join(lines)


def unpublished_line(means: dict[str, float]) -> str:
    """The simulated means a means-only run did not publish, in one line."""
    return ", ".join(f"{MEAN_LABELS[k]} {v:,.1f}" for k, v in means.items() if k in MEAN_LABELS)


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{'metric':<22}{'real':>11}{'sim':>11}{'error':>9}",
        "-" * 53,
    ]
    for metric, label in METRICS.items():
        entry = result[metric]
        for stat in ("mean", "p50", "p90", "p99"):
            lines.append(
                f"{label + ' ' + stat:<22}{entry['real'][stat]:>11.1f}{entry['sim'][stat]:>11.1f}"
                f"{entry['error_pct'][stat]:>+8.1f}%"
            )
        lines.append(
            f"{'':<4}KS D {entry['ks_d']:.3f} p {entry['ks_p']:.3g}   "
            f"TOST(+-10%) p {entry['tost_p']:.3g}"
        )
    return "\n".join(lines)
