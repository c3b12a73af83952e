"""The Delta sink (issue 11): executors write the files, the driver commits each batch in one
Delta transaction that records the batch, upserts MERGE newer-only with tombstones. Tables are
read back with polars and pyarrow, the expectations computed from the topic itself.

Kill -9 at every failpoint is in test_crash_safety.py (its matrix holds Delta too).
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from confluent_kafka import Producer
from deltalake import DeltaTable

from lagless.importer.checkpoint import batch_end_offsets
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from tests.harness.plans import tasks_writer
from tests.integration.test_crash_safety import Record, in_batches, is_newer, read_topic

pytestmark = pytest.mark.spark

COLUMNS = ["partition", "offset", "key", "value", "timestamp"]


def delta_rows(path: Path) -> list[tuple[object, ...]]:
    """The table as sorted tuples, through polars."""
    frame = pl.read_delta(str(path)).select(COLUMNS)
    return sorted(tuple(row) for row in frame.iter_rows())


def spec_for(kafka: KafkaConfig, topic: str, tmp_path: Path, **over: object) -> ImportSpec:
    values: dict[str, object] = {
        "kafka": kafka,
        "topics": (topic,),
        "sink_url": f"delta:///{tmp_path}/lake",
        "checkpoint": str(tmp_path / "ckpt"),
        "max_records_per_batch": 150,
    }
    values.update(over)
    return ImportSpec(**values)  # type: ignore[arg-type]


def produce_with_tombstones(kafka: KafkaConfig, topic: str) -> None:
    """Keys spread over two partitions, some deleted (null value), some deleted then written
    again, some deleted in one partition after a newer write in the other."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    clock = 1_700_000_000_000
    for n in range(400):
        key = f"k{n % 25}".encode()
        partition = (n // 7) % 2
        deleted = n % 9 == 4 or (n % 25 == 3 and n > 300)
        value = None if deleted else f'{{"n": {n}}}'.encode()
        producer.produce(topic, value=value, key=key, partition=partition, timestamp=clock + n)
    producer.flush(30)


def newest_per_key(records: list[Record]) -> dict[bytes | None, Record]:
    newest: dict[bytes | None, Record] = {}
    for r in records:
        if r.key not in newest or is_newer(r, newest[r.key]):
            newest[r.key] = r
    return newest


def test_raw_append_lands_every_record_once_readable_by_polars_and_pyarrow(
    broker, kafka, topic_name, tmp_path, spark
):
    broker.create_topic(topic_name, 2)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for n in range(500):
        producer.produce(topic_name, value=b"v%d" % n, key=b"k%d" % (n % 7), partition=n % 2)
    producer.flush(30)
    records = read_topic(kafka, topic_name, 2)
    # The batches' own commits: no round of compaction after the 4th.
    spec = spec_for(kafka, topic_name, tmp_path, maintain_every_s=0)
    assert tasks_writer(spec) is not None  # the source's tasks write the files

    summary = run_import(spec, spark=spark)

    table = tmp_path / "lake" / topic_name
    expected = sorted((r.partition, r.offset, r.key, r.value, r.timestamp) for r in records)
    assert delta_rows(table) == expected
    dataset = DeltaTable(str(table)).to_pyarrow_dataset()
    assert dataset.count_rows() == len(records) == summary.records
    # One commit per batch, each recording in the table's log how far it holds each partition.
    delta = DeltaTable(str(table))
    assert summary.batches == 4 and len(delta.history()) == 1 + summary.batches  # + create
    ends = batch_end_offsets(spec.checkpoint, summary.batches - 1)
    for (topic, partition), end in ends.items():
        assert delta.transaction_version(f"lagless:{topic}:{partition}") == end
    staging = table / "_staging"
    assert not any(files for _, _, files in os.walk(staging))
    # File statistics from the Parquet footers: the offset bounds let a reader skip files.
    assert dataset.filter(ds.field("offset") > 10**6).count_rows() == 0
    actions = pa.table(delta.get_add_actions(flatten=True))
    assert sum(actions.column("num_records").to_pylist()) == len(records)


def test_a_replayed_batch_is_recognised_and_skipped(broker, kafka, topic_name, tmp_path, spark):
    """The checkpoint loses its last commit, as after a kill between the Delta commit and
    Spark's. With nothing new, a rerun is up to date without Spark (the table holds the batch);
    once a record arrives, Spark replays the batch first: the table gets no second commit of
    it, only the new record's."""
    broker.create_topic(topic_name, 2)
    produce_with_tombstones(kafka, topic_name)
    spec = spec_for(kafka, topic_name, tmp_path, write="upsert", value_format="json")
    first = run_import(spec, spark=spark)
    table = tmp_path / "lake" / topic_name
    version, rows = DeltaTable(str(table)).version(), delta_rows(table)
    last = first.batches - 1
    for name in (str(last), f".{last}.crc"):
        os.remove(os.path.join(spec.checkpoint, "commits", name))

    assert run_import(spec, spark=spark).batches == 0  # up to date: the table holds the batch
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    producer.produce(topic_name, value=b'{"n": 1000}', key=b"new", partition=0)
    producer.flush(30)
    rerun = run_import(spec, spark=spark)

    assert rerun.batches == 2  # the replay, then the new record's batch
    assert DeltaTable(str(table)).version() == version + 1
    after = delta_rows(table)
    assert len(after) == len(rows) + 1 and set(rows) <= set(after)


def test_upsert_merges_newer_only_and_tombstones_delete(broker, kafka, topic_name, tmp_path, spark):
    broker.create_topic(topic_name, 2)
    produce_with_tombstones(kafka, topic_name)
    records = read_topic(kafka, topic_name, 2)
    newest = newest_per_key(records)
    deleted = {k for k, r in newest.items() if r.value is None}
    revived = {r.key for r in records if r.value is None} - deleted
    assert deleted and revived  # keys that end deleted, and keys written again after a delete
    spec = spec_for(kafka, topic_name, tmp_path, write="upsert", value_format="json")

    summary = run_import(spec, spark=spark)

    lake = tmp_path / "lake"
    expected = sorted(
        (r.partition, r.offset, r.key, r.value.decode(), r.timestamp)
        for r in newest.values()
        if r.value is not None
    )
    assert delta_rows(lake / topic_name) == expected
    # Spark without Delta's jars reads the current version's live files (README's recipe):
    # after MERGEs rewrote files, the same rows, none of the replaced files' stale ones.
    live = spark.read.parquet(*DeltaTable(str(lake / topic_name)).file_uris())
    assert sorted(tuple(row) for row in live.select(*COLUMNS).collect()) == expected
    # A batch keeps the newest record of each key; its tombstones are kept newer-only.
    graves: list[Record] = []
    for batch_id in range(summary.batches):
        batch = in_batches(records, spec.checkpoint, batch_id, batch_id + 1, topic_name)
        graves += [r for r in newest_per_key(batch).values() if r.value is None]
    kept = pl.read_delta(str(lake / f"{topic_name}_tombstones"))
    assert sorted(kept.select("key", "partition", "offset").iter_rows()) == sorted(
        (r.key, r.partition, r.offset) for r in newest_per_key(graves).values()
    )
