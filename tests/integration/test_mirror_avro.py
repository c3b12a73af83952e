"""Avro change events through a schema registry, mirrored as their JSON twins are (issue 56,
point 10): a real PostgreSQL, real Debezium twice over the same tables (`lagless debezium
--schema-registry` writing Avro through Kafka Connect's AvroConverter to the registry of
tests/harness/schema_registry.py, and the connector writing Kafka Connect's JSON), the embedded
broker, and `lagless import --value-format debezium --schema-registry` (the command for
SQLite, the import's run for the other stores) into SQLite, Delta, Iceberg and PostgreSQL.

The type corpus (tests/harness/type_corpus.py: NaN and ±Infinity, infinite and out-of-range
dates, decimals, TOASTed values) snapshotted, then streamed: values out of range, TOASTed rows
updated on another column, a primary-key change, a delete (and its tombstone), a column added
with a default, a column widened, and a table without a primary key. Each Avro mirror holds
each value by its type's rule, equals its JSON twin row for row, and dead-letters alone, with
their reasons, the out-of-range values and the values that are not Avro of the registry.
A registry that does not answer, or whose events the topics do not hold (JSON ones), is bad
input in one line before anything is written.
"""

from __future__ import annotations

import json
import signal
import struct
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.scenarios.debezium_connector import drop_slot
from lagless.source.avro_values import NOT_CONFLUENT, UNDECODABLE, UNKNOWN_SCHEMA_ID
from tests.harness import type_corpus as corpus
from tests.harness.debezium import DebeziumConnector, connection, records_in, skip_reason
from tests.harness.mirror_workload import stored_rows
from tests.harness.postgres import PostgresServer
from tests.harness.schema_registry import SchemaRegistry

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason())),
]

DATABASE = "avro_types"
TABLES = ("corpus", "notes")
ADDED = "extra"  # the column added mid-run, with a default
DELETED_ID, ADDED_ID = 5, 6
NOTES_COLUMNS = ["body", "n", "_op", "_lsn", "_source_ts_ms"]
REFUSED_REASON = "0001-01-01 .. 9999-12-31"


def _create(db: Any) -> None:
    db.execute(corpus.DDL)
    db.execute(corpus.create_table("corpus"))
    for statement in corpus.inserts("corpus"):
        db.execute(statement)
    db.execute("CREATE TABLE notes (body text, n integer)")  # no primary key
    db.execute("ALTER TABLE notes REPLICA IDENTITY FULL")
    db.execute("INSERT INTO notes VALUES ('first', 1), ('second', 2)")


def _change(db: Any) -> None:
    """The streamed changes, each kind the JSON mirror's tests make."""
    for statement in corpus.refused_inserts("corpus"):
        db.execute(statement)
    db.execute(f"UPDATE corpus SET n = n + 1 WHERE id IN {(*corpus.TOASTED_IDS, 0)}")
    db.execute("UPDATE corpus SET id = %s WHERE id = %s", corpus.KEY_CHANGED[::-1])
    db.execute(f"INSERT INTO corpus SELECT {DELETED_ID}, n, {_cases()} FROM corpus WHERE id = 1")
    db.execute(f"DELETE FROM corpus WHERE id = {DELETED_ID}")
    db.execute(f"ALTER TABLE corpus ADD COLUMN {ADDED} numeric(6,2) DEFAULT 1.25")
    db.execute(f"INSERT INTO corpus (id, n, {ADDED}) VALUES ({ADDED_ID}, 0, 9.5)")
    db.execute("ALTER TABLE corpus ALTER COLUMN i2 TYPE integer")  # widened
    db.execute("UPDATE corpus SET i2 = 100000 WHERE id = 1")
    db.execute("INSERT INTO notes VALUES ('third', 3)")
    db.execute("UPDATE notes SET n = 20 WHERE body = 'second'")
    db.execute("DELETE FROM notes WHERE body = 'first'")


def _cases() -> str:
    return ", ".join(case.column for case in corpus.CASES)


def _debezium_avro(source: PostgresServer, bootstrap: str, registry: str, state: Path, slot: str):
    """`lagless debezium --schema-registry`, as a user runs it."""
    db = {**source.connection, "dbname": DATABASE}
    url = f"postgresql://{db['user']}:{db['password']}@{db['host']}:{db['port']}/{db['dbname']}"
    command = [
        *(sys.executable, "-m", "lagless", "debezium", "--bootstrap", bootstrap),
        *("--database", url, "--table", "public.corpus", "--table", "public.notes"),
        *("--topic-prefix", "avro", "--state", str(state), "--slot", slot),
        *("--schema-registry", registry),
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_alike(bootstrap: str, process: subprocess.Popen, json_counts: dict[str, int]) -> None:
    """Until the Avro topics hold as many events as their JSON twins."""
    deadline = time.monotonic() + 240
    while any(records_in(bootstrap, f"avro.public.{t}") < n for t, n in json_counts.items()):
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "the Avro connector fell behind the JSON one"
        time.sleep(0.5)


def _not_avro(bootstrap: str, registry: SchemaRegistry) -> None:
    """Three values of the Avro topic that are not events: not the wire format, a schema id
    the registry lacks, the corpus's schema id with a body cut short."""
    schema_id = registry.subjects["avro.public.corpus-value"][-1]
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in (
        (b"1", b"not avro"),
        (b"2", b"\x00" + struct.pack(">I", 9999) + b"\x02"),
        (b"3", b"\x00" + struct.pack(">I", schema_id) + b"\x02"),
    ):
        producer.produce("avro.public.corpus", key=key, value=value, partition=0)
    assert producer.flush(30) == 0


def _spec(kafka: Any, sink: str, prefix: str, checkpoint: Path, registry: str | None) -> ImportSpec:
    return ImportSpec(
        kafka=kafka,
        topics=(),
        topic_pattern=rf"{prefix}\.public\..*",
        sink_url=sink,
        checkpoint=str(checkpoint),
        table=f"{prefix}_{{table}}",
        write="upsert",
        value_format="debezium",
        schema_registry=registry,
    )


def _import_command(kafka: Any, sink: str, checkpoint: Path, registry: str) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "lagless", "import", "--bootstrap", kafka.bootstrap),
            *("--topic-pattern", r"avro\.public\..*", "--table", "avro_{table}"),
            *("--value-format", "debezium", "--schema-registry", registry),
            *("--sink", sink, "--checkpoint", str(checkpoint)),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr


def test_avro_events_mirror_as_json_ones_do(broker, kafka, tmp_path, spark):
    source = PostgresServer.start_new(logical=True)
    try:
        _mirror_of(source, broker, kafka, tmp_path)
    finally:
        source.destroy()


def _mirror_of(source: PostgresServer, broker: Any, kafka: Any, tmp_path: Path) -> None:
    admin = connection(source)
    admin.execute(f"CREATE DATABASE {DATABASE}")
    url = source.url.rsplit("/", 1)[0] + f"/{DATABASE}"
    import psycopg
    from psycopg.rows import dict_row

    db = psycopg.connect(url, autocommit=True, row_factory=dict_row)
    _create(db)
    json_connector = DebeziumConnector(
        source, kafka.bootstrap, [f"public.{t}" for t in TABLES], topic_prefix="json"
    )
    json_connector.extra["database.dbname"] = DATABASE
    for prefix in ("avro", "json"):
        for table in TABLES:
            broker.create_topic(f"{prefix}.public.{table}", 2)
    slot = f"lagless_{uuid.uuid4().hex[:8]}"
    with SchemaRegistry() as registry:
        avro_process = _debezium_avro(source, kafka.bootstrap, registry.url, tmp_path / "dbz", slot)
        try:
            json_connector.start()
            snapshot = {"corpus": len(corpus.inserts("corpus")), "notes": 2}
            json_connector.wait_for_events(sum(snapshot.values()))
            _wait_alike(kafka.bootstrap, avro_process, snapshot)  # then the changes stream
            _change(db)
            json_connector.wait_quiet()
            counts = {t: records_in(kafka.bootstrap, f"json.public.{t}") for t in TABLES}
            _wait_alike(kafka.bootstrap, avro_process, counts)
            avro_process.send_signal(signal.SIGTERM)
            out, err = avro_process.communicate(timeout=120)
            assert avro_process.returncode == 0 and err == "", err
            assert "in Avro through " in out.splitlines()[0], out
            _not_avro(kafka.bootstrap, registry)
            _mirror_everywhere(source, db, kafka, tmp_path, registry.url)
        finally:
            if avro_process.poll() is None:
                avro_process.kill()
            json_connector.destroy()
            drop_slot(url, slot)
            db.close()
            admin.execute(f"DROP DATABASE {DATABASE} WITH (FORCE)")
            admin.close()


def _mirror_everywhere(source, db, kafka, tmp_path: Path, registry: str) -> None:
    refused = corpus.REFUSED_FIRST_ID
    wanted = {
        row["id"]: row
        for row in db.execute(
            f"SELECT id, n, {corpus.selected()}, {ADDED} FROM corpus WHERE id < {refused}"
        )
    }
    sinks = {
        "SQLite": f"sqlite:///{tmp_path}/m.db",
        "Delta": f"delta:///{tmp_path}/delta",
        "Iceberg": f"iceberg:///{tmp_path}/iceberg",
        "PostgreSQL": source.url,
    }
    for store, sink in sinks.items():
        if store == "SQLite":
            _import_command(kafka, sink, tmp_path / f"ckpt-avro-{store}", registry)
        else:
            run_import(_spec(kafka, sink, "avro", tmp_path / f"ckpt-avro-{store}", registry))
        run_import(_spec(kafka, sink, "json", tmp_path / f"ckpt-json-{store}", None))
        _assert_alike(store, sink, wanted)
        _assert_notes(store, sink)
    _assert_soft_deletes(kafka, sinks["SQLite"], tmp_path, registry)


def _held(store: str, sink: str, table: str) -> dict[int, dict[str, Any]]:
    """The corpus's mirror: by id, each row's values canonical as `store` holds them."""
    columns = [*corpus.COLUMNS, ADDED]
    return {
        row["id"]: {**corpus.as_held(store, row), ADDED: corpus.canonical("decimal", row[ADDED])}
        for row in corpus.stored(sink, table, columns)
    }


def _assert_alike(store: str, sink: str, source: dict[int, dict[str, Any]]) -> None:
    """The Avro mirror holds the source by each type's rule, as the JSON mirror does."""
    mirrored = _held(store, sink, "avro_corpus")
    wanted = {
        i: {**corpus.as_held(store, row), ADDED: corpus.canonical("decimal", row[ADDED])}
        for i, row in source.items()
    }
    # The key changed: its TOASTed values, its create's placeholders, are the old row's (the
    # headers of `lagless debezium` pair the two, in Avro as in JSON).
    wrong = {
        (i, name): (mirrored.get(i, {}).get(name), value)
        for i, row in wanted.items()
        for name, value in row.items()
        if mirrored.get(i, {}).get(name) != value
    }
    assert not wrong, f"{store}: (mirror, rule) by (id, column): {wrong}"
    assert set(mirrored) == set(wanted) and DELETED_ID not in mirrored, sorted(mirrored)
    assert mirrored[ADDED_ID][ADDED] == "9.5" and mirrored[1][ADDED] == "1.25"
    assert mirrored[1]["i2"] == 100000  # the widened column
    assert mirrored == _held(store, sink, "json_corpus"), f"{store}: Avro and JSON differ"
    letters = corpus.dead_letters(sink, "avro_corpus")
    refused = [letter for letter in letters if REFUSED_REASON in letter]
    assert len(refused) == len(corpus.REFUSED), letters
    not_events = sorted(set(letters) - set(refused))
    assert not_events == sorted([NOT_CONFLUENT, UNKNOWN_SCHEMA_ID, UNDECODABLE]), letters
    assert len(corpus.dead_letters(sink, "json_corpus")) == len(corpus.REFUSED)


def _assert_notes(store: str, sink: str) -> None:
    """A table without a primary key: its change log, the same event for event (but where
    each connector's own snapshot read the rows)."""
    avro, json = (_change_log(sink, f"{prefix}_notes") for prefix in ("avro", "json"))
    assert avro == json, store
    ops = sorted((row[2], row[0], row[1]) for row in avro)
    changes = [("r", "first", 1), ("r", "second", 2), ("c", "third", 3), ("u", "second", 20)]
    # a delete's row, in a log of no key: its change alone
    assert ops == sorted([*changes, ("d", None, None)]), ops


def _change_log(sink: str, table: str) -> list[tuple[Any, ...]]:
    """The rows of a change log, a snapshot's without its position (a connector's own)."""
    rows = stored_rows(sink, table, NOTES_COLUMNS)
    return sorted((row if row[2] != "r" else (*row[:3], None, None) for row in rows), key=repr)


def _assert_soft_deletes(kafka: Any, sink: str, tmp_path: Path, registry: str) -> None:
    """--deletes soft: Spark's rows decode the events (not the tasks' change files)."""
    spec = _spec(kafka, sink, "avro", tmp_path / "ckpt-soft", registry)
    topics = ("avro.public.corpus",)
    run_import(replace(spec, topic_pattern=None, topics=topics, table="soft", deletes="soft"))
    columns = ["id", "_deleted"]
    flags = dict(stored_rows(sink, "soft", columns))
    hard = {row[0] for row in stored_rows(sink, "avro_corpus", ["id"])}
    deleted = {DELETED_ID: 1, corpus.KEY_CHANGED[0]: 1}  # a key changed: its old key deleted
    assert flags == {**dict.fromkeys(hard, 0), **deleted}, flags
    soft = _held("SQLite", sink, "soft")
    assert {i: soft[i] for i in hard} == _held("SQLite", sink, "avro_corpus")
    letters = sorted(corpus.dead_letters(sink, "soft"))
    assert letters == sorted(corpus.dead_letters(sink, "avro_corpus")), letters


@pytest.mark.parametrize("registry_answers", [True, False], ids=["json-events", "no-registry"])
def test_a_registry_that_does_not_fit_is_one_line_and_exit_2(
    broker, kafka, topic_name, tmp_path, registry_answers
):
    broker.create_topic(topic_name, 1)
    event = {"schema": {"type": "struct", "fields": []}, "payload": {"op": "c", "after": {}}}
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    producer.produce(topic_name, key=b'{"id": 1}', value=json.dumps(event).encode())
    assert producer.flush(30) == 0
    with SchemaRegistry() as registry:
        url = registry.url if registry_answers else "http://127.0.0.1:9"
        done = subprocess.run(
            [
                *(sys.executable, "-m", "lagless", "import", "--bootstrap", kafka.bootstrap),
                *("--topic", topic_name, "--value-format", "debezium", "--schema-registry", url),
                *("--sink", f"sqlite:///{tmp_path}/m.db", "--checkpoint", str(tmp_path / "c")),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    said = "no Avro change event" if registry_answers else "cannot reach the schema registry"
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
