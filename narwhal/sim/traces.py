"""Request traces: the bundled ones and trace files, read into rows of arrival time and lengths,
with the prompt's prefix blocks where the trace records them.

Rule kept here: a trace is read once (cached), whole, in time order, and a malformed one is a
clear error naming the file, the line and what is wrong; bundled traces are the source files
unchanged (the Mooncake ones xz-compressed) and each has its citation
(``narwhal/sim/data/README.md``).

Theory of operation:
- :func:`load_trace` gives ``(seconds from the first request, prompt tokens, output tokens)``
  rows; CSV traces have Azure's columns (``TIMESTAMP``, ``ContextTokens``,
  ``GeneratedTokens``), JSONL traces Mooncake's (``timestamp`` in ms, ``input_length``,
  ``output_length``, optional ``hash_ids``).
- :func:`trace_block_ids` gives, row for row, the prompt's prefix blocks: Mooncake's
  ``hash_ids``, one per :data:`TRACE_BLOCK_TOKENS` tokens (the last block may be partial),
  such that an id names a block *and everything before it*, which is what
  :mod:`narwhal.sim.gpu.prefix` needs. The Mooncake traces already number their blocks so
  (every id always follows the same id: kept as they are); any other file is renumbered (a
  chained id per ``(previous chained id, hash id)`` pair). A row
  without ``hash_ids`` (and every CSV row) has none: content no other request shares.
"""

from __future__ import annotations

import csv
import json
import lzma
from datetime import date
from functools import lru_cache
from importlib import resources
from pathlib import Path

AZURE_CITATION = "Azure LLM inference trace 2023 (AzurePublicDataset, CC-BY-4.0)"
MOONCAKE_CITATION = "Mooncake traces (kvcache-ai/Mooncake, FAST'25, Apache-2.0)"
BUNDLED_TRACES = {  # name -> (file in narwhal/sim/data, citation)
    "azure2023_conv": ("azure2023_conv.csv", AZURE_CITATION),
    "azure2023_code": ("azure2023_code.csv", AZURE_CITATION),
    "mooncake_conversation": ("mooncake_conversation.jsonl.xz", MOONCAKE_CITATION),
    "mooncake_synthetic": ("mooncake_synthetic.jsonl.xz", MOONCAKE_CITATION),
}
TRACE_BLOCK_TOKENS = 512  # tokens per hash id (Mooncake's convention)

TraceRow = tuple[float, int, int]  # (seconds from the first request, prompt, output)
BlockIds = tuple[int, ...]  # a prompt's chained prefix block ids, one per TRACE_BLOCK_TOKENS
_Parsed = tuple[float, int, int, list[int] | None]


def trace_citation(name: str) -> str:
    """What a plot or summary cites for trace ``name``."""
    bundled = BUNDLED_TRACES.get(name)
    return bundled[1] if bundled is not None else "a trace file"


def load_trace(name: str) -> tuple[TraceRow, ...]:
    """``(seconds from the first request, prompt tokens, output tokens)``, in time order."""
    return _load(name)[0]


def trace_block_ids(name: str) -> tuple[BlockIds, ...]:
    """Each row's chained prefix block ids (module docstring), row for row with
    :func:`load_trace`; empty for a row without ``hash_ids``."""
    return _load(name)[1]


@lru_cache(maxsize=8)
def _load(name: str) -> tuple[tuple[TraceRow, ...], tuple[BlockIds, ...]]:
    rows = _parse(_read(name), name)
    if not rows:
        raise ValueError(f"workload.trace: {name!r} holds no requests")
    rows.sort(key=lambda r: r[0])  # stable: rows of one instant keep their file order
    first = rows[0][0]
    lengths = tuple((t - first, max(1, p), max(1, o)) for t, p, o, _ in rows)
    blocks = [row[3] or [] for row in rows]
    if _chained(blocks):
        return lengths, tuple(map(tuple, blocks))
    chains: dict[tuple[int, int], int] = {}
    ids: list[BlockIds] = []
    for hash_ids in blocks:
        chained: list[int] = []
        parent = -1
        for hash_id in hash_ids:
            parent = chains.setdefault((parent, hash_id), len(chains))
            chained.append(parent)
        ids.append(tuple(chained))
    return lengths, tuple(ids)


def _chained(blocks: list[list[int]]) -> bool:
    """Whether every id always follows the same id (the first ones: nothing), i.e. an id already
    names its whole prefix (the Mooncake traces are numbered so)."""
    before: dict[int, int | None] = {}
    for hash_ids in blocks:
        previous: int | None = None
        for hash_id in hash_ids:
            if before.setdefault(hash_id, previous) != previous:
                return False
            previous = hash_id
    return True


def _read(name: str) -> str:
    if name in BUNDLED_TRACES:
        data = resources.files("narwhal.sim").joinpath("data", BUNDLED_TRACES[name][0])
        raw = data.read_bytes()
        return (lzma.decompress(raw) if data.name.endswith(".xz") else raw).decode("utf-8")
    path = Path(name)
    if not path.is_file():
        raise ValueError(
            f"workload.trace: {name!r} is neither a bundled trace "
            f"({', '.join(BUNDLED_TRACES)}) nor a readable file"
        )
    try:
        raw = path.read_bytes()
        return (lzma.decompress(raw) if name.endswith(".xz") else raw).decode("utf-8")
    except (OSError, UnicodeDecodeError, lzma.LZMAError) as error:
        raise ValueError(f"workload.trace: cannot read {name!r}: {error}") from None


def _parse(text: str, name: str) -> list[_Parsed]:
    """The rows of a trace's text, or a ValueError naming the line and what is wrong with it."""
    if text.lstrip().startswith("{"):
        return _jsonl_rows(text, name)
    rows: list[_Parsed] = []
    reader = csv.DictReader(text.splitlines())
    for number, row in enumerate(reader, start=2):  # line 1 is the header
        try:
            rows.append(
                (
                    _seconds(row["TIMESTAMP"]),
                    int(row["ContextTokens"]),
                    int(row["GeneratedTokens"]),
                    None,
                )
            )
        except (ValueError, TypeError, KeyError, AttributeError) as error:
            raise ValueError(
                f"workload.trace {name!r} line {number}: {_why(error)} (CSV needs the columns "
                "TIMESTAMP as 'YYYY-MM-DD HH:MM:SS', ContextTokens and GeneratedTokens)"
            ) from None
    return rows


def _jsonl_rows(text: str, name: str) -> list[_Parsed]:
    """Mooncake-style JSONL: timestamp (ms), lengths, and optionally the prompt's hash ids."""
    rows: list[_Parsed] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            prompt = int(item["input_length"])
            hash_ids = _hash_ids(item.get("hash_ids"), prompt)
            rows.append(
                (float(item["timestamp"]) / 1e3, prompt, int(item["output_length"]), hash_ids)
            )
        except (ValueError, TypeError, KeyError) as error:
            raise ValueError(
                f"workload.trace {name!r} line {number}: {_why(error)} (JSONL needs "
                "timestamp in ms, input_length and output_length; hash_ids, if given, one "
                f"integer per {TRACE_BLOCK_TOKENS}-token block of the prompt)"
            ) from None
    return rows


def _hash_ids(value: object, prompt: int) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(type(i) is int for i in value):
        raise ValueError("hash_ids must be a list of integers")
    blocks = -(-prompt // TRACE_BLOCK_TOKENS)
    if len(value) != blocks:
        raise ValueError(
            f"hash_ids has {len(value)} ids for input_length {prompt} ({blocks} blocks)"
        )
    return value


def _seconds(stamp: str) -> float:
    day, _, clock = stamp.strip().partition(" ")
    hours, minutes, seconds = clock.split(":")
    return (
        date.fromisoformat(day).toordinal() * 86400.0
        + int(hours) * 3600.0
        + int(minutes) * 60.0
        + float(seconds)
    )


def _why(error: Exception) -> str:
    return f"missing {error}" if isinstance(error, KeyError) else str(error)
