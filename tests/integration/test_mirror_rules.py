"""`--value-format debezium` from the CLI on change events written as Debezium writes them
(tests/unit/test_cdc_envelope.py's; real Debezium runs in test_mirror.py): plain Parquet
refuses a mirror but keeps the change log, `--cdc-columns` and `--deletes soft`."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from confluent_kafka import Producer

from lagless.importer.write_path import Way
from lagless.kafka.config import KafkaConfig
from tests.harness.mirror_workload import mirror_rows
from tests.unit.test_cdc_envelope import ROW, event, key, partition_of

pytestmark = pytest.mark.spark

TOPIC = "db.public.t"


def produce_changes(kafka: KafkaConfig) -> int:
    """Keys 1 and 2 created, 1 updated, 2 deleted (and its tombstone), 2 created again, 3
    created then deleted: 8 records, 7 change events."""
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    changes = [
        (1, event("c", {**ROW, "id": 1}, lsn=1)),
        (2, event("c", {**ROW, "id": 2, "name": "b"}, lsn=2)),
        (1, event("u", {**ROW, "id": 1, "n": 9}, lsn=3)),
        (2, event("d", None, before={"id": 2}, lsn=4)),
        (2, None),
        (3, event("c", {**ROW, "id": 3}, lsn=5)),
        (3, event("d", None, before={"id": 3}, lsn=6)),
        (2, event("c", {**ROW, "id": 2, "name": "again"}, lsn=7)),
    ]
    for id_, value in changes:
        producer.produce(TOPIC, key=key(id_), value=value, partition=partition_of(id_))
    producer.flush(30)
    return len(changes)


def lagless_import(kafka: KafkaConfig, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            *(sys.executable, "-m", "lagless", "import", "--bootstrap", kafka.bootstrap),
            *("--topic", TOPIC, "--table", "t", "--value-format", "debezium"),
            *("--checkpoint", str(tmp_path / "ckpt"), *args),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def sink_and_table(store: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, str]:
    """A store's URL for a test, and its table (one of its own in the shared PostgreSQL)."""
    if store == "postgresql":
        return request.getfixturevalue("postgres").url, f"t_{tmp_path.name[-12:].lower()}"
    if store == "sqlite":
        return f"sqlite:///{tmp_path}/m.db", "t"
    return f"{store}:///{tmp_path}/lake", "t"


@pytest.mark.matrix
def test_parquet_refuses_a_mirror_in_one_line_and_keeps_the_change_log(broker, kafka, tmp_path):
    broker.create_topic(TOPIC, 2)
    produce_changes(kafka)
    sink = f"parquet:///{tmp_path}/lake"
    refused = lagless_import(kafka, tmp_path, "--sink", sink)
    assert refused.returncode == 2
    assert refused.stderr.strip().count("\n") == 0
    assert "append only" in refused.stderr and "--write append" in refused.stderr
    assert not (tmp_path / "lake" / "t").exists() or not any((tmp_path / "lake" / "t").iterdir())

    kept = lagless_import(kafka, tmp_path, "--sink", sink, "--write", "append")
    assert kept.returncode == 0, kept.stderr[-2000:]
    rows = ds.dataset(tmp_path / "lake" / "t", format="parquet").to_table().to_pylist()
    log = sorted((r["_lsn"], r["_op"], r["id"], r["n"]) for r in rows)
    assert log == [
        (1, "c", 1, 3),
        (2, "c", 2, 3),
        (3, "u", 1, 9),
        (4, "d", 2, None),
        (5, "c", 3, 3),
        (6, "d", 3, None),
        (7, "c", 2, 3),
    ]  # a row per change event, the tombstone none


@pytest.mark.parametrize(
    "store",
    [
        "sqlite",
        pytest.param("delta", marks=pytest.mark.matrix),
        pytest.param("iceberg", marks=pytest.mark.matrix),
        pytest.param("postgresql", marks=pytest.mark.matrix),
    ],
)
def test_soft_deletes_keep_the_row_flagged_with_the_mirrors_own_columns(
    broker, kafka, tmp_path, spark, store, request
):
    from lagless.importer.job import run_import
    from lagless.importer.spec import ImportSpec

    broker.create_topic(TOPIC, 2)
    produce_changes(kafka)
    sink, table = sink_and_table(store, tmp_path, request)
    spec = ImportSpec(
        kafka=kafka,
        topics=(TOPIC,),
        sink_url=sink,
        checkpoint=str(tmp_path / "ckpt"),
        table=table,
        write="upsert",
        value_format="debezium",
        cdc_columns=True,
        deletes="soft",
        max_records_per_batch=3,
    )
    run_import(spec, spark=spark)
    columns = ["id", "name", "n", "price", "_op", "_source_ts_ms", "_lsn", "_deleted"]
    assert mirror_rows(sink, table, columns) == [
        ("1", "a", "9", "1.5", "u", "1700000000003", "3", "false"),
        ("2", "again", "3", "1.5", "c", "1700000000007", "7", "false"),
        # Deleted: its last values kept, flagged, with the delete's own columns.
        ("3", "a", "3", "1.5", "d", "1700000000006", "6", "true"),
    ]
    # Batches of skipped tombstones only recorded their ranges: a rerun finds them held.
    assert run_import(spec, spark=spark).records == 0


@pytest.mark.parametrize(
    "store",
    [
        "sqlite",
        "delta",
        pytest.param("iceberg", marks=pytest.mark.matrix),
        pytest.param("postgresql", marks=pytest.mark.matrix),
    ],
)
def test_a_mirror_decoded_by_the_tasks_applies_the_rules_and_keeps_rejected_events(
    broker, kafka, tmp_path, spark, store, request, caplog
):
    """Hard deletes, the default: the source's tasks decode the events (change_files.py),
    small batches so that a key's events span several. Events a mirror cannot apply go to
    the dead-letter table with their reason, the rest is applied."""
    from lagless.cdc.envelope import NOT_JSON, OTHER_OP
    from lagless.importer.job import run_import
    from lagless.importer.plan import check
    from lagless.importer.spec import ImportSpec

    broker.create_topic(TOPIC, 2)
    produce_changes(kafka)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    producer.produce(TOPIC, key=key(1), value=b"{not json", partition=partition_of(1))
    # A message event (op m) is not a change of the table: dead-lettered. (A TRUNCATE, op t,
    # is applied here: tests/integration/test_mirror_ddl.py.)
    producer.produce(TOPIC, key=key(1), value=event("m", None, lsn=9), partition=partition_of(1))
    producer.flush(30)
    sink, table = sink_and_table(store, tmp_path, request)
    spec = ImportSpec(
        kafka=kafka,
        topics=(TOPIC,),
        sink_url=sink,
        checkpoint=str(tmp_path / "ckpt"),
        table=table,
        write="upsert",
        value_format="debezium",
        cdc_columns=True,
        max_records_per_batch=3,
    )
    plan = check(spec)
    with plan.sink, plan.reader:
        assert plan.write_path.way is Way.CHANGE_FILES  # the tasks decode
    with caplog.at_level(logging.INFO, logger="lagless.importer.batch_writer"):
        summary = run_import(spec, spark=spark)
    # Each batch's line says where its time went: its tasks, or the driver's store commits.
    line = r"batch \d+: .* in [\d.]+ s \(tasks [\d.]+ s, driver [\d.]+ s\)"
    assert len(re.findall(line, caplog.text)) == summary.batches >= 4
    columns = ["id", "name", "n", "_op", "_lsn"]
    assert mirror_rows(sink, table, columns) == [
        ("1", "a", "9", "u", "3"),
        ("2", "again", "3", "c", "7"),
    ]
    letters = sorted(mirror_rows(sink, f"{table}_dlq", ["error"]))
    assert letters == sorted([(NOT_JSON,), (OTHER_OP,)])
    assert summary.records == 10
    assert summary.dead_lettered_by_reason == {NOT_JSON: 1, OTHER_OP: 1}
    run_import(spec, spark=spark)  # a rerun finds it all held: nothing changes
    assert len(mirror_rows(sink, f"{table}_dlq", ["error"])) == 2


def test_one_routed_import_mirrors_each_table_of_the_database(broker, kafka, tmp_path, spark):
    """Debezium's topics of two tables, `--topic-pattern` with `--table '{table}'` (the table
    named by the events' source block): a mirror of each, from one import (in process;
    test_routing.py runs a pattern through the CLI)."""
    from lagless.importer.job import run_import
    from tests.integration.test_ledger import spec_for

    for topic in ("db.public.t", "db.public.orders_v2"):
        broker.create_topic(topic, 2)
    produce_changes(kafka)  # into db.public.t
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    source_u = {**ROW, "id": 5, "name": "u"}
    # A topic named otherwise than its table: the event's source block names the table.
    value = event("c", source_u, lsn=8, table="u")
    producer.produce("db.public.orders_v2", key=key(5), value=value, partition=partition_of(5))
    producer.flush(30)
    sink = f"sqlite:///{tmp_path}/m.db"
    # The pattern in place of spec_for's one topic; each event's source block names its table.
    routed = {"topics": (), "topic_pattern": r"db\.public\..*", "table": "{table}"}
    mirror = {"write": "upsert", "value_format": "debezium"}
    spec = spec_for(kafka, "", sink, tmp_path / "ckpt", **routed, **mirror)
    assert run_import(spec, spark=spark).records == 8 + 1
    assert mirror_rows(sink, "t", ["id", "name", "n"]) == [("1", "a", "9"), ("2", "again", "3")]
    assert mirror_rows(sink, "u", ["id", "name", "n"]) == [("5", "u", "3")]
