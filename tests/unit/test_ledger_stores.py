"""The store is the ledger (sinks/ledger.py), property-tested on the real stores without Spark.

Each example is a sequence of imports into one table of a real SQLite file, Parquet folder or
Delta table: each import reads the store's ledger, starts where a Spark checkpoint (kept, lost,
or an older copy of it) and the ledger say, and commits batches of random sizes the way
importer/batch_writer.py does, through the stores' own task writers and commit_staged. Spark's
own part is modelled: a batch's end offsets are journaled before it runs, a crash before
Spark's commit replays that batch with the same ends on the next run. Imports get killed before
or after the store's commit, and a maintenance round (compaction, expiry) may follow. Whatever
happens, the table holds every record from offset 0 up to what its ledger says, each exactly
once.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lagless.importer.maintenance import ROUND_AFTER_BATCHES, Schedule, run_round
from lagless.planner.ranges import OffsetRange
from lagless.sinks import Sink, Target, maintenance_of, sink_from_url
from lagless.sinks.ledger import TP, Batch, ConcurrentImport, HeldRecord, batch_ranges, holds
from lagless.sinks.maintenance import RATIO, Policy
from lagless.source.executor_write import load_writer
from lagless.source.schema import ARROW_SCHEMA

TOPIC = "orders"
PARTITIONS = [(TOPIC, 0), (TOPIC, 1)]
LOG_END = 60  # records per partition
TARGET = Target("t", "append", "raw", run_id="import-a")
STORES = ("sqlite", "parquet", "delta", "iceberg")


def records(tp: TP, start: int, end: int) -> pa.RecordBatch:
    """The log's records [start, end) of a partition, as the source's tasks read them."""
    offsets = list(range(start, end))
    return pa.RecordBatch.from_pydict(
        {
            "key": [b"k%d" % (o % 7) for o in offsets],
            "value": [b"%s-%d-%d" % (tp[0].encode(), tp[1], o) for o in offsets],
            "topic": [tp[0]] * len(offsets),
            "partition": [tp[1]] * len(offsets),
            "offset": offsets,
            "timestamp": [1_700_000_000_000_000 + o * 1000 for o in offsets],
            "timestampType": [0] * len(offsets),
            "headers": [None] * len(offsets),
        },
        schema=ARROW_SCHEMA,
    )


def stored(url: str, location: str) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of every row of table t, duplicates kept."""
    return stored_table(url, location, "t")


def stored_table(url: str, location: str, table: str) -> list[tuple[str, int, int]]:
    if url.startswith("sqlite"):
        if not os.path.exists(location):
            return []
        with sqlite3.connect(location) as conn:
            query = f'SELECT topic, "partition", "offset" FROM "{table}"'
            return sorted(conn.execute(query).fetchall())
    if url.startswith("iceberg"):
        return iceberg_rows(location, table)
    folder = os.path.join(location, table)
    if url.startswith("delta"):
        if not os.path.isdir(os.path.join(folder, "_delta_log")):
            return []
        rows = pl.read_delta(folder, columns=["topic", "partition", "offset"]).iter_rows()
        return sorted((str(t), int(p), int(o)) for t, p, o in rows)
    files = [
        os.path.join(path, name)
        for path, _, names in os.walk(folder)
        if "/_" not in path.removeprefix(folder)
        for name in names
        if name.endswith(".parquet")
    ]
    rows = [
        r
        for f in files
        for r in pq.read_table(f).select(["topic", "partition", "offset"]).to_pylist()
    ]
    return sorted((r["topic"], r["partition"], r["offset"]) for r in rows)


def iceberg_rows(warehouse: str, table: str) -> list[tuple[str, int, int]]:
    """Through pyiceberg's SQL catalog, as a reader would open the warehouse."""
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.exceptions import NoSuchTableError

    if not os.path.exists(os.path.join(warehouse, "catalog.db")):
        return []
    catalog = SqlCatalog(
        "lagless", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}"
    )
    try:
        rows = catalog.load_table(f"default.{table}").scan().to_arrow()
    except NoSuchTableError:
        return []
    finally:
        catalog.engine.dispose()
    found = rows.select(["topic", "partition", "offset"]).to_pylist()
    return sorted((r["topic"], r["partition"], r["offset"]) for r in found)


def commit(sink: Sink, target: Target, batch: Batch) -> None:
    """A batch as batch_writer.py commits it when the source's tasks write: staged files of
    each partition's piece (the store's own task writer), the files, commit_staged."""
    writer_spec = sink.executor_writer(target)
    assert writer_spec is not None
    writer = load_writer(writer_spec.name, writer_spec.config, writer_spec.secret)
    sink.discard_staged(target)
    files = []
    for tp, (start, end) in batch.covered.items():
        piece = OffsetRange(tp[0], tp[1], start, end)
        where, left = writer.write([piece], iter([records(tp, start, end)]))
        assert left is None  # raw values: the tasks write them all
        files.append(where)
    held_before = sink.ledger(target, PARTITIONS)
    said = sink.commit_staged(files, target, batch)
    # What the store says it did (issue 31.5): a batch its ledger held is told apart (the
    # summary's "already in the table"; also one another import committed meanwhile); any
    # other gains a row per record, in every store.
    if batch.covered:
        replay = said is not None and said.replay
        assert replay or not holds(batch, held_before)
        if not replay:
            assert said is None or said.rows == sum(e - s for s, e in batch.covered.values())


def maintain(
    sink: Sink, thorough: bool, target_file_size: int = 2048, keep_history_s: float = 0
) -> None:
    """A round of compaction (by default files up to 2 KiB: these are small) and expiry (by
    default no history kept)."""
    maintenance = maintenance_of(sink, TARGET.run_id)
    assert maintenance is not None
    policy = Policy(target_file_size, keep_history_s, thorough=thorough)
    for table in maintenance.tables(TARGET.table):
        done = run_round(maintenance, table, policy, time.monotonic() + 60, raise_errors=True)
        assert done is not None


@dataclass
class Checkpoint:
    """Spark's part: each batch's end offsets, journaled before it runs; how many committed."""

    ends: list[dict[TP, int]] = field(default_factory=list)
    committed: int = 0

    def copy(self) -> Checkpoint:
        return Checkpoint([dict(e) for e in self.ends], self.committed)


@dataclass(frozen=True)
class Run:
    checkpoint: str  # "kept", "lost" (a fresh one), "older" (a copy from before the last run)
    batch_sizes: tuple[int, ...]
    crash: str | None  # None, "before-commit", "after-commit" (the store's, not Spark's)
    # A maintenance round after it (sinks/maintenance.py): None, "import" (stepwise, as between
    # batches), "maintain" (thorough, as `lagless maintain`); expiry with no history kept.
    maintain: str | None = None


runs = st.lists(
    st.builds(
        Run,
        st.sampled_from(["kept", "lost", "older"]),
        st.lists(st.integers(1, 25), min_size=1, max_size=4).map(tuple),
        st.sampled_from([None, None, "before-commit", "after-commit"]),
        st.sampled_from([None, "import", "maintain"]),
    ),
    min_size=1,
    max_size=5,
)


R = TypeVar("R", "Run", "RoutedRun")


def with_checkpoints(sequence: list[R]) -> Iterator[tuple[Checkpoint, R]]:
    """Each run with the checkpoint it starts from: the one kept, a fresh one (lost), or a
    copy of the one before the previous run (older)."""
    checkpoint, before = Checkpoint(), Checkpoint()
    for run in sequence:
        if run.checkpoint == "lost":
            checkpoint = Checkpoint()
        elif run.checkpoint == "older":
            checkpoint = before.copy()
        before = checkpoint.copy()
        yield checkpoint, run


def store_url(store: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    folder = tmp_path_factory.mktemp(store)
    return f"{store}:///{folder}/{'out.db' if store == 'sqlite' else 'lake'}"


def import_once(sink: Sink, checkpoint: Checkpoint, run: Run) -> None:
    """One import, as importer/job.py runs it: the ledger first, then Spark's replay of a
    batch journaled but not committed, then new batches, each ended at most by the log."""
    sink.prepare(TARGET)
    held = sink.ledger(TARGET, PARTITIONS)
    assert all(top <= LOG_END for top in held.values())
    first_start = {tp: max(0, held.get(tp, 0)) for tp in PARTITIONS}

    def start_of(batch_id: int) -> dict[TP, int]:
        return checkpoint.ends[batch_id - 1] if batch_id else first_start

    plans: list[int] = []
    if len(checkpoint.ends) > checkpoint.committed:
        plans.append(checkpoint.committed)  # Spark replays the journaled batch first
    for size in run.batch_sizes:
        batch_id = len(checkpoint.ends)
        begun = start_of(batch_id)
        # The source plans nothing below what the store holds (heldOffsets).
        begun = {tp: max(o, held.get(tp, o)) for tp, o in begun.items()}
        checkpoint.ends.append({tp: min(LOG_END, o + size) for tp, o in begun.items()})
        plans.append(batch_id)
    for number, batch_id in enumerate(plans):
        batch = Batch(batch_id, batch_ranges(start_of(batch_id), checkpoint.ends[batch_id], held))
        last = number == len(plans) - 1
        if last and run.crash == "before-commit":
            return
        commit(sink, TARGET, batch)
        if last and run.crash == "after-commit":
            return
        checkpoint.committed = batch_id + 1


@pytest.mark.parametrize("store", STORES)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=runs)
def test_no_sequence_of_imports_crashes_and_lost_checkpoints_doubles_or_skips(
    store: str, sequence: list[Run], tmp_path_factory: pytest.TempPathFactory
) -> None:
    url = store_url(store, tmp_path_factory)
    sink = sink_from_url(url)
    for checkpoint, run in with_checkpoints(sequence):
        import_once(sink, checkpoint, run)
        held_before = sink.ledger(TARGET, PARTITIONS)
        if run.maintain is not None and store != "sqlite":
            maintain(sink, thorough=run.maintain == "maintain")
            assert sink.ledger(TARGET, PARTITIONS) == held_before  # compaction kept the ledger

        rows = stored(url, sink.location)
        held = sink.ledger(TARGET, PARTITIONS)
        expected = sorted((t, p, o) for (t, p), top in held.items() for o in range(top))
        assert rows == expected  # every record below the ledger's mark, each once


@pytest.mark.parametrize("store", ["parquet", "delta", "iceberg"])
def test_two_imports_of_the_same_offsets_at_once_never_double(store: str, tmp_path: Path) -> None:
    """Both read the ledger before either committed. The second to commit meets offsets the
    first wrote: the same ranges are a replay (nothing added), overlapping ones are refused
    with ConcurrentImport (exit 75: its rerun resumes after what the table holds)."""
    url = f"{store}:///{tmp_path}/lake"
    first, second = sink_from_url(url), sink_from_url(url)
    a = Target("t", "append", "raw", run_id="import-a")
    b = Target("t", "append", "raw", run_id="import-b")
    for sink, target in ((first, a), (second, b)):
        sink.prepare(target)
        assert sink.ledger(target, PARTITIONS) == {}
    commit(first, a, Batch(0, {(TOPIC, 0): (0, 20)}))
    commit(second, b, Batch(0, {(TOPIC, 0): (0, 20)}))  # the same offsets: nothing added
    with pytest.raises(ConcurrentImport):
        commit(second, b, Batch(1, {(TOPIC, 0): (10, 30)}))
    with pytest.raises(ConcurrentImport):
        commit(second, b, Batch(1, {(TOPIC, 0): (0, 20), (TOPIC, 1): (0, 5)}))  # mixed
    assert stored(url, first.location) == [(TOPIC, 0, o) for o in range(20)]
    assert first.ledger(a, PARTITIONS) == {(TOPIC, 0): 20}


@pytest.mark.parametrize("store", STORES)
def test_imports_of_two_topics_share_one_table(store: str, tmp_path: Path) -> None:
    """Different topics, each from its own checkpoint (batch ids both start at 0), into one
    table: neither replaces the other's batches."""
    url = f"{store}:///{tmp_path}/{'out.db' if store == 'sqlite' else 'lake'}"
    sink = sink_from_url(url)
    a = Target("t", "append", "raw", run_id="import-a")
    b = Target("t", "append", "raw", run_id="import-b")
    sink.prepare(a)
    commit(sink, a, Batch(0, {("orders", 0): (0, 10)}))
    commit(sink, b, Batch(0, {("refunds", 0): (0, 7)}))
    rows = stored(url, sink.location)
    assert rows == sorted(
        [("orders", 0, o) for o in range(10)] + [("refunds", 0, o) for o in range(7)]
    )
    assert sink.ledger(a, [("orders", 0), ("refunds", 0)]) == {("orders", 0): 10, ("refunds", 0): 7}


def test_parquet_batches_are_named_by_their_offsets(tmp_path: Path) -> None:
    """A batch's folder says what it holds: the digest of its ranges, listed beside its files
    in `_ranges.json` (hidden from readers), never Spark's batch id."""
    sink = sink_from_url(f"parquet:///{tmp_path}/lake")
    sink.prepare(TARGET)
    batch = Batch(0, {(TOPIC, 0): (0, 5), (TOPIC, 1): (3, 3)})
    commit(sink, TARGET, batch)
    folders = [n for n in os.listdir(tmp_path / "lake" / "t") if n.startswith("batch=")]
    assert folders == [f"batch={batch.digest()}"]
    listed = json.loads((tmp_path / "lake" / "t" / folders[0] / "_ranges.json").read_text())
    assert listed == {"ranges": [{"topic": TOPIC, "partition": 0, "start": 0, "end": 5}]}
    assert pq.read_table(tmp_path / "lake" / "t").num_rows == 5


def test_a_parquet_table_of_an_earlier_lagless_counts_by_its_rows(tmp_path: Path) -> None:
    """`batch=<n>` folders without `_ranges.json`: the ledger is what their files hold."""
    legacy = tmp_path / "lake" / "t" / "batch=0"
    legacy.mkdir(parents=True)
    rows = pa.Table.from_batches([records((TOPIC, 1), 0, 12)]).select(
        ["topic", "partition", "offset", "key", "value"]
    )
    pq.write_table(rows, legacy / "part-0.parquet")
    sink = sink_from_url(f"parquet:///{tmp_path}/lake")
    assert sink.ledger(TARGET, PARTITIONS) == {(TOPIC, 1): 12}


def test_a_parquet_compaction_killed_before_retiring_what_it_merged_is_rolled_forward(
    tmp_path: Path,
) -> None:
    """A kill between a merged folder's rename and its replaced folders' retirement leaves
    both visible (rows twice to a reader, the ledger unmoved); the next commit, under the
    table's lock, retires the folders the merged one names."""
    sink = sink_from_url(f"parquet:///{tmp_path}/lake")
    sink.prepare(TARGET)
    for n in range(4):
        commit(sink, TARGET, Batch(n, {(TOPIC, 0): (n * 5, n * 5 + 5)}))
    maintain(sink, thorough=True, target_file_size=1024 * 1024, keep_history_s=3600)
    table = tmp_path / "lake" / "t"
    retired = [p for p in table.iterdir() if p.name.startswith("_merged-")]
    assert len(retired) == 4
    for folder in retired:  # as the kill left them
        folder.rename(table / folder.name.split(".", 1)[1])
    assert len(stored(sink.url, sink.location)) == 40
    assert sink.ledger(TARGET, PARTITIONS) == {(TOPIC, 0): 20}

    commit(sink, TARGET, Batch(4, {(TOPIC, 0): (20, 25)}))

    assert stored(sink.url, sink.location) == [(TOPIC, 0, o) for o in range(25)]
    assert sink.ledger(TARGET, PARTITIONS) == {(TOPIC, 0): 25}


# A routed import (importer/routing.py): two topics, a table each, one Spark checkpoint.
ROUTES = {"ta": ("orders", [("orders", 0), ("orders", 1)]), "tb": ("refunds", [("refunds", 0)])}


@dataclass(frozen=True)
class RoutedRun:
    checkpoint: str  # as Run's
    batch_sizes: tuple[int, ...]
    # Where the last batch is killed: after this many of its tables' commits (None: not).
    crash_after_tables: int | None


routed_runs = st.lists(
    st.builds(
        RoutedRun,
        st.sampled_from(["kept", "lost", "older"]),
        st.lists(st.integers(1, 25), min_size=1, max_size=4).map(tuple),
        st.sampled_from([None, 0, 1, 2]),
    ),
    min_size=1,
    max_size=5,
)


def import_routed_once(sink: Sink, checkpoint: Checkpoint, run: RoutedRun) -> None:
    """One routed import, as importer/job.py and batch_writer.py run it: each table's ledger
    read on its own, the batches' ranges split by table (Destination.ranges_of), each table's
    part committed with its own ranges, one table after another."""
    from lagless.importer.routing import Destination

    destinations = [
        Destination(Target(table, "append", "raw", run_id="routed"), (topic,), tps, table)
        for table, (topic, tps) in ROUTES.items()
    ]
    held: dict[TP, int] = {}
    for each in destinations:
        sink.prepare(each.target)
        held.update(sink.ledger(each.target, each.partitions))
    partitions = [tp for each in destinations for tp in each.partitions]
    first_start = {tp: held.get(tp, 0) for tp in partitions}

    def start_of(batch_id: int) -> dict[TP, int]:
        return checkpoint.ends[batch_id - 1] if batch_id else first_start

    plans: list[int] = []
    if len(checkpoint.ends) > checkpoint.committed:
        plans.append(checkpoint.committed)
    for size in run.batch_sizes:
        batch_id = len(checkpoint.ends)
        begun = {tp: max(o, held.get(tp, o)) for tp, o in start_of(batch_id).items()}
        checkpoint.ends.append({tp: min(LOG_END, o + size) for tp, o in begun.items()})
        plans.append(batch_id)
    for number, batch_id in enumerate(plans):
        ranges = batch_ranges(start_of(batch_id), checkpoint.ends[batch_id], held)
        for index, each in enumerate(destinations):
            if number == len(plans) - 1 and index == run.crash_after_tables:
                return
            commit(sink, each.target, Batch(batch_id, each.ranges_of(ranges)))
        checkpoint.committed = batch_id + 1


@pytest.mark.parametrize("store", ["sqlite", "parquet", "delta"])
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sequence=routed_runs)
# A fresh checkpoint after both tables took a batch, killed between the tables' commits, then
# the checkpoint that was kept: each table resumes where its own ledger says.
@example(
    sequence=[
        RoutedRun("kept", (10,), None),
        RoutedRun("kept", (10,), 1),
        RoutedRun("lost", (20,), None),
    ]
)
@example(sequence=[RoutedRun("kept", (10, 5), 1), RoutedRun("kept", (30,), None)])
def test_a_crash_between_two_tables_commits_never_doubles_or_skips_in_either(
    store: str, sequence: list[RoutedRun], tmp_path_factory: pytest.TempPathFactory
) -> None:
    url = store_url(store, tmp_path_factory)
    sink = sink_from_url(url)
    for checkpoint, run in with_checkpoints(sequence):
        import_routed_once(sink, checkpoint, run)

        for table, (_, tps) in ROUTES.items():
            held = sink.ledger(Target(table, "append", "raw"), tps)
            expected = sorted((t, p, o) for (t, p), top in held.items() for o in range(top))
            assert stored_table(url, sink.location, table) == expected, table


@pytest.mark.parametrize("store", STORES)
def test_the_newest_row_of_each_partition_tells_its_record(store: str, tmp_path: Path) -> None:
    """Sink.newest_rows: the offset, timestamp (ms) and key of the row just below what the
    ledger holds, what a recreated topic is told apart by (ledger.recreated)."""
    url = f"{store}:///{tmp_path}/{'out.db' if store == 'sqlite' else 'lake'}"
    sink = sink_from_url(url)
    sink.prepare(TARGET)
    commit(sink, TARGET, Batch(0, {(TOPIC, 0): (0, 20), (TOPIC, 1): (0, 5)}))
    commit(sink, TARGET, Batch(1, {(TOPIC, 0): (20, 33)}))
    held = sink.ledger(TARGET, PARTITIONS)

    found = sink.newest_rows(TARGET, held)

    assert held == {(TOPIC, 0): 33, (TOPIC, 1): 5}
    assert found == {
        (TOPIC, 0): HeldRecord(32, 1_700_000_000_000 + 32, b"k%d" % (32 % 7)),
        (TOPIC, 1): HeldRecord(4, 1_700_000_000_000 + 4, b"k4"),
    }
    assert sink.newest_rows(TARGET, {(TOPIC, 1): 5}) == {(TOPIC, 1): found[(TOPIC, 1)]}
    if store != "sqlite":  # compaction and expiry change no row: the same newest rows
        maintain(sink, thorough=True, target_file_size=1024 * 1024)
        assert sink.ledger(TARGET, PARTITIONS) == held
        assert sink.newest_rows(TARGET, held) == found


def test_an_imports_rounds_cover_every_table_it_writes_those_of_new_topics_included(
    tmp_path: Path,
) -> None:
    """importer/maintenance.Schedule as a routed import's batch writer calls it, after every
    batch: a round, when due, merges the small batch folders of each table the import writes
    at that moment (a table a topic that appeared since brought included), ledgers unmoved."""
    sink = sink_from_url(f"parquet:///{tmp_path}/lake")
    targets = {name: Target(name, "append", "raw", run_id="import-a") for name in ("ta", "tb")}
    for target in targets.values():
        sink.prepare(target)
        for n in range(4):
            commit(sink, target, Batch(n, {(TOPIC, 0): (n * 5, n * 5 + 5)}))
    maintenance = maintenance_of(sink, "import-a")
    assert maintenance is not None
    imported = ["ta"]  # tb's topic appears later (job.admit_new_topics)
    now = [0.0]
    schedule = Schedule(
        maintenance, lambda: imported, Policy(1024 * 1024, 3600), every_s=10, clock=lambda: now[0]
    )

    def folders() -> dict[str, int]:
        lake = tmp_path / "lake"
        return {t: sum(p.name.startswith("batch=") for p in (lake / t).iterdir()) for t in targets}

    schedule.between_batches()  # not due yet
    assert folders() == {"ta": 4, "tb": 4}
    now[0] = 10.0
    schedule.between_batches()
    assert folders() == {"ta": 1, "tb": 4}
    imported.append("tb")
    now[0] = 15.0
    schedule.between_batches()  # 5 s since the last round
    assert folders() == {"ta": 1, "tb": 4}
    now[0] = 20.0
    schedule.between_batches()
    assert folders() == {"ta": 1, "tb": 1}
    for target in targets.values():
        assert sink.ledger(target, PARTITIONS) == {(TOPIC, 0): 20}
        assert stored_table(sink.url, sink.location, target.table) == [
            (TOPIC, 0, o) for o in range(20)
        ]


def test_a_table_written_by_enough_batches_gets_its_round_before_the_time_based_one(
    tmp_path: Path,
) -> None:
    """Between time-based rounds, a table gets a round of its own once ROUND_AFTER_BATCHES
    batches wrote to it (a reader then never opens more batch files than that beside the
    compacted ones); a table the batches did not write waits for the time-based round."""
    sink = sink_from_url(f"parquet:///{tmp_path}/lake")
    targets = {name: Target(name, "append", "raw", run_id="import-a") for name in ("ta", "tb")}
    maintenance = maintenance_of(sink, "import-a")
    assert maintenance is not None
    now = [0.0]
    schedule = Schedule(
        maintenance,
        lambda: list(targets),
        Policy(1024 * 1024, 3600),
        every_s=60,
        clock=lambda: now[0],
    )

    def folders() -> dict[str, int]:
        lake = tmp_path / "lake"
        return {t: sum(p.name.startswith("batch=") for p in (lake / t).iterdir()) for t in targets}

    for target in targets.values():
        sink.prepare(target)
    for n in range(RATIO):  # an earlier run's batches
        commit(sink, targets["tb"], Batch(n, {(TOPIC, 0): (n * 5, n * 5 + 5)}))
    schedule.between_batches(["tb"])
    for n in range(ROUND_AFTER_BATCHES):
        assert folders() == {"ta": n, "tb": RATIO}
        commit(sink, targets["ta"], Batch(n, {(TOPIC, 0): (n * 5, n * 5 + 5)}))
        now[0] += 1
        schedule.between_batches(["ta"])
    assert folders() == {"ta": 1, "tb": RATIO}  # tb: one batch since its last round
    now[0] = 60.0
    schedule.between_batches([])  # the time-based round takes every table
    assert folders() == {"ta": 1, "tb": 1}
    assert stored_table(sink.url, sink.location, "ta") == [(TOPIC, 0, o) for o in range(20)]
    assert sink.ledger(targets["ta"], PARTITIONS) == {(TOPIC, 0): 20}


def test_a_delta_table_whose_expiry_removes_its_size_is_expired_after_each_batch_writing_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Delta's expiry tells the live bytes: once one removes as much as the table holds (here
    the batch files a compaction merged; a Delta upsert's MERGE does it every batch), the
    table is expired after each batch that writes it, until one finds it calm. Real time for
    the 1 s window (Delta's vacuum reads the clock); the schedule's own clock is the test's."""
    sink = sink_from_url(f"delta:///{tmp_path}/lake")
    sink.prepare(TARGET)
    maintenance = maintenance_of(sink, TARGET.run_id)
    assert maintenance is not None
    now = [0.0]
    schedule = Schedule(
        maintenance, lambda: [TARGET.table], Policy(1024 * 1024, 0), 60, clock=lambda: now[0]
    )

    def batch(n: int) -> None:
        commit(sink, TARGET, Batch(n, {(TOPIC, 0): (n * 5, n * 5 + 5)}))

    def parquet_files() -> int:
        return sum(1 for p in (tmp_path / "lake" / TARGET.table).glob("*.parquet"))

    for n in range(RATIO):
        batch(n)
    now[0] = 1.0
    with caplog.at_level(logging.INFO, logger="lagless.importer.maintenance"):
        schedule.between_batches([TARGET.table])  # compacts; what it replaced is in the window
        assert parquet_files() == RATIO + 1
        time.sleep(1.1)
        batch(RATIO)
        now[0] = 2.0
        schedule.between_batches([TARGET.table])  # expiry due: the batch files are removed
        assert parquet_files() == 2
        assert TARGET.table in schedule.churning
        batch(RATIO + 1)
        now[0] = 2.5  # the next time-based expiry is at 3.0
        schedule.between_batches([TARGET.table])  # expired again: nothing out of the window
        assert TARGET.table not in schedule.churning
    said = [r.getMessage() for r in caplog.records if "rewrites itself" in r.getMessage()]
    assert said and said[0].startswith(f"maintenance: {TARGET.table} rewrites itself between")
    assert any(
        r.getMessage() == f"maintenance: {TARGET.table} no longer rewrites itself: expired as usual"
        for r in caplog.records
    )
    assert stored_table(sink.url, sink.location, TARGET.table) == [
        (TOPIC, 0, o) for o in range((RATIO + 2) * 5)
    ]
