"""``narwhal validate`` and ``narwhal profile import``: the simulator held against real runs.

Rule kept here: building the parser imports only the standard library; a run, profile or config
that cannot be used is a one-line error naming what is missing, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="replay a real vLLM run on the simulated engine and report the error",
        description=(
            "Simulate a real run (LLMServingSim's bench/examples/<GPU>/<model>/ layout: "
            "vllm/meta.json and vllm/requests.jsonl) with a GPU profile and print, for TTFT, "
            "TPOT and end-to-end latency, real against simulated mean, p50, p90, p99, the "
            "error, a two-sample KS test and a TOST equivalence p-value at +-10%."
        ),
    )
    parser.add_argument("--run", required=True, type=Path, help="the run directory")
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="LLMServingSim profile directory (profiler/perf/<GPU>/<org>/<model>/<dtype>/, or "
        "the older profiler/v0/perf_models/<GPU>/<org>/<model>/) or "
        "a Narwhal profile file; default: the bundled profile of the run's GPU and model",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="write validation.json, cdf.csv and cdf.png here"
    )
    parser.set_defaults(func=_validate)

    profile = subparsers.add_parser(
        "profile", help="GPU profiles: import one from public measurements"
    )
    verbs = profile.add_subparsers(dest="verb", metavar="VERB")
    imp = verbs.add_parser(
        "import",
        help="read an LLMServingSim or Vidur profile and write Narwhal's",
        description=(
            "Read a per-operator profile in LLMServingSim's layout (meta.yaml, tp<N>/dense.csv, "
            "attention.csv, per_sequence.csv), its older per-layer one (tp<N>/layers.csv, "
            "predictions/attn_{prefill,decode}_predictions.csv) or Vidur's (mlp.csv, "
            "attention.csv), print each table's interpolation residuals and write Narwhal's "
            "profile (gzip'd JSON)."
        ),
    )
    imp.add_argument(
        "profile_dir",
        type=Path,
        help="profiler/perf/<GPU>/<org>/<model>/<dtype>/, the older "
        "profiler/v0/perf_models/<GPU>/<org>/<model>/, or Vidur's "
        "data/profiling/compute/<gpu>/<org>/<model>/",
    )
    imp.add_argument(
        "--model-config",
        type=Path,
        default=None,
        help="the model's Hugging Face config.json (default: found beside the "
        "profile or in the LLMServingSim checkout)",
    )
    imp.add_argument("--out", type=Path, required=True, help="the profile file to write")
    imp.set_defaults(func=_import)

    def no_verb(args: argparse.Namespace) -> int:
        profile.print_help()
        return 2

    profile.set_defaults(func=no_verb)


def _validate(args: argparse.Namespace) -> int:
    from narwhal.sim.profiles.source import ProfileError
    from narwhal.sim.validation.replay import run_allreduce
    from narwhal.sim.validation.report import (
        means_table,
        table,
        unpublished_line,
        write_cdfs,
        write_json,
    )
    from narwhal.sim.validation.validate import validate

    try:
        done = validate(args.run, args.profile)
    except (ProfileError, OSError) as error:
        print(f"narwhal validate: {error}", file=sys.stderr)
        return 2
    run = done.run
    print(
        f"{run.engine.model} on {run.gpu}: {len(run.requests)} requests, vLLM "
        f"{run.engine.vllm_version}, {_layout(run.cluster)}, max_num_seqs "
        f"{run.engine.max_num_seqs}, max_num_batched_tokens {run.engine.max_num_batched_tokens}"
    )
    if run.engine.defaulted:
        print(f"not recorded by the run, vLLM's default used: {', '.join(run.engine.defaulted)}")
    if (link := run_allreduce(run)) is not None:
        print(
            f"note: {run.gpu} is not in Narwhal's catalogue: its TP all-reduce is the run's link, "
            f"{link[0]:g} GB/s bus bandwidth and {link[1]:g} us (a ring's link latencies)"
        )
    if run.dataset_missing is not None:
        name, places = run.dataset_missing
        print(
            f"note: the run's dataset {name} was not found (looked for "
            f"{', '.join(map(str, places))}): every prompt is replayed as unique content, so "
            "the simulated prefix cache never hits where vLLM's did"
        )
    if run.means is not None:
        print(f"published as means only: {run.means.source}")
        print(means_table(done.result))
        if done.unpublished:
            print("simulated, not published: " + unpublished_line(done.unpublished))
    else:
        print(table(done.result))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        path = write_json(done.result, args.out)
        if not done.samples:
            print(f"wrote {path} (means only: no CDFs)")
            return 0
        title = f"{run.engine.model} on {run.gpu}: real vLLM vs Narwhal's simulated engine"
        csv_path, png_path = write_cdfs(done.samples, args.out, title)
        print(f"wrote {path}, {csv_path}, {png_path}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from narwhal.sim.profiles import importer, store
    from narwhal.sim.profiles.source import ProfileError

    try:
        imported = importer.read_any(args.profile_dir, args.model_config)
    except (ProfileError, OSError) as error:
        print(f"narwhal profile import: {error}", file=sys.stderr)
        return 2
    profile = store.from_source(imported, importer.origin(args.profile_dir))
    print(f"{imported.model} on {imported.gpu_name}: tp {', '.join(map(str, imported.tables))}")
    for note in imported.notes:
        print(f"note: {note}")
    rows = store.residuals(profile)
    width = max([16, *(len(name) + 1 for _, name, *_ in rows)])
    print(f"{'tp':>3} {'table':<{width}}{'points':>7}{'mean |err|':>12}{'max |err|':>11}")
    for tp, name, points, mean_err, max_err in rows:
        print(f"{tp:>3} {name:<{width}}{points:>7}{100 * mean_err:>11.2f}%{100 * max_err:>10.1f}%")
    print("(residuals: each measured point predicted by interpolating its two neighbours)")
    for tp, tables in sorted(profile["tp"].items(), key=lambda item: int(item[0])):
        alpha = tables["skew_alpha"]
        print(
            f"tp {tp}: skewed-batch attention alpha {alpha['decode']:.4f} decode-only, "
            f"{alpha['mixed']:.4f} beside a prefill chunk"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    store.write(profile, args.out)
    print(f"wrote {args.out}")
    return 0


def _layout(cluster: Any) -> str:
    if cluster.disaggregated:
        return f"{cluster.prefill} prefill + {cluster.decode} decode engine(s) through Narwhal"
    return f"{cluster.colocated} colocated engine(s)"
