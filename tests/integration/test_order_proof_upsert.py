"""Order-proof upsert: the final table is the same whatever order batches land in and however
often they are replayed, tombstones included (a key whose newest record is a tombstone has no
row), in SQLite and in a real PostgreSQL (no Spark: the sinks' Arrow path)."""

from __future__ import annotations

import sqlite3

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lagless.sinks import sink_from_url
from lagless.sinks.base import COLUMNS, TOMBSTONE, Target
from lagless.sinks.ledger import Batch
from lagless.sinks.task_files import FILE_SCHEMA
from lagless.sinks.upsert_order import LOG_TIME

TARGET = Target("events", "upsert", "raw")

# Keys written from several partitions (the partition count changed, as in seed 002); partition
# 0's timestamps go back at offset 2. Each record carries its log time (upsert_order.py: the
# newest timestamp of its partition up to it), as importer/rows.py gives it.
# A record without a value is a tombstone: keys 3 and 4 end deleted, key 2's tombstone is older
# than its newest record, and key 1 is deleted then written again.
LOG = [
    ("t", p, o, f"k{k}".encode(), None if dead else f"v{p}-{o}".encode(), ts)
    for p, o, k, ts, dead in [
        (0, 0, 1, 100, 0), (0, 1, 1, 105, 0), (0, 2, 2, 90, 0), (0, 3, 1, 105, 0),  # offset tie
        (1, 0, 1, 101, 1), (1, 1, 2, 300, 0), (1, 2, 3, 50, 0), (1, 3, 2, 300, 0),
        (2, 0, 3, 60, 1), (2, 1, 4, 10, 0), (2, 2, 1, 104, 0), (2, 3, 2, 200, 1), (2, 4, 4, 11, 1),
    ]
]  # fmt: skip
RECORDS = [
    (*r, max(s[5] for s in LOG if s[1] == r[1] and s[2] <= r[2])) for r in LOG
]  # (topic, partition, offset, key, value, timestamp, log time)


def rank(r):  # type: ignore[no-untyped-def]
    return (r[6], r[0], r[1], r[2])


def newest(records):  # type: ignore[no-untyped-def]
    """The rule, stated independently of SQL: per key the record of the highest rank
    (log time, topic, partition, offset); none where that is a tombstone."""
    winners: dict = {}
    for r in records:
        if r[3] not in winners or rank(r) > rank(winners[r[3]]):
            winners[r[3]] = r
    return sorted((r for r in winners.values() if r[4] is not None), key=lambda r: r[3])


def as_arrow(records) -> pa.Table:  # type: ignore[no-untyped-def]
    return pa.table(
        {name: [r[i] for r in records] for i, name in enumerate((*COLUMNS, LOG_TIME))}
        | {TOMBSTONE: [r[4] is None for r in records]},
        schema=FILE_SCHEMA.append(pa.field(LOG_TIME, pa.int64())).append(
            pa.field(TOMBSTONE, pa.bool_())
        ),
    )


batches = st.lists(
    st.lists(st.sampled_from(RECORDS), min_size=1, max_size=6), min_size=1, max_size=8
)


def sqlite_table(path) -> list:  # type: ignore[no-untyped-def]
    with sqlite3.connect(path) as conn:
        return conn.execute("SELECT * FROM events ORDER BY key").fetchall()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches=batches)
def test_sqlite_upsert_ends_the_same_in_any_order(tmp_path_factory, batches):
    path = tmp_path_factory.mktemp("db") / "out.db"
    sink = sink_from_url(f"sqlite:///{path}")
    sink.prepare(TARGET)
    for batch in batches:
        sink.write_arrow(as_arrow(batch).to_reader(), TARGET, Batch(0))  # type: ignore[attr-defined]
    assert sqlite_table(path) == newest([r for b in batches for r in b])


@pytest.mark.parametrize("order", [RECORDS, RECORDS[::-1], RECORDS[3:] + RECORDS[:3]])
def test_postgresql_upsert_ends_the_same_in_any_order_and_on_replay(postgres, order):
    import psycopg

    sink = sink_from_url(postgres.url)
    with psycopg.connect(postgres.url) as conn:
        conn.execute("DROP TABLE IF EXISTS events, events_tombstones")
    sink.prepare(TARGET)
    for start in range(0, len(order), 3):
        batch = as_arrow(order[start : start + 3])
        sink.write_arrow(batch.to_reader(), TARGET, Batch(0))  # type: ignore[attr-defined]
        sink.write_arrow(batch.to_reader(), TARGET, Batch(0))  # type: ignore[attr-defined]
    with psycopg.connect(postgres.url) as conn:
        rows = conn.execute("SELECT * FROM events ORDER BY key").fetchall()
    found = [(t, p, o, bytes(k), bytes(v), ts, lt) for t, p, o, k, v, ts, lt in rows]
    assert found == newest(RECORDS)
