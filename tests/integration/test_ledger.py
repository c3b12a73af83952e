"""The store is the ledger (issue 17), end to end: embedded broker over TCP, real Spark, real
stores. Whatever happens to the checkpoint, every record lands once; the per-store property
test of interleavings and crashes is tests/unit/test_ledger_stores.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer

from lagless.broker import EmbeddedBroker
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from tests.integration.test_crash_safety import read_topic, stored
from tests.integration.test_delta import newest_per_key

pytestmark = pytest.mark.spark


def produce(
    kafka: KafkaConfig, topic: str, first: int, count: int, tombstones: bool = False
) -> None:
    """JSON records over three partitions, keyed over 40 keys; some tombstones if asked."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for n in range(first, first + count):
        value = None if tombstones and n % 11 == 5 else f'{{"n": {n}}}'.encode()
        producer.produce(topic, value=value, key=b"k%d" % (n % 40), partition=n % 3)
    producer.flush(30)


def spec_for(kafka: KafkaConfig, topic: str, url: str, checkpoint: Path, **over: object):
    values: dict[str, object] = {
        "kafka": kafka,
        "topics": (topic,),
        "sink_url": url,
        "checkpoint": str(checkpoint),
        "max_records_per_batch": 250,
    }
    values.update(over)
    return ImportSpec(**values)  # type: ignore[arg-type]


CASES = [
    # store, value format, write mode
    ("sqlite", "raw", "append"),
    ("postgresql", "raw", "append"),
    ("parquet", "raw", "append"),
    ("delta", "json", "append"),
    ("delta", "json", "upsert"),
    ("iceberg", "raw", "append"),
    ("iceberg", "json", "upsert"),
]


@pytest.mark.parametrize(("store", "value_format", "write"), CASES)
def test_a_fresh_checkpoint_resumes_from_what_the_table_holds(
    store, value_format, write, broker, kafka, topic_name, tmp_path, spark, request
):
    """The checkpoint is deleted to "start over" (or lost with a node): the next import reads
    only what the table does not hold yet, and the table holds every record once."""
    url = (
        str(request.getfixturevalue("postgres").url)
        if store == "postgresql"
        else f"{store}:///{tmp_path}/{'out.db' if store == 'sqlite' else 'lake'}"
    )
    broker.create_topic(topic_name, 3)
    upsert = write == "upsert"
    produce(kafka, topic_name, 0, 600, tombstones=upsert)
    first = spec_for(
        kafka, topic_name, url, tmp_path / "ckpt", value_format=value_format, write=write
    )
    run_import(first, spark=spark)
    produce(kafka, topic_name, 600, 400, tombstones=upsert)
    fresh = spec_for(
        kafka, topic_name, url, tmp_path / "fresh", value_format=value_format, write=write
    )

    summary = run_import(fresh, spark=spark)

    assert summary.records == 400  # only what arrived since: nothing read twice
    records = read_topic(kafka, topic_name, 3)
    columns = ("partition", "offset")
    rows = stored(url, topic_name, columns)
    if upsert:
        newest = newest_per_key(records).values()
        assert rows == sorted((r.partition, r.offset) for r in newest if r.value is not None)
    else:
        assert rows == sorted((r.partition, r.offset) for r in records)  # each once


def test_two_topics_into_one_parquet_table_keep_both(broker, kafka, tmp_path, spark):
    """Each import has its own checkpoint, so both number their batches from 0: the second
    must not replace the first's batches (it did when folders were named by batch id)."""
    url = f"parquet:///{tmp_path}/lake"
    for topic in ("orders", "refunds"):
        broker.create_topic(topic, 3)
        produce(kafka, topic, 0, 500)
    for topic in ("orders", "refunds"):
        run_import(
            spec_for(kafka, topic, url, tmp_path / f"ckpt-{topic}", table="events"), spark=spark
        )
    rows = stored(url, "events", ("topic", "partition", "offset"))
    assert len(rows) == len(set(rows)) == 1000
    assert {t for t, _, _ in rows} == {"orders", "refunds"}


def test_a_checkpoint_behind_the_table_skips_what_it_holds(
    broker, kafka, topic_name, tmp_path, spark
):
    """An older copy of the checkpoint (restored from a backup, or a second import that fell
    behind): its batches would cover offsets the table holds; none is read again."""
    url = f"parquet:///{tmp_path}/lake"
    broker.create_topic(topic_name, 3)
    produce(kafka, topic_name, 0, 300)
    checkpoint = tmp_path / "ckpt"
    run_import(spec_for(kafka, topic_name, url, checkpoint), spark=spark)
    shutil.copytree(checkpoint, tmp_path / "older")
    produce(kafka, topic_name, 300, 300)
    assert run_import(spec_for(kafka, topic_name, url, checkpoint), spark=spark).records == 300
    produce(kafka, topic_name, 600, 100)

    summary = run_import(spec_for(kafka, topic_name, url, tmp_path / "older"), spark=spark)

    assert summary.records == 100
    rows = stored(url, topic_name, ("partition", "offset"))
    assert len(rows) == len(set(rows)) == 700


def test_a_table_ahead_of_a_recreated_topic_is_one_line_exit_2(tmp_path, spark):
    """The topic was recreated (fewer records than the table holds): the table's history is
    another topic's. Refused before anything is written, checkpoint included. The first
    import only fills the table (in process); the refusal is the CLI's."""
    url = f"sqlite:///{tmp_path}/out.db"
    with EmbeddedBroker() as first:
        first.create_topic("orders", 1)
        kafka = KafkaConfig(first.bootstrap)
        produce_one_partition(kafka, "orders", 50)
        filled = run_import(spec_for(kafka, "orders", url, tmp_path / "ckpt"), spark=spark)
        assert filled.records == 50
    before = stored(url, "orders", ("partition", "offset"))
    with EmbeddedBroker() as second:
        second.create_topic("orders", 1)
        produce_one_partition(KafkaConfig(second.bootstrap), "orders", 20)

        code, _, err = cli(second.bootstrap, url, tmp_path / "fresh")

    assert code == 2
    assert err.count("\n") == 1 and "holds orders[0] up to offset 50" in err, err
    assert "log ends at 20" in err
    assert not (tmp_path / "fresh").exists()
    assert stored(url, "orders", ("partition", "offset")) == before


def produce_one_partition(kafka: KafkaConfig, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for n in range(count):
        producer.produce(topic, value=b"v%d" % n, partition=0)
    producer.flush(30)


def cli(bootstrap: str, url: str, checkpoint: Path) -> tuple[int, str, str]:
    args = ["--bootstrap", bootstrap, "--topic", "orders", "--sink", url]
    done = subprocess.run(
        [sys.executable, "-m", "lagless", "import", *args, "--checkpoint", str(checkpoint)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize(
    "store", ["sqlite", "delta", pytest.param("iceberg", marks=pytest.mark.matrix)]
)
def test_lag_sink_shows_what_the_table_holds_against_the_log(
    store, broker, kafka, topic_name, tmp_path, spark
):
    """A table's own lag, whatever wrote it: the offsets it holds, the records behind, and the
    age of the oldest record it lacks (0 where caught up)."""
    url = f"{store}:///{tmp_path}/{'out.db' if store == 'sqlite' else 'lake'}"
    broker.create_topic(topic_name, 3)
    produce(kafka, topic_name, 0, 300)
    run_import(spec_for(kafka, topic_name, url, tmp_path / "ckpt"), spark=spark)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    for n in range(25):
        producer.produce(topic_name, value=b"late %d" % n, partition=1)
    producer.flush(30)

    args = ["--bootstrap", kafka.bootstrap, "--sink", url, "--topic", topic_name, "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "lagless", "lag", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    rows = {row["partition"]: row for row in json.loads(done.stdout)["partitions"]}
    assert {p: (r["held"], r["log_end"], r["behind"]) for p, r in rows.items()} == {
        0: (100, 100, 0),
        1: (100, 125, 25),
        2: (100, 100, 0),
    }
    assert rows[0]["time_lag_s"] == 0
    assert 0 < rows[1]["time_lag_s"] < 120
