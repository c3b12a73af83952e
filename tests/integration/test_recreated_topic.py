"""A topic deleted and recreated under the same name is not the topic the table holds (issue 31,
point 1), on noida-db, which deletes and recreates topics as Kafka does (its topic ids are all
zeros, so the table's newest row per partition tells the logs apart: sinks/ledger.py's
`recreated`). The first import runs on the shared Spark session; the imports that must be
refused run from the CLI as a user runs them (they end before Spark starts)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from lagless.importer.job import run_import
from lagless.kafka.config import KafkaConfig
from tests.harness.noida import NoidaKafka
from tests.integration.test_crash_safety import stored
from tests.integration.test_ledger import spec_for

pytestmark = pytest.mark.spark

_numbers = itertools.count()


def create(admin: AdminClient, topic: str) -> None:
    deadline = time.monotonic() + 30
    while True:  # a topic just deleted may still be going
        try:
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def produce(noida: NoidaKafka, topic: str, count: int, label: bytes) -> None:
    producer = Producer({"bootstrap.servers": noida.bootstrap})
    for n in range(count):
        producer.produce(topic, value=b"%s-%d" % (label, n), key=b"k%d" % n, partition=0)
    assert producer.flush(30) == 0


def recreate(noida: NoidaKafka, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": noida.bootstrap})
    admin.delete_topics([topic])[topic].result(10)
    create(admin, topic)


def lagless(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lagless", *args], capture_output=True, text=True, timeout=300
    )


def files_under(folder: Path) -> dict[str, float]:
    return {
        str(Path(path, name)): os.path.getmtime(Path(path, name))
        for path, _, names in os.walk(folder)
        for name in names
    }


@pytest.mark.parametrize(
    ("store", "checkpoint"),
    [
        ("sqlite", "kept"),  # the case: the same command, --group and all
        ("delta", "fresh"),
        pytest.param("parquet", "kept", marks=pytest.mark.matrix),
        pytest.param("iceberg", "fresh", marks=pytest.mark.matrix),
        pytest.param("postgresql", "kept", marks=pytest.mark.matrix),
    ],
)
def test_a_recreated_longer_topic_is_refused_and_lag_sink_says_so(
    store: str, checkpoint: str, noida: NoidaKafka, tmp_path: Path, spark, request
) -> None:
    topic = f"rct_{next(_numbers)}"
    create(AdminClient({"bootstrap.servers": noida.bootstrap}), topic)
    produce(noida, topic, 1000, b"old")
    kafka = KafkaConfig(noida.bootstrap)
    url = f"{store}:///{tmp_path}/{'d.db' if store == 'sqlite' else 'lake'}"
    if store == "postgresql":
        url = str(request.getfixturevalue("postgres").url)
    first = run_import(
        spec_for(kafka, topic, url, tmp_path / "ckpt", group="g", max_records_per_batch=None),
        spark=spark,
    )
    assert first.records == 1000
    before = stored(url, topic, ("partition", "offset", "value"))
    assert before == [(0, n, b"old-%d" % n) for n in range(1000)]
    recreate(noida, topic)
    produce(noida, topic, 1500, b"new")
    ckpt = tmp_path / ("ckpt" if checkpoint == "kept" else "fresh")
    written = files_under(tmp_path)
    args = ["--bootstrap", noida.bootstrap, "--topic", topic, "--sink", url]

    refused = lagless("import", *args, "--checkpoint", str(ckpt), "--group", "g")
    skipping = lagless(
        "import", *args, "--checkpoint", str(ckpt), "--group", "g", "--skip-lost-offsets"
    )
    lag = lagless("lag", *args, "--json")
    shown = lagless("lag", *args)

    for done in (refused, skipping):
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("lagless: "), done.stderr
        assert "holds the history of another topic of that name" in done.stderr
        assert f"{topic}[0]: the record at offset 999 has another timestamp" in done.stderr
    assert stored(url, topic, ("partition", "offset", "value")) == before
    assert files_under(tmp_path) == written  # nothing written, the checkpoint included
    assert lag.returncode == 0, lag.stderr
    (row,) = json.loads(lag.stdout)["partitions"]
    assert (row["held"], row["log_end"]) == (1000, 1500)
    assert row["another_topic"].startswith(f"{topic}[0]: the record at offset 999 ")
    assert "holds the history of another topic of that name" in shown.stdout


@pytest.mark.matrix  # every import into a table that holds rows runs the check
def test_the_same_topic_grown_is_imported_on(noida: NoidaKafka, tmp_path: Path, spark) -> None:
    """The check passes a log that only grew: the newest held row is still its record."""
    topic = f"grown_{next(_numbers)}"
    create(AdminClient({"bootstrap.servers": noida.bootstrap}), topic)
    produce(noida, topic, 100, b"a")
    kafka = KafkaConfig(noida.bootstrap)
    url = f"sqlite:///{tmp_path}/d.db"
    run_import(spec_for(kafka, topic, url, tmp_path / "ckpt"), spark=spark)
    produce(noida, topic, 50, b"b")

    again = run_import(spec_for(kafka, topic, url, tmp_path / "fresh"), spark=spark)

    assert again.records == 50
    assert stored(url, topic, ("offset",)) == [(n,) for n in range(150)]
