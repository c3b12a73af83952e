"""Typed tables (issue 10): a column per value field, from a Spark DDL schema (JSON) or an Avro
schema; upsert on value fields; tombstones that delete and are remembered; records that do not
fit the schema dead-lettered; a field added to the schema becoming a column. Embedded broker
over TCP, real Spark, real SQLite, PostgreSQL and Parquet."""

from __future__ import annotations

import json
import logging
import sqlite3
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.dataset as ds
import pytest
from confluent_kafka import Producer

from lagless.importer import write_path
from lagless.importer.job import run_import
from lagless.importer.rows import NOT_AN_OBJECT, missing, wrong_type
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig

pytestmark = pytest.mark.spark

DEALS_DDL = "id BIGINT NOT NULL, name STRING, price DECIMAL(12,2), tags ARRAY<STRING>"
JSON_DEALS: dict[str, Any] = {"value_format": "json", "value_schema": DEALS_DDL}


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


def rows_of(url: str, tmp_path: Path, sql: str) -> list[tuple[Any, ...]]:
    return sqlite_rows(tmp_path, sql) if url.startswith("sqlite") else pg_rows(url, sql)


def test_json_with_a_ddl_schema_lands_as_typed_columns_in_sqlite(
    broker, kafka, topic_name, tmp_path, spark
):
    broker.create_topic(topic_name, 2)
    produce(kafka, topic_name, [(i % 2, str(i).encode(), deal(i)) for i in range(40)])

    summary = run_import(
        import_spec(kafka, topic_name, f"sqlite:///{tmp_path}/out.db", tmp_path, **JSON_DEALS),
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
        import_spec(kafka, topic_name, f"sqlite:///{tmp_path}/out.db", tmp_path, **JSON_DEALS),
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


DEAL_AVRO = {
    "type": "record",
    "name": "Deal",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2},
        },
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}
# Version 2 adds a field, with a default: a compatible change.
DEAL_AVRO_V2 = DEAL_AVRO | {
    "fields": [
        *DEAL_AVRO["fields"],
        {"name": "region", "type": ["null", "string"], "default": None},
    ]
}


def avro_body(
    schema: dict[str, Any], record: dict[str, Any], schema_id: int | None = None
) -> bytes:
    """Plain Avro binary, or the Confluent wire format when a schema id is given."""
    import io

    import fastavro

    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    head = b"" if schema_id is None else b"\x00" + schema_id.to_bytes(4, "big")
    return head + out.getvalue()


def avro_deal(i: int, **extra: Any) -> dict[str, Any]:
    d = deal(i)
    return {**d, "price": Decimal(d["price"])} | extra


def test_avro_through_a_schema_registry_with_a_field_added_later(
    broker, kafka, topic_name, tmp_path, spark
):
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from lagless.source.avro_values import NOT_CONFLUENT, UNKNOWN_SCHEMA_ID
    from tests.harness.schema_registry import SchemaRegistry

    broker.create_topic(topic_name, 2)
    with SchemaRegistry() as registry:
        client = SchemaRegistryClient({"url": registry.url})
        subject = f"{topic_name}-value"
        v1 = client.register_schema(subject, Schema(json.dumps(DEAL_AVRO), "AVRO"))
        first = [
            (i % 2, str(i).encode(), avro_body(DEAL_AVRO, avro_deal(i), v1)) for i in range(20)
        ]
        broken = [(0, b"x", b"plain text"), (1, b"y", avro_body(DEAL_AVRO, avro_deal(99), 4242))]
        produce(kafka, topic_name, first + broken)
        spec = import_spec(
            kafka,
            topic_name,
            f"sqlite:///{tmp_path}/out.db",
            tmp_path,
            value_format="avro",
            schema_registry=registry.url,
        )

        summary = run_import(spec, spark=spark)

        assert (summary.records, summary.imported, summary.dead_lettered) == (22, 20, 2)
        assert summary.dead_lettered_by_reason == {NOT_CONFLUENT: 1, UNKNOWN_SCHEMA_ID: 1}
        stored = sqlite_rows(
            tmp_path, f"SELECT id, name, price, tags FROM {topic_name} ORDER BY id"
        )
        assert stored == [
            (d["id"], d["name"], d["price"], json.dumps(d["tags"], separators=(",", ":")))
            for d in map(deal, range(20))
        ]

        v2 = client.register_schema(subject, Schema(json.dumps(DEAL_AVRO_V2), "AVRO"))
        later = [(0, b"50", avro_body(DEAL_AVRO_V2, avro_deal(50, region="EU"), v2))]
        produce(kafka, topic_name, [*later, (1, b"51", avro_body(DEAL_AVRO, avro_deal(51), v1))])
        summary = run_import(spec, spark=spark)

    assert summary.imported == 2
    columns = [row[1] for row in sqlite_rows(tmp_path, f"PRAGMA table_info({topic_name})")]
    assert columns[-1] == "region"
    regions = sqlite_rows(
        tmp_path, f"SELECT id, region FROM {topic_name} WHERE id >= 18 ORDER BY id"
    )
    assert regions == [(18, None), (19, None), (50, "EU"), (51, None)]


def test_plain_avro_with_a_schema_file_into_postgresql(
    broker, kafka, topic_name, tmp_path, spark, postgres
):
    broker.create_topic(topic_name, 1)
    produce(
        kafka,
        topic_name,
        [(0, str(i).encode(), avro_body(DEAL_AVRO, avro_deal(i))) for i in range(25)],
    )
    produce(kafka, topic_name, [(0, b"bad", b"\x01\x02")])
    avsc = tmp_path / "deal.avsc"
    avsc.write_text(json.dumps(DEAL_AVRO))

    summary = run_import(
        import_spec(
            kafka, topic_name, postgres.url, tmp_path, value_format="avro", value_schema=str(avsc)
        ),
        spark=spark,
    )

    assert (summary.imported, summary.dead_lettered) == (25, 1)
    stored = pg_rows(postgres.url, f"SELECT id, name, price, tags FROM {topic_name} ORDER BY id")
    assert stored == [
        (d["id"], d["name"], Decimal(d["price"]), d["tags"]) for d in map(deal, range(25))
    ]


def test_upsert_on_a_value_field_where_tombstones_delete_and_an_older_replay_cannot_resurrect(
    broker, kafka, topic_name, tmp_path, spark, postgres
):
    broker.create_topic(topic_name, 2)
    # Ids 0-9, three versions each, partition by id; ids 3 and 7 deleted after their last update.
    records = [(i % 2, str(i).encode(), deal(i, v)) for v in range(3) for i in range(10)]
    records += [(1, b"3", None), (1, b"7", None)]
    produce(kafka, topic_name, records)
    for url in (f"sqlite:///{tmp_path}/out.db", postgres.url):
        spec = import_spec(
            kafka,
            topic_name,
            url,
            tmp_path / url[:6],
            value_format="json",
            value_schema=DEALS_DDL,
            write="upsert",
            key_fields=("id",),
            max_records_per_batch=10,
        )
        run_import(spec, spark=spark)
        expected = [
            (d["id"], d["name"]) for d in (deal(i, 2) for i in range(10) if i not in (3, 7))
        ]
        assert rows_of(url, tmp_path, f"SELECT id, name FROM {topic_name} ORDER BY id") == expected
        tombstones = rows_of(url, tmp_path, f"SELECT id FROM {topic_name}_tombstones")
        assert sorted(tombstones) == [(3,), (7,)]

    # Version 0 of deal 3 again, from the other partition with its old timestamp: older than the
    # tombstone, so it stays deleted; a newer version 5 of deal 7 brings that one back.
    producer = Producer(kafka.producer())
    producer.produce(topic_name, json.dumps(deal(3, 0)).encode(), b"3", partition=0, timestamp=1000)
    producer.produce(topic_name, json.dumps(deal(7, 5)).encode(), b"7", partition=1)
    assert producer.flush(30) == 0
    spec = import_spec(
        kafka,
        topic_name,
        f"sqlite:///{tmp_path}/out.db",
        tmp_path / "sqlite",
        value_format="json",
        value_schema=DEALS_DDL,
        write="upsert",
        key_fields=("id",),
    )
    assert run_import(spec, spark=spark).records == 2
    names = dict(sqlite_rows(tmp_path, f"SELECT id, name FROM {topic_name} WHERE id IN (3, 7)"))
    assert names == {7: "deal 7 v5"}


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"--value-schema": "id BIGINTT"}, "--value-schema is not a Spark DDL schema"),
        ({"--value-schema": "@{tmp}/missing.ddl"}, "missing.ddl' cannot be read"),
        ({"--value-format": "avro", "--value-schema": "{tmp}/x.avsc"}, "x.avsc' cannot be read"),
        (
            {
                "--value-format": "avro",
                "--value-schema": None,
                "--schema-registry": "http://127.0.0.1:9",
            },
            "cannot reach the schema registry",
        ),
        ({"--value-schema": "id STRING"}, "incompatible schema change: column 'id'"),
        ({"--value-schema": "offset BIGINT"}, "value field 'offset' has the name of a column"),
        ({"--key-field": "id"}, "--key-field needs --write upsert"),
    ],
)
def test_bad_schemas_are_one_line_exit_2_and_write_nothing(
    broker, topic_name, tmp_path, over, says
):
    import subprocess
    import sys

    from pyspark.sql.types import LongType, StructField, StructType

    from lagless.sinks import Target, sink_from_url

    broker.create_topic(topic_name, 1)
    sink = f"sqlite:///{tmp_path}/out.db"
    existing = StructType([StructField("id", LongType())])
    sink_from_url(sink).prepare(Target(topic_name, "append", "json", existing))
    args = {"--bootstrap": broker.bootstrap, "--topic": topic_name, "--sink": sink}
    args |= {"--checkpoint": str(tmp_path / "ckpt"), "--value-format": "json"}
    args |= {"--value-schema": "id BIGINT"} | over
    given = [(k, v.format(tmp=tmp_path)) for k, v in args.items() if v is not None]
    result = subprocess.run(
        [sys.executable, "-m", "lagless", "import", *[p for kv in given for p in kv]],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 2, result.stderr
    # Parsing a DDL schema starts Spark's JVM, whose launcher notes the incubator module it
    # loads: not lagless's to silence.
    lines = [
        line
        for line in result.stderr.strip().splitlines()
        if line != "WARNING: Using incubator modules: jdk.incubator.vector"
    ]
    assert len(lines) == 1 and says in lines[0], result.stderr
    assert not (tmp_path / "ckpt").exists()
    assert [r[1] for r in sqlite_rows(tmp_path, f"PRAGMA table_info({topic_name})")][-1] == "id"


def test_kill_9_in_the_middle_of_typed_upserts_then_a_rerun_gives_the_table_of_a_clean_run(
    broker, kafka, topic_name, tmp_path, spark
):
    import signal

    from tests.integration.test_crash_safety import run_import_process

    broker.create_topic(topic_name, 2)
    records = [(i % 2, str(i).encode(), deal(i, v)) for v in range(4) for i in range(30)]
    records[50:50] = [(i % 2, str(i).encode(), None) for i in range(0, 30, 4)]
    records += [(i % 2, str(i).encode(), None) for i in range(1, 30, 7)]
    produce(kafka, topic_name, records)
    options = dict(value_format="json", value_schema=DEALS_DDL, write="upsert", key_fields=("id",))
    killed = import_spec(
        kafka,
        topic_name,
        f"sqlite:///{tmp_path}/out.db",
        tmp_path,
        max_records_per_batch=40,
        **options,
    )
    args = ["--bootstrap", kafka.bootstrap, "--topic", topic_name, "--sink", killed.sink_url]
    args += ["--checkpoint", killed.checkpoint, "--max-records-per-batch", "40"]
    args += ["--value-format", "json", "--value-schema", DEALS_DDL, "--write", "upsert"]

    code, _, stderr = run_import_process([*args, "--key-field", "id"], tmp_path, "mid-write:2")

    assert code == -signal.SIGKILL, stderr[-3000:]
    run_import(killed, spark=spark)
    clean = import_spec(
        kafka, topic_name, f"sqlite:///{tmp_path}/clean.db", tmp_path / "clean", **options
    )
    run_import(clean, spark=spark)
    query = f"SELECT id, name, price, tags, partition, offset FROM {topic_name} ORDER BY id"
    with sqlite3.connect(tmp_path / "clean.db") as conn:
        expected = conn.execute(query).fetchall()
    assert sqlite_rows(tmp_path, query) == expected
    deleted = {i for i in range(1, 30, 7)}
    assert [row[0] for row in expected] == [i for i in range(30) if i not in deleted]


def test_an_inferred_schema_is_printed_and_gives_the_columns(
    broker, kafka, topic_name, tmp_path, spark, capsys
):
    broker.create_topic(topic_name, 2)
    produce(kafka, topic_name, [(i % 2, str(i).encode(), deal(i)) for i in range(20)])

    run_import(
        import_spec(
            kafka,
            topic_name,
            f"sqlite:///{tmp_path}/out.db",
            tmp_path,
            value_format="json",
            value_schema="infer",
        ),
        spark=spark,
    )

    printed = capsys.readouterr().err
    assert (
        "inferred --value-schema 'id BIGINT,name STRING,price STRING,tags ARRAY<STRING>'" in printed
    )
    info = sqlite_rows(tmp_path, f"PRAGMA table_info({topic_name})")
    assert [(row[1], row[2]) for row in info][5:] == [
        ("id", "INTEGER"),
        ("name", "TEXT"),
        ("price", "TEXT"),
        ("tags", "TEXT"),
    ]
    assert sqlite_rows(tmp_path, f"SELECT id FROM {topic_name} ORDER BY id") == [
        (i,) for i in range(20)
    ]


SCALAR_AVRO = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": ["null", "string"], "default": None},
        {"name": "x", "type": "double"},
        {"name": "ok", "type": "boolean"},
        {"name": "n", "type": ["null", "int"], "default": None},
    ],
}
SCALAR_AVRO_V2 = SCALAR_AVRO | {
    "fields": [*SCALAR_AVRO["fields"], {"name": "site", "type": "string", "default": "-"}]
}


@pytest.mark.parametrize("store", ["parquet", pytest.param("iceberg", marks=pytest.mark.matrix)])
def test_avro_values_the_tasks_decode_and_write_land_as_spark_rows_would(
    broker, kafka, topic_name, tmp_path, spark, monkeypatch, caplog, store: str
):
    """Avro of INT, BIGINT, DOUBLE, BOOLEAN and STRING columns into a folder store: the
    source's tasks decode the values (registry and writer schemas as the Spark path resolves
    them) and write the rows; values that do not decode (not the wire format, an unknown
    schema id, bytes of another schema) go to Spark's rows and become dead letters with their
    reason. The same table, dead letters and summary as an import whose rows all come through
    Spark."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    from lagless.sinks.base import DEAD_LETTER_COLUMNS
    from lagless.source.avro_values import NOT_CONFLUENT, UNDECODABLE, UNKNOWN_SCHEMA_ID
    from tests.harness.schema_registry import SchemaRegistry
    from tests.integration.test_crash_safety import stored

    broker.create_topic(topic_name, 2)

    def reading(i: int) -> dict[str, Any]:
        return {"id": i, "name": None if i % 5 else f"r{i}", "x": i / 7, "ok": i % 2 == 0}

    with SchemaRegistry() as registry:
        client = SchemaRegistryClient({"url": registry.url})
        subject = f"{topic_name}-value"
        v1 = client.register_schema(subject, Schema(json.dumps(SCALAR_AVRO), "AVRO"))
        v2 = client.register_schema(subject, Schema(json.dumps(SCALAR_AVRO_V2), "AVRO"))
        records: list[tuple[int, bytes | None, Any]] = [
            (i % 2, str(i).encode(), avro_body(SCALAR_AVRO, reading(i) | {"n": i}, v1))
            for i in range(300)
        ]
        records += [
            (i % 2, str(i).encode(), avro_body(SCALAR_AVRO_V2, reading(i) | {"site": "s"}, v2))
            for i in range(300, 400)
        ]
        records += [
            (0, b"text", b"plain text"),
            (1, b"unknown", avro_body(SCALAR_AVRO, reading(7), 4242)),
            (1, b"short", b"\x00" + v1.to_bytes(4, "big") + b"\x02"),
            (0, b"tombstone", None),
        ]
        produce(kafka, topic_name, records)

        def imported(name: str) -> tuple[Any, ...]:
            url = f"{store}:///{tmp_path}/{name}"
            spec = import_spec(
                kafka,
                topic_name,
                url,
                tmp_path / name,
                value_format="avro",
                schema_registry=registry.url,
            )
            summary = run_import(spec, spark=spark)
            columns = ("partition", "offset", "key", "id", "name", "x", "ok", "n", "site")
            table = stored(url, topic_name, columns)
            dead = stored(url, f"{topic_name}_dlq", DEAD_LETTER_COLUMNS)
            counts = (summary.records, summary.imported, summary.written, summary.bytes)
            return counts, dict(summary.dead_lettered_by_reason), table, dead

        with caplog.at_level(logging.INFO, "lagless.importer.batch_writer"):
            by_tasks = imported("tasks")
        assert "records left to Spark's rows" in caplog.text  # the path under test
        monkeypatch.setattr(write_path, "table_writer", lambda options, sink, target: None)
        by_rows = imported("rows")

    assert by_tasks == by_rows
    counts, reasons, table, _ = by_tasks
    assert counts[:2] == (404, 401)
    assert reasons == {NOT_CONFLUENT: 1, UNKNOWN_SCHEMA_ID: 1, UNDECODABLE: 1}
    by_id = {row[3]: row[3:] for row in table if row[3] is not None}
    assert by_id[5] == (5, "r5", 5 / 7, False, 5, "-")
    assert by_id[300] == (300, "r300", 300 / 7, True, None, "s")
