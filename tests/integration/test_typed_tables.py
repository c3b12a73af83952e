"""Typed tables (issue 10): a column per value field, from a Spark DDL schema (JSON) or an Avro
schema; upsert on value fields; tombstones that delete and are remembered; records that do not
fit the schema dead-lettered; a field added to the schema becoming a column. Embedded broker
over TCP, real Spark, real SQLite, PostgreSQL and Parquet."""

from __future__ import annotations

import json
import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.dataset as ds
import pytest
from confluent_kafka import Producer

from lagless.importer.job import run_import
from lagless.importer.rows import NOT_AN_OBJECT, missing, wrong_type
from lagless.importer.spec import ImportSpec
from lagless.kafka_config import KafkaConfig

pytestmark = pytest.mark.spark

DEALS_DDL = "id BIGINT NOT NULL, name STRING, price DECIMAL(12,2), tags ARRAY<STRING>"


def produce(kafka: KafkaConfig, topic: str, records: list[tuple[int, bytes | None, Any]]) -> None:
    """(partition, key, value) in order; a dict value is sent as JSON, None as a tombstone."""
    producer = Producer(kafka.producer(**{"enable.idempotence": True}))
    for partition, key, value in records:
        body = json.dumps(value).encode() if isinstance(value, dict) else value
        producer.produce(topic, body, key, partition=partition)
    assert producer.flush(30) == 0


def deal(i: int, version: int = 0) -> dict[str, Any]:
    return {
        "id": i,
        "name": f"deal {i} v{version}",
        "price": f"{i}.{version:02d}",
        "tags": [f"t{i}"],
    }


def import_spec(kafka: KafkaConfig, topic: str, sink: str, tmp_path: Path, **kw: Any) -> ImportSpec:
    return ImportSpec(
        kafka=kafka, topics=(topic,), sink_url=sink, checkpoint=str(tmp_path / "ckpt"), **kw
    )


def sqlite_rows(tmp_path: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(tmp_path / "out.db") as conn:
        return conn.execute(sql).fetchall()


def pg_rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


def test_json_with_a_ddl_schema_lands_as_typed_columns_in_sqlite(
    broker, kafka, topic_name, tmp_path, spark
):
    broker.create_topic(topic_name, 2)
    produce(kafka, topic_name, [(i % 2, str(i).encode(), deal(i)) for i in range(40)])

    summary = run_import(
        import_spec(
            kafka,
            topic_name,
            f"sqlite:///{tmp_path}/out.db",
            tmp_path,
            value_format="json",
            value_schema=DEALS_DDL,
        ),
        spark=spark,
    )

    assert summary.records == summary.imported == 40
    columns = [row[1] for row in sqlite_rows(tmp_path, f"PRAGMA table_info({topic_name})")]
    assert columns == [
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
    stored = sqlite_rows(tmp_path, f"SELECT id, name, price, tags FROM {topic_name} ORDER BY id")
    assert stored == [
        (d["id"], d["name"], d["price"], json.dumps(d["tags"], separators=(",", ":")))
        for d in map(deal, range(40))
    ]


def test_json_with_a_ddl_schema_lands_as_typed_columns_in_postgresql(
    broker, kafka, topic_name, tmp_path, spark, postgres
):
    broker.create_topic(topic_name, 2)
    produce(kafka, topic_name, [(i % 2, str(i).encode(), deal(i)) for i in range(40)])
    schema_file = tmp_path / "deals.ddl"
    schema_file.write_text(DEALS_DDL + ", meta STRUCT<source: STRING, score: DOUBLE>")

    summary = run_import(
        import_spec(
            kafka,
            topic_name,
            postgres.url,
            tmp_path,
            value_format="json",
            value_schema=f"@{schema_file}",
        ),
        spark=spark,
    )

    assert summary.imported == 40
    types = dict(
        pg_rows(
            postgres.url,
            "SELECT column_name, data_type FROM information_schema.columns "
            f"WHERE table_name = '{topic_name}'",
        )
    )
    assert {k: types[k] for k in ("id", "name", "price", "tags", "meta")} == {
        "id": "bigint",
        "name": "text",
        "price": "numeric",
        "tags": "jsonb",
        "meta": "jsonb",
    }
    stored = pg_rows(
        postgres.url, f"SELECT id, name, price, tags, meta FROM {topic_name} ORDER BY id"
    )
    assert stored == [
        (d["id"], d["name"], Decimal(d["price"]), d["tags"], None) for d in map(deal, range(40))
    ]


def test_json_with_a_ddl_schema_lands_as_nested_types_in_parquet(
    broker, kafka, topic_name, tmp_path, spark
):
    broker.create_topic(topic_name, 1)
    produce(kafka, topic_name, [(0, str(i).encode(), deal(i)) for i in range(30)])

    run_import(
        import_spec(
            kafka,
            topic_name,
            f"parquet:///{tmp_path}/lake",
            tmp_path,
            value_format="json",
            value_schema=DEALS_DDL,
        ),
        spark=spark,
    )

    table = ds.dataset(tmp_path / "lake" / topic_name).to_table()
    assert str(table.schema.field("tags").type) == "list<element: string>"
    assert str(table.schema.field("price").type) == "decimal128(12, 2)"
    assert "value" not in table.schema.names
    rows = sorted(table.select(["id", "name", "price", "tags"]).to_pylist(), key=lambda r: r["id"])
    assert rows == [
        {"id": d["id"], "name": d["name"], "price": Decimal(d["price"]), "tags": d["tags"]}
        for d in map(deal, range(30))
    ]


def test_records_that_do_not_fit_the_schema_are_dead_lettered_with_their_reason(
    broker, kafka, topic_name, tmp_path, spark
):
    broker.create_topic(topic_name, 1)
    good = [(0, b"1", deal(1)), (0, b"2", deal(2))]
    bad = [
        (0, b"3", {"name": "no id"}),
        (0, b"4", {"id": "four", "name": "x"}),
        (0, b"5", {"id": 5, "tags": "not a list"}),
        (0, b"6", b"[1, 2]"),
        (0, b"7", b'{"id": 7,'),
    ]
    produce(kafka, topic_name, good + bad)

    summary = run_import(
        import_spec(
            kafka,
            topic_name,
            f"sqlite:///{tmp_path}/out.db",
            tmp_path,
            value_format="json",
            value_schema=DEALS_DDL,
        ),
        spark=spark,
    )

    assert summary.records == 7 == summary.imported + summary.dead_lettered
    assert summary.imported == 2
    letters = sqlite_rows(tmp_path, f'SELECT "offset", error FROM {topic_name}_dlq ORDER BY 1')
    assert letters == [
        (2, missing("id")),
        (3, wrong_type("id", "bigint")),
        (4, wrong_type("tags", "array<string>")),
        (5, NOT_AN_OBJECT),
        (6, NOT_AN_OBJECT),
    ]
    assert sqlite_rows(tmp_path, f"SELECT id FROM {topic_name} ORDER BY 1") == [(1,), (2,)]
