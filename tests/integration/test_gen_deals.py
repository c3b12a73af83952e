"""`lagless gen`'s deals profile (field report 002) imported as a typed table: large deal
documents keyed by the deal id, runs of updates, tombstones. Upserting on the deal id must
leave exactly each deal's newest version, deleted deals absent. Embedded broker over TCP,
real Spark, real SQLite and PostgreSQL, a stand-in Schema Registry over HTTP."""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import sys
from typing import Any

import fastavro
import psycopg
import pytest

from lagless.gen import produce_profile
from lagless.gen.deals import DEALS_AVRO_SCHEMA, DEALS_DDL, DealRecords
from lagless.gen.profiles import DEALS_PARTITIONS, deals
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from tests.harness.schema_registry import SchemaRegistry
from tests.integration.test_crash_safety import read_topic

pytestmark = pytest.mark.spark


def gen(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lagless", "gen", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_deals_as_json_upserted_on_the_deal_id_keep_each_deals_newest_version(
    broker, kafka, topic_name, tmp_path, spark
):
    broker.create_topic(topic_name, DEALS_PARTITIONS)
    profile = deals(record_bytes=2_000)
    produced = produce_profile(
        kafka, topic_name, profile, keys=6, compression="zstd", shape=DealRecords("json")
    )
    newest = {int(key): json.loads(n.value) for key, n in produced.newest_by_key().items()}
    deleted = {int(key) for key in produced.deleted_keys()}
    assert produced.truncated_partitions() == []
    assert deleted and newest and not deleted & set(newest)
    spec = ImportSpec(
        kafka=kafka,
        topics=(topic_name,),
        sink_url=f"sqlite:///{tmp_path}/out.db",
        checkpoint=str(tmp_path / "ckpt"),
        write="upsert",
        value_format="json",
        value_schema=DEALS_DDL,
        key_fields=("deal_id",),
    )

    summary = run_import(spec, spark=spark)

    with sqlite3.connect(tmp_path / "out.db") as conn:
        stored = conn.execute(
            f"SELECT deal_id, version, price, options FROM {topic_name} ORDER BY deal_id"
        ).fetchall()
        remembered = conn.execute(f"SELECT deal_id FROM {topic_name}_tombstones").fetchall()
    assert [(d, v) for d, v, _, _ in stored] == sorted(
        (d, doc["version"]) for d, doc in newest.items()
    )
    for deal_id, _, price, options in stored:
        expected = newest[deal_id]
        assert price == expected["price"]  # SQLite keeps decimals as text, exact
        inactive = [o["option_id"] for o in json.loads(options) if not o["active"]]
        assert inactive == [o["option_id"] for o in expected["options"] if not o["active"]]
    assert deleted <= {row[0] for row in remembered}
    assert summary.records == produced.records and summary.dead_lettered == 0


def test_gen_deals_as_avro_through_a_schema_registry_into_postgresql(
    broker, kafka, topic_name, tmp_path, spark, postgres
):
    """The command line end to end: gen registers the schema and writes the Confluent wire
    format; the import reads the schema from the registry. Expected rows come from the topic
    read back with a plain consumer and decoded with fastavro."""
    broker.create_topic(topic_name, DEALS_PARTITIONS)
    with SchemaRegistry() as registry:
        args = ["--bootstrap", broker.bootstrap, "--topic", topic_name, "--profile", "deals"]
        args += ["--scale", "0.1", "--record-bytes", "4000", "--keys", "5"]
        result = gen(*args, "--value-format", "avro", "--schema-registry", registry.url)
        assert result.returncode == 0, result.stderr
        assert "tombstone" in result.stdout

        records = read_topic(kafka, topic_name, DEALS_PARTITIONS)
        last: dict[bytes | None, Any] = {}
        for record in sorted(records, key=lambda r: (r.partition, r.offset)):
            last[record.key] = record.value  # a deal's records share one partition
        schema = fastavro.parse_schema(DEALS_AVRO_SCHEMA)

        def decoded(value: bytes) -> dict[str, Any]:
            assert value[0] == 0  # Confluent's magic byte, then the schema id
            return fastavro.schemaless_reader(io.BytesIO(value[5:]), schema, schema)

        summary = run_import(
            ImportSpec(
                kafka=kafka,
                topics=(topic_name,),
                sink_url=postgres.url,
                checkpoint=str(tmp_path / "ckpt"),
                write="upsert",
                value_format="avro",
                schema_registry=registry.url,
                key_fields=("deal_id",),
            ),
            spark=spark,
        )

    with psycopg.connect(postgres.url) as conn:
        stored = conn.execute(
            f"SELECT deal_id, version, price, jsonb_array_length(options) FROM {topic_name}"
        ).fetchall()
    expected = [decoded(value) for value in last.values() if value is not None]
    assert sorted(stored) == sorted(
        (d["deal_id"], d["version"], d["price"], len(d["options"])) for d in expected
    )
    assert len(expected) < len(last)  # some deals' last record is a tombstone
    assert summary.records == len(records) and summary.dead_lettered == 0


def test_gen_deals_writes_its_schema_and_refuses_bad_input_in_one_line(
    broker, kafka, topic_name, tmp_path
):
    broker.create_topic(topic_name, DEALS_PARTITIONS)
    base = ["--bootstrap", broker.bootstrap, "--topic", topic_name, "--scale", "0.01"]
    refused = [
        ["--profile", "deals", "--value-format", "avro"],  # plain Avro needs the schema file
        ["--profile", "seed-000", "--value-format", "avro"],
        ["--profile", "deals", "--schema-registry", "http://127.0.0.1:9"],  # JSON values
        ["--profile", "deals", "--poison", "0.1"],
        ["--profile", "deals", "--value-format", "avro", "--schema-registry", "http://127.0.0.1:9"],
    ]
    for args in refused:
        result = gen(*base, *args)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
    schema_file = tmp_path / "deals.avsc"

    result = gen(
        *base, "--profile", "deals", "--value-format", "avro", "--write-schema", str(schema_file)
    )

    assert result.returncode == 0, result.stderr
    assert json.loads(schema_file.read_text()) == DEALS_AVRO_SCHEMA
    produced = deals(scale=0.01).total_records
    assert f"produced {produced:,} records" in result.stdout
    assert len(read_topic(kafka, topic_name, DEALS_PARTITIONS)) == produced  # refused: none
