"""Primary-key changes keep their TOASTed values (issue 56, point 2), end to end: a real
PostgreSQL under the default REPLICA IDENTITY, a table with a TOASTed text and a TOASTed
text[], real Debezium through `lagless debezium` (Kafka Connect's headers: the delete carries
`__debezium.newkey`, the create `__debezium.oldkey` and the placeholder in each TOASTed
column), then a Debezium import (`--value-format debezium`) into SQLite, PostgreSQL, Delta and
Iceberg (and Delta with soft deletes: Spark's rows) in batches of 5 records, so that a
change's delete and create fall into different batches and partitions: each mirror equals the
source row for row, and marks no value unknown. The same events without their headers leave
the new rows' TOASTed values NULL, marked and counted (`lagless import`'s summary and
`lag --sink`). The imports into the stores run in process on the shared Spark session; the one
whose printed summary is asserted is `lagless import` as a user runs it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from lagless.broker import EmbeddedBroker
from lagless.cdc.envelope import Deletes
from lagless.cdc.key_change import NEW_KEY, OLD_KEY, UNKNOWN
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from lagless.progress.collector import Summary
from lagless.scenarios.debezium_connector import drop_slot
from tests.harness.debezium import connection, skip_reason
from tests.harness.mirror_workload import mirror_rows
from tests.harness.postgres import PostgresServer

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason())),
]

TOPIC = "shop.public.t"
COLUMNS = ["id", "body", "tags", "n"]
# Random text PostgreSQL cannot compress below its TOAST threshold (~2 KB).
BIG = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 120))"
BIG_ARRAY = "(SELECT array_agg(md5(random()::text)) FROM generate_series(1, 120))"
WORKLOAD = [
    "UPDATE t SET n = n + 1 WHERE id % 2 = 0",  # every TOASTed value the placeholder
    "UPDATE t SET id = id + 1000 WHERE id <= 6",  # key changes, several in one statement
    "UPDATE t SET n = n + 10 WHERE id > 1000",  # the new keys updated, their TOASTs unchanged
    f"UPDATE t SET body = {BIG} WHERE id = 1002",
    "UPDATE t SET id = 2001, n = 7 WHERE id = 1001",  # a key changed again, and n with it
    "UPDATE t SET id = 11 WHERE id = 1003",  # to a key never used
    "UPDATE t SET n = n + 100",
    "DELETE FROM t WHERE id = 1004",
    f"INSERT INTO t VALUES (9, {BIG}, {BIG_ARRAY}, 0)",
    "UPDATE t SET id = id + 1 WHERE id = 9",
]


def records(
    bootstrap: str, topic: str = TOPIC
) -> list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]:
    """The topic's records, partition by partition, with their headers."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4()}"})
    found = []
    try:
        for partition in range(2):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, partition, low)])
            offset = low
            while offset < high - 1:
                message = consumer.poll(10)
                assert message is not None and message.error() is None
                found.append((message.key(), message.value(), list(message.headers() or [])))
                offset = message.offset()
    finally:
        consumer.close()
    return found


def wait_for_records(bootstrap: str, at_least: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 240
    while len(records(bootstrap)) < at_least:
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "Debezium did not send the workload's events"
        time.sleep(1)


def imported_here(
    spark: Any, bootstrap: str, sink: str, folder: Path, deletes: Deletes = "hard"
) -> Summary:
    """The import of TOPIC into table t_mirror in batches of 5 records, in process: its
    summary."""
    spec = ImportSpec(
        kafka=KafkaConfig(bootstrap),
        topics=(TOPIC,),
        sink_url=sink,
        checkpoint=str(folder / f"ckpt-t_mirror-{uuid.uuid4().hex}"),
        table="t_mirror",
        write="upsert",
        value_format="debezium",
        max_records_per_batch=5,
        deletes=deletes,
    )
    return run_import(spec, spark=spark)


def imported(bootstrap: str, sink: str, table: str, topic: str, folder: Path) -> str:
    """`lagless import` in batches of 5 records, as a user runs it: its printed summary."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "lagless", "import", "--bootstrap", bootstrap),
            *("--topic", topic, "--value-format", "debezium", "--table", table),
            *("--sink", sink, "--checkpoint", str(folder / f"ckpt-{table}-{uuid.uuid4().hex}")),
            *("--max-records-per-batch", "5"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@dataclass
class Captured:
    """The workload's change events in TOPIC (`lagless debezium`'s), the source's rows at its
    end, and the PostgreSQL server (a store too)."""

    bootstrap: str
    server: PostgresServer
    source: list[tuple]
    folder: Path


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> Iterator[Captured]:
    folder = tmp_path_factory.mktemp("key-changes")
    server = PostgresServer.start_new(logical=True)
    slot = f"lagless_{uuid.uuid4().hex[:8]}"
    try:
        with EmbeddedBroker() as broker:
            broker.create_topic(TOPIC, 2)  # as Kafka Connect makes it (the mock makes none)
            source = _captured(broker.bootstrap, server, slot, folder)
            yield Captured(broker.bootstrap, server, source, folder)
    finally:
        drop_slot(server.url, slot)
        server.destroy()


def _captured(bootstrap: str, server: PostgresServer, slot: str, folder: Path) -> list[tuple]:
    """The table made, `lagless debezium` running while the workload changes it, then stopped
    with SIGTERM: the source's rows at the end."""
    db = server.connection
    url = f"postgresql://{db['user']}:{db['password']}@{db['host']}:{db['port']}/{db['dbname']}"
    with connection(server) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, body text, tags text[], n int)")
        conn.execute(f"INSERT INTO t SELECT g, {BIG}, {BIG_ARRAY}, 0 FROM generate_series(1, 8) g")
        toasted = conn.execute(
            "SELECT count(*) FROM t WHERE pg_column_size(body) > 2100 AND "
            "pg_column_size(tags) > 2100"
        ).fetchone()
        assert toasted == (8,)
    debezium = subprocess.Popen(
        [
            *(sys.executable, "-m", "lagless", "debezium", "--bootstrap", bootstrap),
            *("--database", url, "--table", "public.t", "--topic-prefix", "shop"),
            *("--state", str(folder / "debezium"), "--slot", slot),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_records(bootstrap, 8, debezium)  # the snapshot
        with connection(server) as conn:
            for statement in WORKLOAD:
                conn.execute(statement)
            source = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM t").fetchall()
        # The workload's events as Debezium sends them (a key change: a delete, its tombstone
        # and a create): 4+18+6+1+3+3+8+2+1+3.
        wait_for_records(bootstrap, 8 + 49, debezium)
        debezium.send_signal(signal.SIGTERM)
        assert debezium.wait(120) == 0
    finally:
        if debezium.poll() is None:
            debezium.kill()
            debezium.wait(60)
    return sorted((tuple(row) for row in source), key=repr)


def test_the_delete_and_the_create_carry_kafka_connects_headers(captured):
    _assert_headers(records(captured.bootstrap))


@pytest.mark.timeout(1800)
def test_key_changes_keep_their_toasted_values_in_every_store(captured, spark):
    sinks = {
        "SQLite": f"sqlite:///{captured.folder}/m.db",
        "PostgreSQL": captured.server.url,
        "Delta": f"delta:///{captured.folder}/delta",
        "Iceberg": f"iceberg:///{captured.folder}/iceberg",
    }
    for store, sink in sinks.items():  # "t_mirror": the source's database is a store
        summary = imported_here(spark, captured.bootstrap, sink, captured.folder)
        assert summary.unknown_rows == 0, summary  # the printed summary's "unknown values"
        mirrored = mirror_rows(sink, "t_mirror", COLUMNS)
        assert mirrored == _as_read(captured.source), f"{store}: the mirror differs from the source"
        assert mirror_rows(sink, "t_mirror", [UNKNOWN]) == [(None,)] * len(mirrored), store


def test_soft_deletes_keep_the_old_keys_flagged(captured, spark):
    """Soft deletes take Spark's rows into Delta: the rows alive equal the source's, each old
    key kept, flagged, with its values."""
    sink = f"delta:///{captured.folder}/soft"
    imported_here(spark, captured.bootstrap, sink, captured.folder, deletes="soft")
    rows = mirror_rows(sink, "t_mirror", [*COLUMNS, "_deleted"])
    assert [row[:-1] for row in rows if row[-1] != "true"] == _as_read(captured.source)
    gone = sorted(int(row[0]) for row in rows if row[-1] == "true")
    assert gone == [1, 2, 3, 4, 5, 6, 9, 1001, 1003, 1004], gone


def _assert_headers(found: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]]):
    """Kafka Connect's headers, as SimpleHeaderConverter writes them: each key change's delete
    (and its tombstone) names the new key, its create the old one."""
    moved = [(json.loads(v)["payload"]["op"] if v else None, h) for _, v, h in found]
    news = [dict(h)[NEW_KEY] for op, h in moved if op == "d" and NEW_KEY in dict(h)]
    olds = [dict(h)[OLD_KEY] for op, h in moved if op == "c" and OLD_KEY in dict(h)]
    ids = [*range(1001, 1007), 2001, 11, 10]
    assert sorted(news) == sorted(f'{{"id":{i}}}'.encode() for i in ids), news
    assert len(olds) == len(news) and b'{"id":1001}' in olds, olds


def _as_read(rows: list[tuple]) -> list[tuple]:
    """The source's rows as mirror_rows reads a mirror's (its canonical values)."""
    from tests.harness.mirror_workload import canonical

    return sorted(
        (tuple(canonical(c, v) for c, v in zip(COLUMNS, row, strict=True)) for row in rows),
        key=repr,
    )


def test_without_headers_the_values_are_unknown_marked_and_counted(captured):
    """The same events without their headers (a producer that drops them): the new rows'
    TOASTed values are NULL, never the placeholder, marked in _unknown and counted."""
    bare = f"{TOPIC}.bare"
    producer = Producer({"bootstrap.servers": captured.bootstrap, "partitioner": "murmur2_random"})
    for key, value, _ in records(captured.bootstrap):
        producer.produce(bare, key=key, value=value)
    assert producer.flush(30) == 0
    sink = f"sqlite:///{captured.folder}/bare.db"
    summary = imported(captured.bootstrap, sink, "bare", bare, captured.folder)
    # The rows a key change made: their tags never reached the mirror, nor their body but
    # 1002's (updated since).
    moved = {2001, 1002, 11, 1005, 1006, 10}
    rows = {int(row[0]): row for row in mirror_rows(sink, "bare", [*COLUMNS, UNKNOWN])}
    assert set(rows) == {int(row[0]) for row in captured.source}
    assert {i for i, row in rows.items() if row[-1] is not None} == moved
    assert all(rows[i][2] is None and (rows[i][1] is None) == (i != 1002) for i in moved)
    assert f"unknown values  {len(moved)} rows" in summary, summary
    shown = subprocess.run(
        [
            *(sys.executable, "-m", "lagless", "lag", "--bootstrap", captured.bootstrap),
            *("--sink", sink, "--table", "bare", "--topic", bare, "--json"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["unknown_rows"] == len(moved)
