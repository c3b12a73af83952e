"""The short script a user would write instead of `lagless import` to land a topic in Parquet.

Two Python processes, each assigned every other partition from its start (no consumer group,
nothing committed), `consume(10000)` in a loop with lagless's own reader settings
(lagless.kafka.config.KafkaConfig.reader), the records gathered into columns and written by
pyarrow as Parquet files of 1M rows, with the columns lagless's Parquet sink writes (topic,
partition, offset, key, value, timestamp in ms). It keeps none of lagless's guarantees (a crash
leaves half-written files and no record of where to resume): the peer lagless is timed against,
launch to exit (bench/import_throughput.py).

Imports nothing of lagless, as a user's script would not; prints one JSON line.

    .venv/bin/python bench/script_peer.py --bootstrap HOST:PORT --topic T --out DIR
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka import Consumer, KafkaError, TopicPartition

# KafkaConfig.reader()'s settings, copied as a user would copy them.
READER_SETTINGS: dict[str, Any] = {
    "fetch.wait.max.ms": 10,
    "queued.min.messages": 200_000,
    "queued.max.messages.kbytes": 16 * 1024,
    "fetch.max.bytes": 1024 * 1024,
    "fetch.queue.backoff.ms": 10,
    "group.id": "lagless-range-reader",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "auto.offset.reset": "error",
}
CONSUME_BATCH = 10_000
SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("timestamp", pa.int64()),
    ]
)


def copy_share(
    bootstrap: str, topic: str, partitions: list[int], out: str, index: int, rows_per_file: int
) -> int:
    """Reads `partitions` from their low to their high watermark into Parquet files; the
    records written."""
    consumer = Consumer({"bootstrap.servers": bootstrap, **READER_SETTINGS})
    ends = {}
    starts = []
    for p in partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        if high > low:
            ends[p] = high
            starts.append(TopicPartition(topic, p, low))
    consumer.assign(starts)
    columns: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    written = files = 0

    def flush() -> None:
        nonlocal written, files
        if columns["offset"]:
            table = pa.table(columns, schema=SCHEMA)
            pq.write_table(table, os.path.join(out, f"part-{index}-{files:05d}.parquet"))
            written += table.num_rows
            files += 1
            for values in columns.values():
                values.clear()

    while ends:
        for message in consumer.consume(CONSUME_BATCH, timeout=1.0):
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(error.str())
                continue
            partition, offset = message.partition(), message.offset()
            columns["topic"].append(topic)
            columns["partition"].append(partition)
            columns["offset"].append(offset)
            columns["key"].append(message.key())
            columns["value"].append(message.value())
            columns["timestamp"].append(message.timestamp()[1])
            if offset + 1 >= ends.get(partition, 0):
                ends.pop(partition, None)
        if len(columns["offset"]) >= rows_per_file:
            flush()
    flush()
    consumer.close()
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True, help="folder for the Parquet files")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--rows-per-file", type=int, default=1_000_000)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    started = time.time()
    probe = Consumer({"bootstrap.servers": args.bootstrap, "group.id": "script-peer"})
    count = len(probe.list_topics(args.topic, timeout=10).topics[args.topic].partitions)
    probe.close()
    shares = [
        (args.bootstrap, args.topic, list(range(i, count, args.processes)), args.out, i)
        for i in range(args.processes)
    ]
    with multiprocessing.Pool(args.processes) as pool:
        records = sum(pool.starmap(copy_share, [(*s, args.rows_per_file) for s in shares]))
    files = sum(1 for name in os.listdir(args.out) if name.endswith(".parquet"))
    print(json.dumps({"records": records, "files": files, "seconds": time.time() - started}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
