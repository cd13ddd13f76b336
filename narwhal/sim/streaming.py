"""Per-request rows of a run, the counts a summary needs, and a recorder that streams them to
disk as requests finish, so a run's memory does not grow with its number of requests.

Rule kept here: a row is made in one place (:func:`record_row`, :func:`unfinished_row`) and
counted in one place (:class:`RowStats`), whether the run keeps its records in memory or
streams them; percentiles are exact either way (:func:`exact_percentiles`).

Theory of operation: :class:`StreamRecorder` is handed each request's row as its record comes
in (out of arrival order: a short request overtakes a long one) and writes ``records.csv`` in
arrival order through a reorder buffer that holds only rows finished ahead of a still-running
earlier one. Timeline samples and decisions are written as they are made (with several router
replicas each replica's decisions go to a file of their own, merged in time order at the end,
ties in replica order, as :meth:`~narwhal.sim.replicas.RouterReplicas.decisions` orders them).
Counts are kept as rows pass (:class:`RowStats`). Percentiles need every value, which a
bounded memory cannot hold, so :func:`exact_percentiles` selects the order statistics in two
passes over values it can re-read (``records.csv``): the first counts values per bucket (the
value's microseconds shifted right so that at most :data:`BUCKETS` buckets cover the largest),
the second counts the distinct values in the buckets holding the wanted ranks. Both passes hold
a bounded number of counters whatever the number of rows, and the result is the same
linear-interpolated percentile :func:`narwhal.sim.results.percentile` gives on a sorted list.
"""

from __future__ import annotations

import csv
import heapq
import io
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from narwhal.core.records import Decision, RequestRecord
from narwhal.sim.classes import ClassStats
from narwhal.sim.replicas import ReplicaCounts
from narwhal.sim.workload import Arrival

UNFINISHED = "unfinished"  # the outcome of a request still running when the run stopped
RECORD_FIELDS = (
    "request_id",
    "arrival",
    "status",
    "outcome",
    "committed",
    "ttft_s",
    "first_byte_s",
    "tpot_s",
    "finished_s",
    "attempts",
    "engines",
    "prompt_tokens",
    "output_tokens",
    "delivered_tokens",
    "output_events",
    "resumes",
    "resume_refused",
    "error",
)
PERCENTILE_KEYS = ("ttft_s", "first_byte_s", "tpot_s")  # over succeeded requests
BUCKETS = 1 << 16  # at most this many buckets in the first selection pass


def round6(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def record_row(
    record: RequestRecord, arrival: Arrival, delivered: Mapping[str, int]
) -> dict[str, Any]:
    """A finished request's row: its record joined with its arrival, and its TPOT from the
    tokens its decode streams delivered (``delivered``: ``"<request>-d<attempt>"`` -> tokens;
    a resumed stream's client got every leg's since the commit)."""
    tpot = None
    got = delivered.get(f"{record.request_id}-d{record.attempts}")
    if record.resumes and got is not None:
        legs = range(record.attempts - record.resumes, record.attempts + 1)
        got = sum(delivered.get(f"{record.request_id}-d{a}", 0) for a in legs)
    if record.status != 200:
        got = None
    if got is not None and record.first_byte_s is not None and got > 1:
        tpot = (record.finished_s - record.first_byte_s) / (got - 1)
    return {
        "request_id": record.request_id,
        "arrival": round6(record.arrival),
        "status": record.status,
        "outcome": record.outcome,
        "committed": record.committed,
        "ttft_s": round6(record.ttft_s),
        "first_byte_s": round6(record.first_byte_s),
        "tpot_s": round6(tpot),
        "finished_s": round6(record.finished_s),
        "attempts": record.attempts,
        "engines": " ".join(record.engines),
        "prompt_tokens": arrival.prompt,
        "output_tokens": arrival.output,
        "delivered_tokens": got,
        "output_events": record.output_tokens,
        "resumes": record.resumes,
        "resume_refused": record.resume_refused,
        "error": record.error,
        "class": arrival.cls,
    }


def unfinished_row(index: int, arrival: Arrival) -> dict[str, Any]:
    """The row of an arrival with no record (the run stopped at ``sim.max_sim_s`` first)."""
    row: dict[str, Any] = dict.fromkeys(RECORD_FIELDS)
    row.update(
        request_id=f"req-{index}",
        arrival=round6(arrival.t),
        outcome=UNFINISHED,
        committed=False,
        attempts=0,
        engines="",
        prompt_tokens=arrival.prompt,
        output_tokens=arrival.output,
        output_events=0,
        resumes=0,
    )
    row["class"] = arrival.cls
    return row


class RowStats:
    """What a summary counts over the rows, kept as they pass (none of them is held)."""

    def __init__(self, slo_ttft_s: float, slo_tpot_s: float) -> None:
        self.slo_ttft_s = slo_ttft_s
        self.slo_tpot_s = slo_tpot_s
        self.rows = 0
        self.succeeded = 0
        self.on_time = 0
        self.unfinished = 0
        self.retried = 0
        self.resumed = 0
        self.resume_refused: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.errors: Counter[str] = Counter()
        # per percentile key: how many succeeded rows have a value, and the largest magnitude
        self.counts = dict.fromkeys(PERCENTILE_KEYS, 0)
        self.largest = dict.fromkeys(PERCENTILE_KEYS, 0.0)

    def add(self, row: dict[str, Any]) -> None:
        self.rows += 1
        status = row["status"]
        if status is not None:
            self.statuses[status] += 1
        if row["outcome"] == UNFINISHED:
            self.unfinished += 1
        elif status != 200:
            self.errors[row["outcome"]] += 1
        if row["attempts"] > 1:
            self.retried += 1
        if row["resumes"]:
            self.resumed += 1
        if row["resume_refused"]:
            self.resume_refused[row["resume_refused"]] += 1
        if status != 200:
            return
        self.succeeded += 1
        first, tpot = row["first_byte_s"], row["tpot_s"]
        if (
            first is not None
            and first <= self.slo_ttft_s
            and (tpot is None or tpot <= self.slo_tpot_s)
        ):
            self.on_time += 1
        for key in PERCENTILE_KEYS:
            value = row[key]
            if value is not None:
                self.counts[key] += 1
                self.largest[key] = max(self.largest[key], abs(value))


def _bucket_of(shift: int) -> Callable[[float], int]:
    # int() of the scaled value is non-decreasing in the value: buckets are ordered ranges
    return lambda value: int(value * 1e6) >> shift


def exact_percentiles(
    columns: Callable[[], Iterable[tuple[float | None, ...]]],
    counts: list[int],
    largest: list[float],
    qs: tuple[float, ...],
) -> list[list[float | None]]:
    """Per column, the linear-interpolated percentiles ``qs`` (0..100) of its non-None values,
    exactly, in two passes over ``columns()`` (each call iterates the rows afresh) and memory
    bounded by :data:`BUCKETS`; ``counts`` and ``largest`` are each column's number of values
    and largest magnitude. None for a column with no values."""
    width = len(counts)
    buckets = [
        _bucket_of(max(0, int(big * 1e6).bit_length() - BUCKETS.bit_length() + 1))
        for big in largest
    ]
    ranks: list[list[tuple[int, int, float]]] = []  # per column: (low rank, high rank, fraction)
    for n in counts:
        wanted = []
        for q in qs:
            pos = (n - 1) * q / 100.0
            low = int(pos)
            wanted.append((low, min(low + 1, n - 1), pos - low))
        ranks.append(wanted if n else [])
    per_bucket: list[Counter[int]] = [Counter() for _ in range(width)]
    for values in columns():
        for c in range(width):
            value = values[c]
            if value is not None:
                per_bucket[c][buckets[c](value)] += 1
    # the bucket holding each wanted rank, and the rank's place within it
    where: list[dict[int, tuple[int, int]]] = []
    for c in range(width):
        need = sorted({r for low, high, _ in ranks[c] for r in (low, high)})
        found: dict[int, tuple[int, int]] = {}
        seen = 0
        for bucket in sorted(per_bucket[c]):
            size = per_bucket[c][bucket]
            while need and need[0] < seen + size:
                found[need.pop(0)] = (bucket, seen)
            seen += size
        where.append(found)
    del per_bucket
    targets = [{bucket for bucket, _ in found.values()} for found in where]
    exact: list[dict[int, Counter[float]]] = [{b: Counter() for b in t} for t in targets]
    for values in columns():
        for c in range(width):
            value = values[c]
            if value is not None:
                held = exact[c].get(buckets[c](value))
                if held is not None:
                    held[value] += 1
    out: list[list[float | None]] = []
    for c in range(width):
        if not counts[c]:
            out.append([None] * len(qs))
            continue

        def at(rank: int, c: int = c) -> float:
            bucket, start = where[c][rank]
            seen = start
            for value in sorted(exact[c][bucket]):
                seen += exact[c][bucket][value]
                if rank < seen:
                    return value
            raise AssertionError("rank outside its bucket")  # pragma: no cover

        column: list[float | None] = []
        for low, high, fraction in ranks[c]:
            low_value, high_value = at(low), at(high)
            column.append(low_value + (high_value - low_value) * fraction)
        out.append(column)
    return out


def read_percentile_columns(path: Path) -> Iterator[tuple[float | None, ...]]:
    """The percentile keys of each succeeded row of a ``records.csv``."""
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader)
        status = header.index("status")
        picks = [header.index(key) for key in PERCENTILE_KEYS]
        for fields in reader:
            if fields[status] == "200":
                yield tuple(float(fields[i]) if fields[i] else None for i in picks)


def _csv_value(value: Any) -> Any:
    return "" if value is None else value


class StreamRecorder:
    """Writes a run's rows, samples and decisions into ``out`` as they are made."""

    def __init__(
        self,
        out: Path,
        slo_ttft_s: float,
        slo_tpot_s: float,
        replicas: int,
        classes: ClassStats | None = None,
    ) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.stats = RowStats(slo_ttft_s, slo_tpot_s)
        self.classes = classes  # per-class counters, when the workload defines classes
        self.fields = (*RECORD_FIELDS, "class") if classes is not None else RECORD_FIELDS
        self.decision_kinds: Counter[str] = Counter()
        self.replica_counts = ReplicaCounts(replicas)
        self._records = (out / "records.csv").open("w", newline="", encoding="utf-8")
        csv.writer(self._records, lineterminator="\n").writerow(self.fields)
        self._line = io.StringIO()  # one row's CSV text (a held row costs its text, not a dict)
        self._format = csv.writer(self._line, lineterminator="\n")
        self._pending: dict[int, str] = {}  # rows finished ahead of an earlier one, as text
        # the requests started and not finished, by index, and their decode streams' clean
        # ends ("<request>-d<attempt>" -> tokens): nothing of a request outlives its record
        self.live: dict[int, Arrival] = {}
        self.delivered: dict[str, int] = {}
        self.peak_live = 0  # the most of each held at once (they bound the run's memory)
        self.peak_held = 0
        self.peak_delivered = 0
        self._next = 0  # the index of the next row to write
        self._timeline: IO[str] | None = None
        self._samples: Any = None
        self._sample_fields: list[str] = []
        self._several = replicas > 1
        names = [f".decisions-{k}.jsonl" for k in range(replicas)] if self._several else []
        self._decision_paths = [out / name for name in names] or [out / "decisions.jsonl"]
        self._decisions = [p.open("w", encoding="utf-8") for p in self._decision_paths]

    @property
    def held(self) -> int:
        """Rows waiting in the reorder buffer for an earlier request to finish."""
        return len(self._pending)

    def start(self, index: int, arrival: Arrival) -> None:
        """The ``index``-th arrival has been handed to the router."""
        self.live[index] = arrival
        self.peak_live = max(self.peak_live, len(self.live))

    def deliver(self, rid: str, tokens: int) -> None:
        """An engine's stream ``rid`` ended cleanly after ``tokens`` tokens (the engines'
        ``on_delivered``): kept while its request runs, for its row's TPOT."""
        key = rid.rsplit("-", 1)[0]  # "req-<index>-d<attempt>-<hex>" -> "req-<index>-d<attempt>"
        parts = key.split("-")
        if parts[0] == "req" and int(parts[1]) in self.live:
            self.delivered[key] = tokens
            self.peak_delivered = max(self.peak_delivered, len(self.delivered))

    def finish(self, record: RequestRecord, replica: int) -> None:
        """A started request's record came in (served by router replica ``replica``)."""
        request_id = record.request_id
        index = int(request_id.rsplit("-", 1)[1])
        row = record_row(record, self.live.pop(index), self.delivered)
        for attempt in range(1, record.attempts + 1):
            self.delivered.pop(f"{request_id}-d{attempt}", None)
        self.replica_counts.add(replica, record)
        self.row(index, row)

    def row(self, index: int, row: dict[str, Any]) -> None:
        """The row of the ``index``-th arrival (each index exactly once, in any order)."""
        self.stats.add(row)
        if self.classes is not None:
            self.classes.add(row)
        line = self._line
        self._format.writerow([_csv_value(row[k]) for k in self.fields])
        text = line.getvalue()
        line.seek(0)
        line.truncate()
        if index != self._next:
            self._pending[index] = text
            self.peak_held = max(self.peak_held, len(self._pending))
            return
        write, pending = self._records.write, self._pending
        write(text)
        self._next += 1
        while self._next in pending:
            write(pending.pop(self._next))
            self._next += 1

    def sample(self, sample: dict[str, Any]) -> None:
        if self._samples is None:
            self._timeline = (self.out / "timeline.csv").open("w", newline="", encoding="utf-8")
            self._sample_fields = list(sample)
            self._samples = csv.DictWriter(
                self._timeline, fieldnames=self._sample_fields, lineterminator="\n"
            )
            self._samples.writeheader()
        self._samples.writerow({k: _csv_value(sample.get(k)) for k in self._sample_fields})

    def decision_sink(self, replica: int) -> Callable[[Decision], None]:
        """The ``on_decision`` of replica ``replica``'s decision log."""
        handle, kinds = self._decisions[replica], self.decision_kinds
        several = self._several

        def write(decision: Decision) -> None:
            kinds[decision.kind] += 1
            entry = decision.as_dict()
            if several:
                entry["replica"] = replica
            handle.write(json.dumps(entry, sort_keys=True) + "\n")

        return write

    def close(self, never_started: Iterable[Arrival], next_index: int) -> None:
        """Finish the files: rows for the requests still running (the run stopped at
        ``sim.max_sim_s``) and for ``never_started``, the arrivals from ``next_index`` on."""
        for index in sorted(self.live):
            self.row(index, unfinished_row(index, self.live[index]))
        self.live.clear()
        self.delivered.clear()
        for index, arrival in enumerate(never_started, next_index):
            self.row(index, unfinished_row(index, arrival))
        if self._pending:
            raise RuntimeError(f"rows from index {self._next} on were never given")
        self._records.close()
        if self._timeline is not None:
            self._timeline.close()
        for handle in self._decisions:
            handle.close()
        if self._several:
            self._merge_decisions()

    def _merge_decisions(self) -> None:
        handles = [path.open(encoding="utf-8") for path in self._decision_paths]
        try:
            with (self.out / "decisions.jsonl").open("w", encoding="utf-8") as merged:
                # heapq.merge is stable: ties in time keep replica order
                merged.writelines(heapq.merge(*handles, key=lambda line: json.loads(line)["t"]))
        finally:
            for handle in handles:
                handle.close()
            for path in self._decision_paths:
                path.unlink()
