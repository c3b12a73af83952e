"""The import job end to end: embedded broker over TCP, real Spark (local[2]), real stores."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from lagless.gen import explicit, produce_profile
from lagless.importer.job import run_import
from lagless.importer.rows import INVALID_JSON, INVALID_UTF8, NULL_KEY
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from lagless.kafka.offset_reader import OffsetReader
from tests.harness import sqlite_elsewhere

pytestmark = pytest.mark.spark


def spec(
    kafka: KafkaConfig, topic: str, tmp_path: Path, sink: str = "sqlite", **kw: object
) -> ImportSpec:
    url = f"sqlite:///{tmp_path}/out.db" if sink == "sqlite" else f"parquet:///{tmp_path}/lake"
    return ImportSpec(
        kafka=kafka, topics=(topic,), sink_url=url, checkpoint=str(tmp_path / "ckpt"), **kw
    )  # type: ignore[arg-type]


def stored(tmp_path: Path, table: str) -> list[tuple]:
    """Read from another process: an import may be running in this one (sqlite_elsewhere.py)."""
    return sqlite_elsewhere.rows(
        tmp_path / "out.db", f'SELECT partition, offset, key, value FROM "{table}" ORDER BY 1, 2'
    )


def produced_offsets(summary) -> set[tuple[int, int]]:  # type: ignore[no-untyped-def]
    return {(p, o) for p, (start, end) in summary.offsets.items() for o in range(start, end)}


def test_append_lands_every_record_exactly_once_in_sqlite(
    broker, kafka, topic_name, tmp_path, spark
):
    broker.create_topic(topic_name, 4)
    produced = produce_profile(kafka, topic_name, explicit([3000, 0, 1200, 5]), keys=50)

    summary = run_import(spec(kafka, topic_name, tmp_path), spark=spark)

    rows = stored(tmp_path, topic_name)
    assert {(p, o) for p, o, _, _ in rows} == produced_offsets(produced)
    assert len(rows) == produced.records == summary.records == summary.written == summary.imported
    assert summary.by_partition[(topic_name, 0)] == 3000


def test_append_replayed_into_parquet_adds_no_duplicate(broker, kafka, topic_name, tmp_path, spark):
    broker.create_topic(topic_name, 3)
    produced = produce_profile(kafka, topic_name, explicit([700, 800, 900]), keys=10)

    run_import(spec(kafka, topic_name, tmp_path, sink="parquet"), spark=spark)
    # Forget that batch 0 was committed; a new record makes the rerun start Spark (with nothing
    # new it is up to date without it), which replays batch 0 into the same folder first.
    for name in os.listdir(tmp_path / "ckpt" / "commits"):
        os.remove(tmp_path / "ckpt" / "commits" / name)
    producer = Producer({"bootstrap.servers": kafka.bootstrap})
    producer.produce(topic_name, value=b"late", key=b"k", partition=0)
    producer.flush(30)
    rerun = run_import(spec(kafka, topic_name, tmp_path, sink="parquet"), spark=spark)
    assert rerun.batches == 2  # the replay, then the new record's

    table = pq.read_table(tmp_path / "lake" / topic_name)
    pairs = list(
        zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True)
    )
    assert len(pairs) == len(set(pairs))
    assert set(pairs) == produced_offsets(produced) | {(0, 700)}


def test_upsert_keeps_the_newest_value_per_key(broker, kafka, topic_name, tmp_path, spark):
    broker.create_topic(topic_name, 3)
    produced = produce_profile(kafka, topic_name, explicit([2000, 1500, 1000]), keys=7)

    run_import(spec(kafka, topic_name, tmp_path, write="upsert", value_format="json"), spark=spark)

    newest = produced.newest_by_key()
    rows = stored(tmp_path, topic_name)
    assert len(rows) == len(newest)
    assert {key.decode(): (p, o, value) for p, o, key, value in rows} == {
        key: (n.partition, n.offset, n.value.decode()) for key, n in newest.items()
    }


def test_records_the_store_cannot_take_are_dead_lettered_not_dropped(
    broker, kafka, topic_name, tmp_path, spark
):
    broker.create_topic(topic_name, 2)
    produced = produce_profile(kafka, topic_name, explicit([600, 600]), keys=20, poison=0.1)

    summary = run_import(
        spec(kafka, topic_name, tmp_path, write="upsert", value_format="json"), spark=spark
    )

    poison = produced.kinds
    assert summary.records == produced.records
    assert summary.dead_lettered_by_reason == {
        "value is not valid UTF-8": poison["invalid-utf8"],
        "value is not valid JSON": poison["invalid-json"],
        "null key in upsert mode": poison["null-key"],
    }
    dead = sum(poison[k] for k in ("invalid-utf8", "invalid-json", "null-key"))
    assert summary.dead_lettered == dead > 0
    assert summary.imported + summary.dead_lettered == summary.records
    with sqlite3.connect(tmp_path / "out.db") as conn:
        letters = conn.execute(
            f'SELECT partition, offset, stage, error FROM "{topic_name}_dlq"'
        ).fetchall()
    kinds = {"invalid-utf8": INVALID_UTF8, "invalid-json": INVALID_JSON, "null-key": NULL_KEY}
    assert sorted(letters) == sorted((p, o, "validate", kinds[k]) for p, o, k in produced.poison)


def test_dead_letters_also_go_to_a_topic_with_their_error_context_in_headers(
    broker, kafka, topic_name, tmp_path, spark
):
    broker.create_topic(topic_name, 2)
    broker.create_topic(f"{topic_name}-dlq", 1)
    produced = produce_profile(kafka, topic_name, explicit([400, 300]), keys=20, poison=0.1)

    summary = run_import(
        spec(
            kafka,
            topic_name,
            tmp_path,
            write="upsert",
            value_format="json",
            dead_letter_topic=f"{topic_name}-dlq",
        ),
        spark=spark,
    )

    consumer = Consumer(kafka.reader())
    consumer.assign([TopicPartition(f"{topic_name}-dlq", 0, 0)])
    sent = []
    while len(sent) < summary.dead_lettered:
        messages = consumer.consume(1000, timeout=10)
        assert messages, f"only {len(sent)} of {summary.dead_lettered} dead letters arrived"
        sent.extend(m for m in messages if m.error() is None)
    consumer.close()
    context = [
        {k.removeprefix("__connect.errors."): v.decode() for k, v in m.headers()} for m in sent
    ]
    kinds = {"invalid-utf8": INVALID_UTF8, "invalid-json": INVALID_JSON, "null-key": NULL_KEY}
    assert sorted(
        (c["topic"], int(c["partition"]), int(c["offset"]), c["stage"], c["exception.message"])
        for c in context
    ) == sorted((topic_name, p, o, "validate", kinds[k]) for p, o, k in produced.poison)
    with sqlite3.connect(tmp_path / "out.db") as conn:
        table = conn.execute(f'SELECT partition, offset, key, value FROM "{topic_name}_dlq"')
        in_table = sorted(table.fetchall())
    in_topic = sorted(
        (int(c["partition"]), int(c["offset"]), m.key(), m.value())
        for c, m in zip(context, sent, strict=True)
    )
    assert in_topic == in_table
    assert summary.dead_lettered == len(produced.poison) > 0


def test_a_typed_append_the_tasks_write_sends_what_they_leave_to_the_dead_letter_topic(
    broker, kafka, topic_name, tmp_path, spark, caplog
):
    """Typed JSON into Parquet, written by the source's tasks: the poison they cannot decode
    goes through Spark's rows and is dead-lettered once, into the table's `_dlq` and into
    --dead-letter-topic alike; every other record is a row."""
    import logging

    from tests.integration.test_crash_safety import stored as stored_in

    broker.create_topic(topic_name, 2)
    broker.create_topic(f"{topic_name}-dlq", 1)
    produced = produce_profile(kafka, topic_name, explicit([400, 300]), keys=20, poison=0.1)
    typed = spec(
        kafka,
        topic_name,
        tmp_path,
        sink="parquet",
        value_format="json",
        value_schema="seq BIGINT NOT NULL, pad STRING",
        dead_letter_topic=f"{topic_name}-dlq",
    )

    with caplog.at_level(logging.INFO, "lagless.importer.batch_writer"):
        summary = run_import(typed, spark=spark)

    assert "records left to Spark's rows" in caplog.text  # the path under test
    # A null key is no fault in a typed append: those records are rows.
    bad = sorted((p, o) for p, o, kind in produced.poison if kind != "null-key")
    consumer = Consumer(kafka.reader())
    consumer.assign([TopicPartition(f"{topic_name}-dlq", 0, 0)])
    sent = consumer.consume(len(bad) + 10, timeout=10)
    consumer.close()
    headers = [{k: v.decode() for k, v in m.headers()} for m in sent if m.error() is None]
    in_topic = sorted(
        (int(h["__connect.errors.partition"]), int(h["__connect.errors.offset"])) for h in headers
    )
    assert in_topic == bad
    assert stored_in(typed.sink_url, f"{topic_name}_dlq", ("partition", "offset")) == bad
    rows = stored_in(typed.sink_url, topic_name, ("partition", "offset"))
    assert len(rows) == 700 - len(bad) == summary.imported and not set(rows) & set(bad)


def test_bulk_stops_at_the_end_seen_at_start_while_a_producer_keeps_writing(
    broker, kafka, topic_name, tmp_path, spark
):
    broker.create_topic(topic_name, 2)
    produce_profile(kafka, topic_name, explicit([5000, 5000]), keys=100)
    reader = OffsetReader(kafka)
    stop = threading.Event()

    def keep_writing() -> None:
        producer = Producer(kafka.producer())
        while not stop.is_set():
            for i in range(200):
                producer.produce(topic_name, value=b"late", partition=i % 2)
            producer.poll(0)
            time.sleep(0.02)
        producer.flush(10)

    writer = threading.Thread(target=keep_writing)
    at_start = reader.log.latest([(topic_name, 0), (topic_name, 1)])
    writer.start()
    try:
        summary = run_import(spec(kafka, topic_name, tmp_path), spark=spark)
        at_end = reader.log.latest([(topic_name, 0), (topic_name, 1)])
    finally:
        stop.set()
        writer.join()

    rows = stored(tmp_path, topic_name)
    assert sum(at_end.values()) > summary.records >= sum(at_start.values())
    for partition in (0, 1):
        offsets = [o for p, o, _, _ in rows if p == partition]
        assert offsets == list(range(len(offsets)))  # contiguous from the log start
        assert len(offsets) < at_end[(topic_name, partition)]


def test_second_bulk_run_imports_only_what_arrived_since(
    broker, kafka, topic_name, tmp_path, spark
):
    broker.create_topic(topic_name, 2)
    first = produce_profile(kafka, topic_name, explicit([800, 300]), keys=10)
    assert run_import(spec(kafka, topic_name, tmp_path), spark=spark).records == first.records

    second = produce_profile(kafka, topic_name, explicit([100, 250]), keys=10, seed=1)
    summary = run_import(spec(kafka, topic_name, tmp_path), spark=spark)

    assert summary.records == second.records == 350
    rows = stored(tmp_path, topic_name)
    assert {(p, o) for p, o, _, _ in rows} == produced_offsets(first) | produced_offsets(second)


def test_continuous_import_picks_up_records_produced_after_it_started(
    broker, kafka, topic_name, tmp_path, spark
):
    broker.create_topic(topic_name, 2)
    produce_profile(kafka, topic_name, explicit([100, 100]), keys=10)
    later: list = []

    def holds(count: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if len(stored(tmp_path, topic_name)) == count:
                    return
            except sqlite3.OperationalError:
                pass
            time.sleep(0.3)

    def produce_later_then_interrupt() -> None:
        try:
            holds(200)  # the import started and caught up: what follows comes after
            later.append(produce_profile(kafka, topic_name, explicit([400, 50]), keys=10, seed=2))
            holds(650)
        finally:
            os.kill(os.getpid(), signal.SIGINT)

    helper = threading.Thread(target=produce_later_then_interrupt)
    helper.start()
    summary = run_import(
        spec(kafka, topic_name, tmp_path, mode="continuous", trigger_seconds=0.5), spark=spark
    )
    helper.join()

    rows = stored(tmp_path, topic_name)
    assert len(rows) == summary.records == 650
    assert {(p, o) for p, o, _, _ in rows} >= produced_offsets(later[0])
