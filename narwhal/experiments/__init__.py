"""Experiments: ``narwhal sweep`` runs a grid of simulations and draws the operator's figures.

Rule kept here: a sweep is a pure function of its spec and its seed. Which machine (this
process, local processes, a Ray cluster) ran a point never changes what it produced, because
every run's seed is derived from (spec seed, point, replicate) alone and results are put back
in plan order before anything is written.

- ``commands.py``: the ``narwhal sweep`` command.
- ``spec.py``: the sweep spec (TOML, pydantic): base scenario, overrides, grid, cases,
  goodput, figure options, quick version.
- ``recipes.py``: what each figure recipe needs of a spec (its options and axes), checked when
  the spec is validated.
- ``overrides.py``: dotted-key overrides of a scenario mapping, and the derived keys (fleet
  size and prefill:decode ratio, rate multiplier).
- ``plan.py``: the spec expanded into points and runs, each run with its derived seed.
- ``worker.py``: one run: simulate a scenario, reduce it to a metrics row (picklable).
- ``backends.py``: running the plan in-process, over local processes or over Ray.
- ``aggregate.py``: per-point means over replicates, DistServe goodput, CSV text.
- ``sweep.py``: the whole sweep: plan, run, aggregate, write, draw.
- ``figures/``: the recipes' drawings (tuning, retries, capacity), each PNG with a CSV beside
  it.
"""
