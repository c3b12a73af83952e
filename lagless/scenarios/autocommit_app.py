"""Report 004's consumer, a process of its own so that it can crash for real (os._exit: no
close, no last commit): auto-commit on, offsets stored as records are handed over — before
they are processed — and records written into a SQLite table through lagless's sink, whose
ledger says what the table holds.

`python -m lagless.scenarios.autocommit_app BOOTSTRAP SINK_URL MODE`, MODE:
- repeat: crashes after writing records the auto-commit has not covered yet (a restart reads
  them again);
- lose: crashes once the auto-commit covered records it has not written (nobody reads them
  again).
Prints one JSON line of counts before it dies."""

from __future__ import annotations

import json
import os
import sys
import time

import pyarrow as pa
from confluent_kafka import Consumer, Message, TopicPartition

from lagless.scenarios.base import GROUP, TOPIC, coordinates
from lagless.sinks import Target
from lagless.sinks.ledger import Batch
from lagless.sinks.sqlite import SqliteSink

# One partition: the restart reads again exactly what the first run wrote past its last commit.
PARTITIONS = 1
# Written before the crash is staged: a few batches of normal work first.
WORK_BEFORE_CRASH = 40
AUTO_COMMIT_MS = 300
IDLE_EXIT_S = 15.0

SCHEMA = pa.schema(
    [("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
     ("key", pa.binary()), ("value", pa.binary()), ("timestamp", pa.int64())]
)  # fmt: skip


def main(bootstrap: str, sink_url: str, mode: str) -> None:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": GROUP,
            "enable.auto.commit": True,  # the report's mistake: commits what poll handed over
            "auto.commit.interval.ms": AUTO_COMMIT_MS,
            "auto.offset.reset": "earliest",
        }
    )
    partitions = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)  # from the committed offsets
    sink = SqliteSink.from_url(sink_url)
    target = Target(TOPIC, "append", "raw")
    sink.prepare(target)
    held = sink.ledger(target, [(TOPIC, p) for p in range(PARTITIONS)])
    counts = {"read": 0, "repeated": 0, "written": 0, "lost": 0}
    idle_since = time.monotonic()
    batch_id = 0
    while time.monotonic() - idle_since < IDLE_EXIT_S:
        records = [m for m in consumer.consume(20, 1.0) if m.error() is None]
        if not records:
            continue
        idle_since = time.monotonic()
        counts["read"] += len(records)
        counts["repeated"] += sum(
            1
            for _, partition, offset in map(coordinates, records)
            if offset < held.get((TOPIC, partition), 0)
        )
        ends = _ends(records)
        if mode == "lose" and counts["written"] >= WORK_BEFORE_CRASH:
            _wait_until_committed(consumer, ends)
            counts["lost"] = len(records)
            _crash(counts)
        batch_id += 1
        _write(sink, target, batch_id, records)
        counts["written"] += len(records)
        if mode == "repeat" and counts["written"] >= WORK_BEFORE_CRASH:
            committed = _committed(consumer, ends)
            if any(committed.get(p, -1) < end for p, end in ends.items()):
                _crash(counts)
    consumer.close()
    print(json.dumps(counts), flush=True)


def _ends(records: list[Message]) -> dict[int, int]:
    ends: dict[int, int] = {}
    for _, partition, offset in map(coordinates, records):
        ends[partition] = max(ends.get(partition, 0), offset + 1)
    return ends


def _committed(consumer: Consumer, ends: dict[int, int]) -> dict[int, int]:
    found = consumer.committed([TopicPartition(TOPIC, p) for p in ends], timeout=5)
    return {tp.partition: tp.offset for tp in found}


def _wait_until_committed(consumer: Consumer, ends: dict[int, int]) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.1)  # librdkafka's own thread auto-commits; a poll would store more
        committed = _committed(consumer, ends)
        if all(committed.get(p, -1) >= end for p, end in ends.items()):
            return


def _write(sink: SqliteSink, target: Target, batch_id: int, records: list[Message]) -> None:
    columns = {
        "topic": [m.topic() for m in records],
        "partition": [m.partition() for m in records],
        "offset": [m.offset() for m in records],
        "key": [m.key() for m in records],
        "value": [m.value() for m in records],
        "timestamp": [m.timestamp()[1] for m in records],
    }
    table = pa.Table.from_pydict(columns, schema=SCHEMA)
    ranges: dict[tuple[str, int], tuple[int, int]] = {}
    for _, partition, offset in map(coordinates, records):
        start, end = ranges.get((TOPIC, partition), (offset, offset))
        ranges[(TOPIC, partition)] = (min(start, offset), max(end, offset + 1))
    reader = pa.RecordBatchReader.from_batches(SCHEMA, table.to_batches())
    sink.write_arrow(reader, target, Batch(batch_id, ranges))


def _crash(counts: dict[str, int]) -> None:
    print(json.dumps(counts), flush=True)
    os._exit(1)


if __name__ == "__main__":
    main(*sys.argv[1:4])
