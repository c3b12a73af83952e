"""Which record of a key wins an upsert (sinks/upsert_order.py), property-tested on real
SQLite, Delta and Iceberg tables through the stores' own upsert code, without Spark.

A log of a few partitions whose timestamps go back at random, with tombstones, is cut into
batches at random points per partition; a batch may be replayed, and an import may end and a
new one start between two batches (it then reads the partitions' log times from the store's
ledger, as importer/job.py does). Each batch is shaped as importer/rows.py shapes it: every
record's log time (a running maximum of its partition's timestamps, from where the batch
starts), then one row per key, the highest rank. Spark's own part (rows.py's window and
coalescing) runs in the CLI cases (tests/integration/test_upsert_order.py).

Whatever the batching, replays and restarts, the table holds each key's record of the highest
rank over the whole log, and no key whose highest is a tombstone; also when a round of table
maintenance (compaction, expiry of all history) runs between two batches, as a continuous import
runs one: the ledger's log times survive it.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lagless.importer.maintenance import maintain_once
from lagless.sinks import Sink, sink_from_url
from lagless.sinks.base import TOMBSTONE, Target
from lagless.sinks.ledger import TP, Batch
from lagless.sinks.maintenance import Policy
from lagless.sinks.task_files import FILE_SCHEMA
from lagless.sinks.upsert_order import LOG_TIME

TOPIC = "t"
TARGET = Target("events", "upsert", "raw", run_id="import-a")
# Iceberg upserts merge-on-read (lagless's tables) or copy-on-write (a table that asks for it).
STORES = ("sqlite", "delta", "iceberg", "iceberg-cow")
KEYS = [b"k0", b"k1", b"k2", b"k3"]
ROW_SCHEMA = FILE_SCHEMA.append(pa.field(LOG_TIME, pa.int64())).append(
    pa.field(TOMBSTONE, pa.bool_())
)


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes
    timestamp: int
    dead: bool

    @property
    def value(self) -> bytes | None:
        return None if self.dead else b"p%d-o%d" % (self.partition, self.offset)


def log_times(records: list[Record], carried: int | None) -> list[int]:
    """Each record's log time: the newest timestamp of its partition up to it."""
    found = []
    for record in records:
        carried = record.timestamp if carried is None else max(carried, record.timestamp)
        found.append(carried)
    return found


def rank(record: Record, log_time: int) -> tuple[int, str, int, int]:
    return (log_time, TOPIC, record.partition, record.offset)


def winners(ranked: list[tuple[Record, int]]) -> dict[bytes, tuple[Record, int]]:
    """Per key, the record of the highest rank (a tombstone included)."""
    best: dict[bytes, tuple[Record, int]] = {}
    for record, log_time in ranked:
        held = best.get(record.key)
        if held is None or rank(record, log_time) > rank(*held):
            best[record.key] = (record, log_time)
    return best


def expected(log: dict[int, list[Record]]) -> list[tuple[bytes, int, int, bytes | None]]:
    ranked = [
        (record, lt)
        for records in log.values()
        for record, lt in zip(records, log_times(records, None), strict=True)
    ]
    return sorted(
        (r.key, r.partition, r.offset, r.value) for r, _ in winners(ranked).values() if not r.dead
    )


def rows_of(ranked: list[tuple[Record, int]]) -> pa.Table:
    """A batch's rows as rows.accepted makes them: one per key, the highest rank."""
    kept = sorted(winners(ranked).values(), key=lambda each: each[0].key)
    columns = {
        "topic": [TOPIC] * len(kept),
        "partition": [r.partition for r, _ in kept],
        "offset": [r.offset for r, _ in kept],
        "key": [r.key for r, _ in kept],
        "value": [r.value for r, _ in kept],
        "timestamp": [r.timestamp for r, _ in kept],
        LOG_TIME: [lt for _, lt in kept],
        TOMBSTONE: [r.dead for r, _ in kept],
    }
    return pa.table(columns, schema=ROW_SCHEMA)


def opened(store: str, folder: Path) -> Sink:
    if store == "sqlite":
        return sink_from_url(f"sqlite:///{folder}/out.db")
    return sink_from_url(f"{store.removesuffix('-cow')}:///{folder}/lake")


def copy_on_write(sink: Sink, store: str) -> None:
    """The Iceberg tables set to upsert copy-on-write, as their owner may set them."""
    from lagless.sinks.iceberg.row_delta import MERGE_MODE

    if store != "iceberg-cow":
        return
    for name in (TARGET.table, TARGET.tombstone_table):
        with sink._table(name).transaction() as tx:  # type: ignore[attr-defined]
            tx.set_properties({MERGE_MODE: "copy-on-write"})


def write(sink: Sink, store: str, rows: pa.Table, batch: Batch, staging: Path) -> None:
    """The store's upsert, as its write() runs it once Spark's tasks staged the rows."""
    if store == "sqlite":
        sink.write_arrow(rows.to_reader(), TARGET, batch)  # type: ignore[attr-defined]
        return
    if store == "delta":
        sink._upsert(rows, TARGET, batch)  # type: ignore[attr-defined]
        return
    staging.mkdir(parents=True, exist_ok=True)
    path = str(staging / f"part-{batch.id}-{len(os.listdir(staging))}.parquet")
    pq.write_table(rows, path)
    sink._upsert([path], TARGET, batch)  # type: ignore[attr-defined]


def table(store: str, sink: Sink) -> list[tuple[bytes, int, int, bytes | None]]:
    columns = ["key", "partition", "offset", "value"]
    if store == "sqlite":
        if not os.path.exists(sink.location):
            return []
        with sqlite3.connect(sink.location) as conn:
            found = conn.execute('SELECT key, "partition", "offset", value FROM events').fetchall()
    elif store == "delta":
        folder = os.path.join(sink.location, "events")
        if not os.path.isdir(os.path.join(folder, "_delta_log")):
            return []
        found = list(pl.read_delta(folder, columns=columns).iter_rows())
    else:
        found = iceberg_table(sink.location, columns)
    return sorted((bytes(k), int(p), int(o), v if v is None else bytes(v)) for k, p, o, v in found)


def iceberg_table(
    warehouse: str, columns: list[str], table: str = "default.events"
) -> list[tuple[object, ...]]:
    """Through pyiceberg's SQL catalog, as a reader would open the warehouse."""
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog(
        "lagless", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}"
    )
    try:
        rows = catalog.load_table(table).scan().to_arrow().select(columns)
    finally:
        catalog.engine.dispose()
    return [tuple(r[c] for c in columns) for r in rows.to_pylist()]


@st.composite
def logs(draw: st.DrawFn) -> dict[int, list[Record]]:
    """Two or three partitions of keys k0..k3 whose timestamps go up and back at random."""
    log = {}
    for partition in range(draw(st.integers(2, 3))):
        count = draw(st.integers(1, 12))
        keys = draw(
            st.lists(st.sampled_from([b"k0", b"k1", b"k2", b"k3"]), min_size=count, max_size=count)
        )
        stamps = draw(st.lists(st.integers(0, 30), min_size=count, max_size=count))
        dead = draw(st.lists(st.booleans(), min_size=count, max_size=count))
        log[partition] = [
            Record(partition, o, keys[o], stamps[o], dead[o] and o % 3 == 0) for o in range(count)
        ]
    return log


@dataclass(frozen=True)
class Step:
    sizes: tuple[int, ...]  # records of each partition in the batch
    replayed: bool  # committed twice (a crash after the store's commit, before Spark's)
    restart: bool  # a new import starts before it: log times read from the ledger
    # A round of maintenance after it: every small file merged, no history kept (not SQLite).
    maintained: bool = False


steps = st.lists(
    st.builds(
        Step,
        st.lists(st.integers(0, 5), min_size=3, max_size=3).map(tuple),
        st.booleans(),
        st.booleans(),
        st.booleans(),
    ),
    min_size=1,
    max_size=6,
)


@pytest.mark.parametrize("store", STORES)
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(log=logs(), plan=steps)
# Two batches' files merged with no history kept, then a new import: it reads the log times
# from the ledger, which the compaction kept (k0 at offset 2 has log time 10, and wins).
@example(
    log={
        0: [
            Record(0, 0, b"k0", 10, False),
            Record(0, 1, b"k1", 5, False),
            Record(0, 2, b"k0", 6, False),
        ],
        1: [Record(1, 0, b"k2", 1, False)],
    },
    plan=[
        Step((1, 1, 1), False, False),
        Step((1, 1, 1), False, False, maintained=True),
        Step((1, 1, 1), False, True),
    ],
)
def test_the_table_is_the_highest_rank_per_key_whatever_the_batching(
    store: str, log: dict[int, list[Record]], plan: list[Step], tmp_path_factory
) -> None:
    folder = tmp_path_factory.mktemp(store)
    sink = opened(store, folder)
    sink.prepare(TARGET)
    copy_on_write(sink, store)
    partitions: list[TP] = [(TOPIC, p) for p in log]
    position = dict.fromkeys(log, 0)
    carried: dict[TP, int] = {}
    # Whatever the plan, the last batch takes the rest of every partition.
    plan = [*plan, Step((99, 99, 99), False, False)]
    for batch_id, step in enumerate(plan):
        if step.restart:  # a new import: where the ledger ends, and its log times there
            held = sink.ledger(TARGET, partitions)
            position = {p: held.get((TOPIC, p), 0) for p in log}
            carried = sink.log_times(TARGET, partitions)
        ranked: list[tuple[Record, int]] = []
        ranges = {}
        for p, records in log.items():
            start = position[p]
            end = min(len(records), start + step.sizes[p % len(step.sizes)])
            taken = records[start:end]
            times = log_times(taken, carried.get((TOPIC, p)))
            ranked += zip(taken, times, strict=True)
            ranges[(TOPIC, p)] = (start, end)
            position[p] = end
            if times:
                carried[(TOPIC, p)] = times[-1]
        batch = Batch(batch_id, ranges, {tp: ms for tp, ms in carried.items() if tp in ranges})
        if not ranked:
            continue
        rows = rows_of(ranked)
        for _ in range(2 if step.replayed else 1):
            write(sink, store, rows, batch, folder / "staging")
        if step.maintained and store != "sqlite":
            maintain_once(sink.url, TARGET.table, Policy(1024 * 1024, keep_history_s=0))

    assert table(store, sink) == expected(log)
    if store == "iceberg-cow":  # the files holding replaced rows were rewritten instead
        from lagless.sinks.iceberg.maintenance import _delete_files

        assert not _delete_files(sink._table(TARGET.table))  # type: ignore[attr-defined]
    # The ledger keeps each partition's log time where it ends.
    held = sink.ledger(TARGET, partitions)
    assert sink.log_times(TARGET, partitions) == {
        (TOPIC, p): max(r.timestamp for r in log[p][:end]) for (_, p), end in held.items()
    }
    sink.close()


def legacy_table(store: str, sink: Sink) -> None:
    """An upsert table as a lagless before the rank made it: no log_time column, tombstones
    without topic and log_time, a ledger without log times. Key k0 from partition 1 at 100,
    k1 from partition 1 at 200; k2's tombstone from partition 1 at 300."""
    held = {
        "topic": [TOPIC, TOPIC],
        "partition": [1, 1],
        "offset": [0, 1],
        "key": [b"k0", b"k1"],
        "value": [b"old-k0", b"old-k1"],
        "timestamp": [100, 200],
    }
    rows = pa.table(held, schema=pa.schema([f for f in ROW_SCHEMA if f.name in held]))
    graves = pa.table(
        {"key": [b"k2"], "partition": [1], "offset": [2], "timestamp": [300]},
        schema=pa.schema(
            [
                ("key", pa.binary()),
                ("partition", pa.int32()),
                ("offset", pa.int64()),
                ("timestamp", pa.int64()),
            ]
        ),
    )
    if store == "sqlite":
        from lagless.sinks.sql import Layout, create_table, layouts

        with sqlite3.connect(sink.location) as conn:
            for layout in layouts(TARGET, "sqlite"):
                kept = tuple(c for c in layout.columns if c[0] != LOG_TIME)
                if layout.table == TARGET.tombstone_table:
                    kept = tuple(c for c in kept if c[0] != "topic")
                conn.execute(create_table(Layout(layout.table, kept, layout.unique)))
            for table, data in (("events", rows), ("events_tombstones", graves)):
                names = ", ".join(f'"{n}"' for n in data.column_names)
                marks = ", ".join("?" for _ in data.column_names)
                conn.executemany(
                    f"INSERT INTO {table} ({names}) VALUES ({marks})",
                    [tuple(r.values()) for r in data.to_pylist()],
                )
        return
    if store == "delta":
        from deltalake import write_deltalake

        for table, data in (("events", rows), ("events_tombstones", graves)):
            write_deltalake(f"{sink.location}/{table}", data, description="lagless --write upsert")
        return
    from pyiceberg.catalog.sql import SqlCatalog

    os.makedirs(sink.location, exist_ok=True)
    catalog = SqlCatalog(
        "lagless", uri=f"sqlite:///{sink.location}/catalog.db", warehouse=f"file://{sink.location}"
    )
    catalog.create_namespace_if_not_exists("default")
    for table, data in (("events", rows), ("events_tombstones", graves)):
        made = catalog.create_table(
            f"default.{table}", schema=data.schema, properties={"lagless.write": "upsert"}
        )
        made.append(data)
    catalog.engine.dispose()


@pytest.mark.parametrize("store", STORES)
def test_a_table_an_earlier_lagless_made_keeps_working(store: str, tmp_path: Path) -> None:
    """Its rows rank by their timestamp; the new columns are added, empty for its rows."""
    sink = opened(store, tmp_path)
    legacy_table(store, sink)
    sink.check(TARGET)
    sink.prepare(TARGET)
    copy_on_write(sink, store)
    batch = [
        (Record(0, 0, b"k0", 150, False), 150),  # outranks k0's row (100)
        (Record(0, 1, b"k1", 120, False), 150),  # log time 150 < 200: k1's row stays
        (Record(0, 2, b"k2", 10, False), 290),  # below k2's tombstone (300): stays deleted
        (Record(0, 3, b"k3", 5, False), 290),
    ]

    write(
        sink,
        store,
        rows_of(batch),
        Batch(0, {(TOPIC, 0): (0, 4)}, {(TOPIC, 0): 290}),
        tmp_path / "st",
    )

    assert table(store, sink) == [
        (b"k0", 0, 0, b"p0-o0"),
        (b"k1", 1, 1, b"old-k1"),
        (b"k3", 0, 3, b"p0-o3"),
    ]
    assert sink.log_times(TARGET, [(TOPIC, 0)]) == {(TOPIC, 0): 290}
    sink.close()


@pytest.mark.parametrize("store", STORES)
def test_a_batch_that_changes_no_row_is_still_in_the_ledger(store: str, tmp_path: Path) -> None:
    """A tombstone of a key the table lacks: no row changes (Delta's MERGE then commits
    nothing by itself), yet the batch's range and log time are kept: a rerun would otherwise
    read the batch again and find the tombstones' table holding it already (exit 75, again)."""
    sink = opened(store, tmp_path)
    sink.prepare(TARGET)
    copy_on_write(sink, store)
    rows = rows_of([(Record(1, 0, b"k9", 40, True), 40)])

    write(sink, store, rows, Batch(0, {(TOPIC, 1): (0, 1)}, {(TOPIC, 1): 40}), tmp_path / "st")

    assert sink.ledger(TARGET, [(TOPIC, 1)]) == {(TOPIC, 1): 1}
    assert sink.log_times(TARGET, [(TOPIC, 1)]) == {(TOPIC, 1): 40}
    assert table(store, sink) == []
    sink.close()
