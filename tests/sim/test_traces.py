"""Traces: the bundled Mooncake traces with their prefix blocks, chained block ids, and clear
errors for malformed files."""

from __future__ import annotations

import json
import lzma
import random
from pathlib import Path

import pytest

from narwhal.sim.traces import (
    TRACE_BLOCK_TOKENS,
    load_trace,
    trace_block_ids,
    trace_citation,
)
from narwhal.sim.workload import WorkloadSettings, generate


@pytest.mark.parametrize(
    ("name", "count", "first"),
    [
        ("mooncake_conversation", 12031, (0.0, 6758, 500)),
        ("mooncake_synthetic", 3993, (0.0, 40160, 6)),
    ],
)
def test_the_bundled_mooncake_traces_load_with_their_blocks(
    name: str, count: int, first: tuple[float, int, int]
) -> None:
    rows, ids = load_trace(name), trace_block_ids(name)
    assert len(rows) == len(ids) == count and rows[0] == first
    assert all(
        len(i) == -(-p // TRACE_BLOCK_TOKENS) for (_, p, _), i in zip(rows, ids, strict=True)
    )
    assert "Mooncake" in trace_citation(name) and "Apache-2.0" in trace_citation(name)
    seen = {block for blocks in ids for block in blocks}
    assert len(seen) < sum(map(len, ids))  # blocks repeat: that is what the trace is for


def test_a_trace_replays_its_prompts_as_segments_clamped_with_the_prompt() -> None:
    settings = WorkloadSettings(kind="trace", trace="mooncake_conversation", max_requests=50)
    arrivals = generate(settings, random.Random(0))
    assert all(sum(n for _, n in a.prefix) == a.prompt for a in arrivals)
    first, second = arrivals[0], arrivals[1]
    assert first.prefix[0] == second.prefix[0] == (0, 512)  # both start with block 0
    assert first.prefix[1] != second.prefix[1]
    clamped = generate(settings.model_copy(update={"max_prompt_tokens": 1000}), random.Random(0))
    assert clamped[0].prompt == 1000 and clamped[0].prefix == ((0, 512), (first.prefix[1][0], 488))
    azure = generate(WorkloadSettings(kind="trace", max_requests=5), random.Random(0))
    assert all(a.prefix == () for a in azure)  # the Azure trace records no content


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_block_ids_of_any_file_are_chained(tmp_path: Path) -> None:
    rows = [  # block 2 follows block 1 in one prompt and block 5 in the other: not chained
        {"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [5, 2]},
        {"timestamp": 9, "input_length": 1000, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 9, "input_length": 10, "output_length": 1},
    ]
    ids = trace_block_ids(write_jsonl(tmp_path / "t.jsonl", rows))
    assert ids[0] == ids[2] and ids[0][1] != ids[1][1] and ids[3] == ()
    assert len({*ids[0], *ids[1]}) == 4
    chained = [{**row, "hash_ids": [7, 8]} for row in rows[:1]]
    assert trace_block_ids(write_jsonl(tmp_path / "c.jsonl", chained)) == ((7, 8),)  # kept


def test_an_xz_trace_file_is_read(tmp_path: Path) -> None:
    row = {"timestamp": 0, "input_length": 5, "output_length": 6, "hash_ids": [3]}
    path = tmp_path / "t.jsonl.xz"
    path.write_bytes(lzma.compress((json.dumps(row) + "\n").encode()))
    assert load_trace(str(path)) == ((0.0, 5, 6),) and trace_block_ids(str(path)) == ((3,),)


@pytest.mark.parametrize(
    ("hash_ids", "message"),
    [
        ([1], "hash_ids has 1 ids for input_length 600 \\(2 blocks\\)"),
        ([1, "2"], "hash_ids must be a list of integers"),
        ([1, True], "hash_ids must be a list of integers"),
        ("1,2", "hash_ids must be a list of integers"),
    ],
)
def test_malformed_hash_ids_are_refused_naming_the_line(
    tmp_path: Path, hash_ids: object, message: str
) -> None:
    rows = [
        {"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [0]},
        {"timestamp": 1, "input_length": 600, "output_length": 1, "hash_ids": hash_ids},
    ]
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(ValueError, match=f"line 2: {message}"):
        load_trace(path)
