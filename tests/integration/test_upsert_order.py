"""Issue 31's counter-example (point 2): an upsert's result no longer depends on the batch size.

Key K: v1 (partition 0, CreateTime 100), v3 (partition 1, 75), v2 (partition 0, 50); key T the
same with a tombstone last. Comparing offsets within a partition and timestamps across is not
transitive here: default batches kept K = v3 and T, `--max-records-per-batch 2` K = v2 and T
deleted. The rank (sinks/upsert_order.py) puts v2 above v1 (a later offset of partition 0,
whose log time stays 100) and v1 above v3 (100 > 75): K = v2 and T deleted, whatever the
batching. Real Spark (rows.py's window and coalescing), the embedded broker, real stores; the
property over random batchings is tests/unit/test_upsert_rank.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer

from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from tests.integration.test_crash_safety import stored

pytestmark = pytest.mark.spark

BASE = 1_700_000_000_000
# (key, partition, CreateTime after BASE, value): produced in this order.
COUNTER_EXAMPLE = [
    (b"K", 0, 100, b"v1"),
    (b"K", 1, 75, b"v3"),
    (b"K", 0, 50, b"v2"),
    (b"T", 0, 100, b"t1"),
    (b"T", 1, 75, b"t3"),
    (b"T", 0, 50, None),
]
# Partition 0 holds K v1, K v2, T t1, T's tombstone (offsets 0-3), its log times all 100.
KEPT = [(b"K", 0, 1, b"v2", BASE + 50, BASE + 100)]
BURIED = [(b"T", 0, 3, BASE + 50, BASE + 100)]
COLUMNS = ("key", "partition", "offset", "value", "timestamp", "log_time")
# SQLite in CI, the lakehouse stores with the matrix (their upsert code: the unit property).
STORES = [
    "sqlite",
    pytest.param("delta", marks=pytest.mark.matrix),
    pytest.param("iceberg", marks=pytest.mark.matrix),
]


def produce_counter_example(kafka: KafkaConfig, topic: str, first: int = 0, end: int = 6) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for key, partition, ms, value in COUNTER_EXAMPLE[first:end]:
        producer.produce(topic, value=value, key=key, partition=partition, timestamp=BASE + ms)
        producer.flush(30)  # in this order, offsets as listed


def upsert_spec(
    kafka: KafkaConfig, topic: str, url: str, folder: Path, table: str, **over: object
) -> ImportSpec:
    values: dict[str, object] = {
        "kafka": kafka,
        "topics": (topic,),
        "sink_url": url,
        "checkpoint": str(folder / table),
        "table": table,
        "write": "upsert",
    }
    return ImportSpec(**(values | over))  # type: ignore[arg-type]


def url_of(store: str, folder: Path) -> str:
    return f"{store}:///{folder}/{'out.db' if store == 'sqlite' else 'lake'}"


@pytest.mark.parametrize("store", STORES)
def test_the_counter_example_from_the_cli_is_the_same_table_for_every_batch_size(
    store, broker, kafka, topic_name, tmp_path, spark
):
    """`--max-records-per-batch 2` from the CLI, as the issue ran it; default batches (one
    batch of all six) on the shared session, to spare CI a second Spark start."""
    broker.create_topic(topic_name, 2)
    produce_counter_example(kafka, topic_name)
    url = url_of(store, tmp_path)
    args = ["--bootstrap", kafka.bootstrap, "--topic", topic_name, "--sink", url]
    args += ["--write", "upsert", "--table", "pairs", "--max-records-per-batch", "2"]

    done = subprocess.run(
        [sys.executable, "-m", "lagless", "import", *args, "--checkpoint", str(tmp_path / "p")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    run_import(upsert_spec(kafka, topic_name, url, tmp_path, "whole"), spark=spark)

    assert done.returncode == 0, done.stderr
    for table in ("pairs", "whole"):
        assert stored(url, table, COLUMNS) == KEPT, table
        assert stored(url, f"{table}_tombstones", COLUMNS[:3] + COLUMNS[4:]) == BURIED


@pytest.mark.parametrize("store", STORES)
def test_the_counter_example_across_two_imports(store, broker, kafka, topic_name, tmp_path, spark):
    """An import of the first two records (K v1, v3), then one of the rest from a new
    checkpoint: K v2's log time (100, partition 0's) comes from the table's ledger, else v2
    (50) would lose to v3 (75). (Batches of one record each: the matrix.)"""
    broker.create_topic(topic_name, 2)
    produce_counter_example(kafka, topic_name, 0, 2)
    url = url_of(store, tmp_path)

    def spec(table: str, **over: object) -> ImportSpec:
        return upsert_spec(kafka, topic_name, url, tmp_path, table, **over)

    run_import(spec("resumed"), spark=spark)
    assert stored(url, "resumed", COLUMNS) == [(b"K", 0, 0, b"v1", BASE + 100, BASE + 100)]
    produce_counter_example(kafka, topic_name, 2, 6)
    run_import(spec("resumed", checkpoint=str(tmp_path / "second")), spark=spark)

    assert stored(url, "resumed", COLUMNS) == KEPT
    assert stored(url, "resumed_tombstones", COLUMNS[:3] + COLUMNS[4:]) == BURIED


@pytest.mark.matrix
@pytest.mark.parametrize("store", ["sqlite", "delta", "iceberg"])
def test_the_counter_example_in_batches_of_one(store, broker, kafka, topic_name, tmp_path, spark):
    broker.create_topic(topic_name, 2)
    produce_counter_example(kafka, topic_name)
    url = url_of(store, tmp_path)

    run_import(
        upsert_spec(kafka, topic_name, url, tmp_path, "ones", max_records_per_batch=1), spark=spark
    )

    assert stored(url, "ones", COLUMNS) == KEPT
    assert stored(url, "ones_tombstones", COLUMNS[:3] + COLUMNS[4:]) == BURIED
