"""Simulator cost in CPU instructions per simulated request: a figure that does not move with
the machine's load. Not a test.

This machine's wall-clock speed moves by a third or more from minute to minute (other
tenants), more than most changes do. Instructions executed do not: this script runs the
``sim_speed`` scenario under valgrind's callgrind twice, for ``--base`` and for ``--base`` plus
``--requests`` requests, and prints the difference per request (setup, imports and the
step-time fit cancel out). Needs ``valgrind``; takes a minute or two.

    .venv-compiled/bin/python benchmarks/simulator/sim_instructions.py [--requests 2000] \
        [--base 200] [--stream-interval 16] [--streamed] [--keep DIR]
    .venv/bin/python benchmarks/simulator/sim_instructions.py  # the pure build (slower)

Comparing two versions: run it with each (``PYTHONPATH`` at a build of each); equal counts mean
equal work, whatever the clock said.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = """
import gc
import sys
import tempfile
from pathlib import Path
sys.path.insert(0, {here!r})
from sim_speed import GC_THRESHOLDS, build, scenario_for
gc.set_threshold(*GC_THRESHOLDS)
from narwhal.core.records import DecisionLog
from narwhal.sim.runner import run
scenario = scenario_for({requests}, {interval}, 16, 35.0)
if {streamed}:  # as `narwhal simulate` runs: every record streamed to disk
    with tempfile.TemporaryDirectory() as out:
        run(scenario, log=DecisionLog(enabled=False), stream_to=Path(out))
else:
    run(scenario, log=DecisionLog(enabled=False))
print(build())
"""


def instructions(
    requests: int, interval: int, streamed: bool, keep: Path | None
) -> tuple[int, str]:
    """Instructions callgrind counts for a whole process simulating ``requests`` requests at
    ``interval`` tokens per streamed chunk (records ``streamed`` to disk, or held in memory),
    and the build that process ran; ``keep``: a folder to keep callgrind's output in (for
    ``callgrind_annotate``)."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = keep if keep is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={folder}/callgrind.{requests}.out",
                sys.executable,
                "-P",  # not the working directory first on sys.path: a checkout there is pure
                "-c",
                CHILD.format(
                    here=str(HERE), requests=requests, interval=interval, streamed=streamed
                ),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
            check=True,
        )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"no instruction count in valgrind's output:\n{out.stderr[-2000:]}")
    return int(found.group(1)), out.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--base", type=int, default=200)
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=16,
        help="tokens per streamed chunk (vLLM's --stream-interval; its default is 1)",
    )
    parser.add_argument(
        "--streamed",
        action="store_true",
        help="stream every record to disk, as `narwhal simulate` does (default: held in memory)",
    )
    parser.add_argument(
        "--keep", type=Path, help="keep callgrind's output files here (callgrind_annotate)"
    )
    args = parser.parse_args()
    if args.requests < 1 or args.base < 1 or args.stream_interval < 1:
        parser.error("--requests, --base and --stream-interval must be at least 1")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (it counts the instructions)")
    base, build = instructions(args.base, args.stream_interval, args.streamed, args.keep)
    total, _ = instructions(
        args.base + args.requests, args.stream_interval, args.streamed, args.keep
    )
    per = (total - base) / args.requests
    print(
        f"[{build} build, stream_interval {args.stream_interval}, "
        f"{'streamed' if args.streamed else 'in memory'}] {per:,.0f} instructions per "
        "simulated request "
        f"({args.base:,} vs {args.base + args.requests:,} requests: {base:,} vs {total:,})"
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kept import kept_output

    with kept_output("sim_instructions"):
        main()
