"""Figure recipes: named ways to draw a sweep, each a PNG with the CSV of what it draws beside it.

Rule kept here: a recipe reads a finished :class:`~narwhal.experiments.sweep.SweepResult` and
writes files; it never runs simulations. What a recipe needs of a spec (its ``[figure]``
options, its axes, whether ``[goodput]`` is needed) is :mod:`narwhal.experiments.recipes`,
checked when the spec is validated, so a spec that cannot be drawn is refused before it runs;
this package only draws.

- ``tuning``: heatmaps over two grid axes (success rate, p99 ``first_byte_s``, goodput), the
  recommended cell marked.
- ``retries``: per point, the CDF of ``first_byte_s`` over all requests, and failures stacked
  by error class.
- ``capacity``: goodput against fleet size per prefill:decode ratio, and the attainment curves
  behind it.
- ``diffuse``: success and goodput against where the faults are (one bad engine ... every
  engine a little flaky), a line per value of one recovery setting and a column of panels per
  value of another, the recommended setting and the shipped defaults marked.
- ``routing``: routing policies across offered load (client TTFT p50/p90, TPOT, attainment,
  rejections, prefix-cache hit rate, goodput), the recommended policy and the default marked.
- ``flow``: per workload class, SLO attainment, TTFT p90 and goodput against offered load with
  intervals, flow control against plain admission.

``capacity_compare`` is not a recipe: run with ``python -m``, it draws two finished capacity
sweeps' files over each other (an old engine model against a new one).

Each recipe module exposes ``draw(result, options, out) -> list[Path]``; it is imported only
when its figures are drawn (matplotlib is not loaded otherwise).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from narwhal.experiments.recipes import recipe_options

if TYPE_CHECKING:
    from narwhal.experiments.aggregate import SweepResult

DRAWINGS = {
    "tuning": "narwhal.experiments.figures.tuning",
    "retries": "narwhal.experiments.figures.retries",
    "capacity": "narwhal.experiments.figures.capacity",
    "diffuse": "narwhal.experiments.figures.diffuse",
    "routing": "narwhal.experiments.figures.routing",
    "flow": "narwhal.experiments.figures.flow",
}


def draw(result: SweepResult, out: Path) -> list[Path]:
    """Draw the spec's recipe into ``out``; the files written."""
    name = result.spec.sweep.recipe
    assert name is not None
    module = importlib.import_module(DRAWINGS[name])
    written: list[Path] = module.draw(result, recipe_options(result.spec), out)
    return written
