"""The Iceberg sink (issue 19): executors write the files, the driver adds each batch's files in
one commit whose snapshot summary records the batch's ranges, upserts newer-only with
tombstones, typed columns and a field added later. Tables are read back through pyiceberg's own
SQL catalog, as README says to, and polars; expectations come from the topic itself.

Kill -9 at the failpoints is in test_crash_safety.py, the ledger's cases in test_ledger.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from confluent_kafka import Producer
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import Table

from lagless.importer.checkpoint import batch_end_offsets
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from tests.harness.plans import tasks_writer
from tests.integration.test_crash_safety import Record, in_batches, read_topic
from tests.integration.test_delta import newest_per_key, produce_with_tombstones

pytestmark = pytest.mark.spark

COLUMNS = ["partition", "offset", "key", "value", "timestamp"]


@contextmanager
def catalog(warehouse: Path) -> Iterator[SqlCatalog]:
    """The warehouse's catalog, opened as README tells a reader to."""
    opened = SqlCatalog(
        "lagless", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}"
    )
    try:
        yield opened
    finally:
        opened.engine.dispose()


def load(warehouse: Path, name: str) -> Table:
    with catalog(warehouse) as opened:
        return opened.load_table(name if "." in name else f"default.{name}")


def rows_of(table: Table, columns: list[str] = COLUMNS) -> list[tuple[Any, ...]]:
    data = table.scan(selected_fields=tuple(columns)).to_arrow().to_pylist()
    return sorted(tuple(row[c] for c in columns) for row in data)


def spec_for(kafka: KafkaConfig, topic: str, tmp_path: Path, **over: object) -> ImportSpec:
    values: dict[str, object] = {
        "kafka": kafka,
        "topics": (topic,),
        "sink_url": f"iceberg:///{tmp_path}/lake",
        "checkpoint": str(tmp_path / "ckpt"),
        "max_records_per_batch": 150,
    }
    values.update(over)
    return ImportSpec(**values)  # type: ignore[arg-type]


def test_raw_append_adds_the_task_files_one_snapshot_per_batch_with_its_ranges(
    broker, kafka, topic_name, tmp_path, spark, monkeypatch
):
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # its faster planner is a plugin
    broker.create_topic(topic_name, 2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for n in range(500):
        producer.produce(topic_name, value=b"v%d" % n, key=b"k%d" % (n % 7), partition=n % 2)
    producer.flush(30)
    records = read_topic(kafka, topic_name, 2)
    # The batches' own snapshots and files: no round of compaction after the 4th.
    spec = spec_for(kafka, topic_name, tmp_path, maintain_every_s=0)
    assert tasks_writer(spec) is not None  # the source's tasks write the files

    summary = run_import(spec, spark=spark)

    table = load(tmp_path / "lake", topic_name)
    expected = sorted((r.partition, r.offset, r.key, r.value, r.timestamp) for r in records)
    assert rows_of(table) == expected
    frame = pl.scan_iceberg(table).select(COLUMNS).collect()
    assert sorted(frame.iter_rows()) == expected
    # One snapshot per batch, each saying which offsets it added and what the table holds.
    snapshots = table.snapshots()
    assert summary.batches == 4 == len(snapshots)
    held: dict[str, int] = {}
    for batch_id, snapshot in enumerate(snapshots):
        assert snapshot.summary is not None
        ranges = json.loads(snapshot.summary["lagless.ranges"])["ranges"]
        ends = batch_end_offsets(spec.checkpoint, batch_id)
        assert {(r["topic"], r["partition"]): r["end"] for r in ranges} == ends
        held = {f"{e['topic']}[{e['partition']}]": e["end"] for e in _held(snapshot)}
        assert held == {f"{t}[{p}]": end for (t, p), end in ends.items()}
    assert held == {f"{topic_name}[0]": 250, f"{topic_name}[1]": 250}
    # The files the tasks wrote are the table's, added as they are; none is left staged.
    files = [task.file.file_path for task in table.scan().plan_files()]
    assert files and all(os.path.basename(f).startswith("part-") for f in files)
    staging = tmp_path / "lake" / "default" / topic_name / "_staging"
    assert not any(names for _, _, names in os.walk(staging))


def _held(snapshot: Any) -> list[dict[str, Any]]:
    return json.loads(snapshot.summary["lagless.held"])


def test_upsert_keeps_the_newest_per_key_and_a_replayed_batch_adds_no_snapshot(
    broker, kafka, topic_name, tmp_path, spark
):
    broker.create_topic(topic_name, 2)
    produce_with_tombstones(kafka, topic_name)
    records = read_topic(kafka, topic_name, 2)
    newest = newest_per_key(records)
    assert any(r.value is None for r in newest.values())  # keys that end deleted
    spec = spec_for(kafka, topic_name, tmp_path, write="upsert", value_format="json")

    summary = run_import(spec, spark=spark)

    lake = tmp_path / "lake"
    expected = sorted(
        (r.partition, r.offset, r.key, r.value.decode(), r.timestamp)
        for r in newest.values()
        if r.value is not None
    )
    table = load(lake, topic_name)
    assert rows_of(table) == expected
    graves: list[Record] = []
    for batch_id in range(summary.batches):
        batch = in_batches(records, spec.checkpoint, batch_id, batch_id + 1, topic_name)
        graves += [r for r in newest_per_key(batch).values() if r.value is None]
    kept = load(lake, f"{topic_name}_tombstones")
    assert rows_of(kept, ["key", "partition", "offset"]) == sorted(
        (r.key, r.partition, r.offset) for r in newest_per_key(graves).values()
    )

    # The checkpoint loses its last commit, as after a kill between the Iceberg commit and
    # Spark's. With nothing new the rerun is up to date without Spark (the table holds the
    # batch); once a record arrives, Spark replays the batch first: no snapshot for the replay,
    # one for the new record.
    last = summary.batches - 1
    for name in (str(last), f".{last}.crc"):
        os.remove(os.path.join(spec.checkpoint, "commits", name))
    snapshot = table.current_snapshot()
    assert snapshot is not None
    assert run_import(spec, spark=spark).batches == 0
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    producer.produce(topic_name, value=b'{"n": 1000}', key=b"new", partition=0)
    producer.flush(30)

    rerun = run_import(spec, spark=spark)

    assert rerun.batches == 2  # the replay, then the new record's batch
    again = load(lake, topic_name)
    newest_snapshot = again.current_snapshot()
    assert (
        newest_snapshot is not None and newest_snapshot.parent_snapshot_id == snapshot.snapshot_id
    )
    rows = rows_of(again)
    assert len(rows) == len(expected) + 1 and set(expected) <= set(rows)


DEALS_DDL = "id BIGINT NOT NULL, name STRING, price DECIMAL(12,2), tags ARRAY<STRING>"


def test_typed_columns_in_a_namespace_dead_letters_and_a_field_added_later(
    broker, kafka, topic_name, tmp_path, spark
):
    broker.create_topic(topic_name, 2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})

    def deal(i: int, **more: object) -> bytes:
        fields = {"id": i, "name": f"deal {i}", "price": f"{i}.25", "tags": [f"t{i}"], **more}
        return json.dumps(fields).encode()

    for i in range(30):
        producer.produce(topic_name, deal(i), str(i).encode(), partition=i % 2)
    producer.produce(topic_name, b"not json", b"x", partition=0)
    producer.flush(30)
    typed = {"value_format": "json", "value_schema": DEALS_DDL, "table": "sales.deals"}

    first = run_import(spec_for(kafka, topic_name, tmp_path, **typed), spark=spark)

    assert (first.imported, first.dead_lettered) == (30, 1)
    lake = tmp_path / "lake"
    table = load(lake, "sales.deals")
    assert [f.name for f in table.schema().fields] == [
        "topic",
        "partition",
        "offset",
        "key",
        "timestamp",
        "id",
        "name",
        "price",
        "tags",
    ]
    assert rows_of(table, ["id", "name", "price", "tags"]) == [
        (i, f"deal {i}", Decimal(f"{i}.25"), [f"t{i}"]) for i in range(30)
    ]
    letters = load(lake, "sales.deals_dlq")
    assert rows_of(letters, ["partition", "key", "value"]) == [(0, b"x", b"not json")]

    for i in range(30, 34):
        producer.produce(topic_name, deal(i, region="EU"), str(i).encode(), partition=i % 2)
    producer.flush(30)
    added = {**typed, "value_schema": DEALS_DDL + ", region STRING"}

    second = run_import(spec_for(kafka, topic_name, tmp_path, **added), spark=spark)

    assert second.imported == 4
    table = load(lake, "sales.deals")
    assert table.schema().fields[-1].name == "region"
    regions = rows_of(table, ["id", "region"])
    assert regions == [(i, None) for i in range(30)] + [(i, "EU") for i in range(30, 34)]
