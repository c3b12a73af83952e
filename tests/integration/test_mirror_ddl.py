"""Schema changes upstream, one after another, through real PostgreSQL and real Debezium into
SQLite, Delta and PostgreSQL (issue 56), one routed import of two tables, t and u: a column
added with a default, columns widened (int -> bigint, numeric(10,2) -> numeric(12,4),
varchar(10) -> varchar(50)), a fresh mirror of the whole topic (old and new schemas in one
batch), a column renamed, a type the mirror cannot follow (t stops, u goes on, twice), a
TRUNCATE of u between two inserts. Each step's tables are compared with the source, value by
value. (Iceberg's widening and refusals: tests/unit/test_schema_change.py.)"""

from __future__ import annotations

import decimal
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from lagless.exceptions import SchemaChangeRefused
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from tests.harness.debezium import DebeziumConnector, connection, skip_reason
from tests.harness.postgres import PostgresServer

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason())),
]


@pytest.fixture(scope="module")
def source() -> Iterator[PostgresServer]:
    server = PostgresServer.start_new(logical=True)
    try:
        yield server
    finally:
        server.destroy()


def rows_in(sink: str, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    """The mirror's rows in `columns`, sorted by the first; decimals as Decimal (SQLite keeps
    them as text)."""
    scheme, _, rest = sink.partition(":///")
    if scheme == "sqlite":
        import sqlite3

        with sqlite3.connect(rest) as conn:
            quoted = ", ".join(f'"{c}"' for c in columns)
            found = conn.execute(f'SELECT {quoted} FROM "{table}"').fetchall()
    elif scheme == "delta":
        read = DeltaTable(f"{rest}/{table}").to_pyarrow_table(columns=columns).to_pylist()
        found = [tuple(row[c] for c in columns) for row in read]
    else:
        import psycopg

        with psycopg.connect(sink) as conn:
            quoted = ", ".join(f'"{c}"' for c in columns)
            found = conn.execute(f'SELECT {quoted} FROM "{table}"').fetchall()
    return sorted(tuple(_plain(v) for v in row) for row in found)


def _plain(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return decimal.Decimal(value)
        except decimal.InvalidOperation:
            return value
    return value


class Upstream:
    def __init__(self, source: PostgresServer, kafka: Any, broker: Any, tmp_path: Path):
        import psycopg

        self.kafka, self.tmp_path = kafka, tmp_path
        admin = connection(source)
        self.database = f"ddl_{id(self):x}"
        admin.execute(f"CREATE DATABASE {self.database}")
        admin.close()
        url = source.url.rsplit("/", 1)[0] + f"/{self.database}"
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(
            "CREATE TABLE t (id int PRIMARY KEY, n int, p numeric(10,2), v varchar(10))"
        )
        self.conn.execute(
            "INSERT INTO t SELECT i, i * 10, i + 0.25, 'v' || i FROM generate_series(1, 5) i"
        )
        self.conn.execute("CREATE TABLE u (id int PRIMARY KEY, s text)")
        self.conn.execute("INSERT INTO u VALUES (1, 'a')")
        self.connector = DebeziumConnector(source, kafka.bootstrap, ["public.t", "public.u"])
        self.connector.extra["database.dbname"] = self.database
        self.connector.extra["skipped.operations"] = "none"  # TRUNCATEs sent too
        broker.create_topic(self.connector.topic("public.t"), 2)
        # One partition: a TRUNCATE (no key) and the changes around it in one order.
        broker.create_topic(self.connector.topic("public.u"), 1)

    def sql(self, *statements: str, events: int = 0) -> None:
        before = self.connector.events
        for statement in statements:
            self.conn.execute(statement)
        if events:
            self.connector.wait_for_events(before + events)
        self.connector.wait_quiet()

    def mirror(self, sink: str, spark: Any, prefix: str = "") -> None:
        """Both tables, one routed import: t into `{prefix}t`, u into `{prefix}u`."""
        spec = ImportSpec(
            kafka=self.kafka,
            topics=(),
            topic_pattern=r"db\.public\..*",
            sink_url=sink,
            checkpoint=str(self.tmp_path / f"cp-{sink.split(':')[0]}-{prefix}"),
            table=prefix + "{table}",
            write="upsert",
            value_format="debezium",
        )
        run_import(spec, spark=spark)

    def source_rows(self, columns: list[str], table: str = "t") -> list[tuple[Any, ...]]:
        quoted = ", ".join(columns)
        return sorted(self.conn.execute(f"SELECT {quoted} FROM {table}").fetchall())

    def assert_mirrored(self, sink: str, table: str, columns: list[str]) -> None:
        assert rows_in(sink, table, columns) == self.source_rows(columns), sink
        assert rows_in(sink, table[:-1] + "u", ["id", "s"]) == self.source_rows(["id", "s"], "u")

    def close(self, source: PostgresServer) -> None:
        try:
            self.connector.destroy()
        finally:
            self.conn.close()
            with connection(source) as admin:
                admin.execute(f"DROP DATABASE {self.database} WITH (FORCE)")


@pytest.fixture
def upstream(source, kafka, broker, tmp_path) -> Iterator[Upstream]:
    each = Upstream(source, kafka, broker, tmp_path)
    try:
        yield each
    finally:
        each.close(source)


def test_schema_changes_upstream_are_followed_step_by_step(
    upstream, source, tmp_path, spark, caplog
):
    sinks = [f"sqlite:///{tmp_path}/mirror.db", f"delta:///{tmp_path}/delta", source.url]
    upstream.connector.start()
    upstream.connector.wait_for_events(6)
    upstream.connector.wait_quiet()
    for sink in sinks:
        upstream.mirror(sink, spark)
        upstream.assert_mirrored(sink, "t", ["id", "n", "p", "v"])

    # A column added with a default: the rows not changed since hold it too.
    upstream.sql(
        "ALTER TABLE t ADD COLUMN d int DEFAULT 7",
        "UPDATE t SET n = n + 1 WHERE id = 1",
        "INSERT INTO t VALUES (6, 60, 6.5, 'v6', 9)",
        "INSERT INTO u VALUES (2, 'b')",
        events=3,
    )
    for sink in sinks:
        upstream.mirror(sink, spark)
        upstream.assert_mirrored(sink, "t", ["id", "n", "p", "v", "d"])
    assert rows_in(sinks[0], "t", ["d"]).count((7,)) == 5

    # Widened in place: values only the wider types hold.
    upstream.sql(
        "ALTER TABLE t ALTER COLUMN n TYPE bigint",
        "ALTER TABLE t ALTER COLUMN p TYPE numeric(12,4)",
        "ALTER TABLE t ALTER COLUMN v TYPE varchar(50)",
        f"INSERT INTO t VALUES (7, {2**40}, 12345678.1234, '{'w' * 40}', 1)",
        "UPDATE t SET p = 1.2345 WHERE id = 2",
        events=2,
    )
    for sink in sinks:
        upstream.mirror(sink, spark)
        upstream.assert_mirrored(sink, "t", ["id", "n", "p", "v", "d"])
    widened = pa.schema(DeltaTable(f"{tmp_path}/delta/t").schema().to_arrow())
    assert (widened.field("n").type, widened.field("p").type) == (
        pa.int64(),
        pa.decimal128(12, 4),
    )
    with psycopg.connect(source.url) as conn:
        widened_pg = conn.execute(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = 't'::regclass AND attname IN ('n', 'p') ORDER BY attname"
        ).fetchall()
    assert widened_pg == [("bigint",), ("numeric(12,4)",)]

    # A fresh mirror of the whole topic: old and new schemas in one batch, the widest kept.
    upstream.mirror(sinks[0], spark, prefix="again_")
    upstream.assert_mirrored(sinks[0], "again_t", ["id", "n", "p", "v", "d"])

    # A column renamed: said in one line; the new name is mirrored from then on.
    upstream.sql(
        "ALTER TABLE t RENAME COLUMN v TO w",
        "INSERT INTO t VALUES (8, 80, 8.5, 'w8', 1)",
        events=1,
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lagless.importer.debezium"):
        upstream.mirror(sinks[0], spark)
    assert "columns ['v'] are no longer in the change events (renamed or dropped" in caplog.text
    upstream.assert_mirrored(sinks[0], "t", ["id", "n", "p", "d"])
    assert rows_in(sinks[0], "t", ["id", "w"])[-1] == (8, "w8")

    # A type the mirror cannot follow: that table stops, in one line with the true direction
    # and a remedy; the other table goes on, in this run and the next.
    # u: a TRUNCATE between two inserts, in one batch: applied in its place.
    held = {sink: rows_in(sink, "t", ["id", "n"]) for sink in sinks}
    upstream.sql(
        "ALTER TABLE t ALTER COLUMN n TYPE text",
        "INSERT INTO t VALUES (9, 'nine')",
        "INSERT INTO u VALUES (3, 'c')",
        "TRUNCATE u",
        "INSERT INTO u VALUES (4, 'd')",
        events=4,
    )
    for sink in sinks:
        for _ in range(2):  # the rerun keeps the table stopped, and mirrors the other
            with pytest.raises(SchemaChangeRefused) as refused:
                upstream.mirror(sink, spark)
            told = str(refused.value)
            # As the store names its types (SQLite: int, text; Delta, PostgreSQL: bigint,
            # string).
            direction = r"column 'n' is (big)?int in the table, the change events now make it "
            assert re.search(direction + "(string|text)", told), told
            assert "execute-snapshot" in told and "\n" not in told
            assert rows_in(sink, "t", ["id", "n"]) == held[sink]
            assert rows_in(sink, "u", ["id", "s"]) == upstream.source_rows(["id", "s"], "u")
            assert rows_in(sink, "u", ["id"])[0] == (4,)  # emptied once, not again on rerun
            upstream.sql("INSERT INTO u SELECT max(id) + 1, 'more' FROM u", events=1)
