"""A benchmark run's printed results, kept in a file of their own under benchmarks/results/.

Rule kept here: a run's numbers live in the files the scripts write (benchmarks/results/ is
git-ignored), not in the docs' prose; the docs quote the current headline figures and the
command behind each. Scripts that write structured results of their own (``routers.py``'s JSON
and CSV, ``workers.py``'s JSON) do so; the others keep what they print through
:func:`kept_output`, which copies stdout to ``benchmarks/results/<name>-<stamp>.txt`` headed by
the command line and the machine.

Usage, from a script in a subfolder::

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from kept import kept_output

    with kept_output("paced_ttft"):
        main()
"""

from __future__ import annotations

import os
import platform
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

RESULTS = Path(__file__).resolve().parent / "results"


class _Tee:
    """Writes to the terminal and to the kept file alike."""

    def __init__(self, *streams: TextIO) -> None:
        self._streams = streams

    def write(self, text: str) -> int:
        for stream in self._streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self._streams:
            stream.flush()


@contextmanager
def kept_output(name: str) -> Iterator[Path]:
    """Copy everything printed inside the block to ``benchmarks/results/<name>-<stamp>.txt``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.txt"
    terminal = sys.stdout
    with path.open("w", encoding="utf-8") as kept:
        kept.write(f"# {' '.join([sys.executable, *sys.argv])}\n")
        kept.write(f"# {platform.platform()}, {os.cpu_count()} cores, {sys.version.split()[0]}\n")
        sys.stdout = _Tee(terminal, kept)  # type: ignore[assignment]
        try:
            yield path
        finally:
            sys.stdout = terminal
    print(f"output kept in {path}")
