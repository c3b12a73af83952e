"""Throughput of a bulk `lagless import` beside a plain confluent-kafka consumer, in one run.

Starts the embedded broker, fills a topic, then reads it three times:

1. baseline: one confluent-kafka consumer assigned every partition from the start, reading
   until the end offsets and touching each record's key and value (no store);
2. a bulk import into Parquet (written by the executors);
3. a bulk import into SQLite (written by the driver).

Spark session startup is timed apart from the imports, which reuse that one session; tiny
warm-up imports of another topic (also timed apart) start the Python workers first, so the
drain times compare steady states (--no-warmup to include that cost in the Parquet run).
Records/s and MB/s (MB = 10^6 bytes of key + value) are printed as a table, then as one line
of JSON for quoting.

    .venv/bin/python bench/import_throughput.py [--partitions 8] [--records N] [--master URL]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from lagless.broker import EmbeddedBroker
from lagless.gen import explicit, produce_profile
from lagless.gen.profiles import COMPRESSIONS, DEFAULT_RECORD_BYTES, PARTITION_BYTES_LIMIT
from lagless.importer.job import ImportSpec, run_import
from lagless.kafka_config import KafkaConfig
from lagless.progress import Collector, Summary

TOPIC = "bench"
CONSUME_BATCH = 10_000
WARMUP_TOPIC = "warmup"
WARMUP_RECORDS = 100
console = Console(stderr=True)


@dataclass
class Measured:
    name: str
    records: int
    bytes: int
    seconds: float
    startup_seconds: float | None = None

    @property
    def records_per_second(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_second(self) -> float:
        return self.bytes / self.seconds / 1e6


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=8, help="topic partitions (default 8)")
    parser.add_argument(
        "--records",
        type=int,
        help="records in all (default: as many as the embedded broker keeps)",
    )
    parser.add_argument(
        "--record-bytes", type=int, default=DEFAULT_RECORD_BYTES, help="value size (default 100)"
    )
    parser.add_argument(
        "--compression",
        choices=COMPRESSIONS,
        default="lz4",
        help="producer compression; lz4 fits ~6x more records in the broker (default lz4)",
    )
    parser.add_argument("--keys", type=int, default=1_000, help="distinct keys per partition")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument("--max-records-per-batch", type=int, help="import micro-batch limit")
    parser.add_argument(
        "--no-warmup",
        dest="warmup",
        action="store_false",
        help="measure the first import cold (Python workers, JIT) instead of after a tiny one",
    )
    args = parser.parse_args()
    if args.partitions < 1:
        parser.error("--partitions must be at least 1")
    if args.records is not None and args.records < args.partitions:
        parser.error("--records must be at least --partitions")
    return args


def counts_that_fit(args: argparse.Namespace) -> list[int]:
    per_record = explicit([1], args.record_bytes).stored_bytes(0, args.compression)
    total = args.records or PARTITION_BYTES_LIMIT // per_record * args.partitions
    share, extra = divmod(total, args.partitions)
    return [share + (p < extra) for p in range(args.partitions)]


@contextmanager
def progress_bar(label: str, total: int | None) -> Iterator[tuple[Progress, TaskID]]:
    with Progress(
        SpinnerColumn(),
        TextColumn(f"[bold]{label:<18}"),
        BarColumn(),
        TextColumn("{task.completed:>12,.0f} records"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        yield progress, progress.add_task(label, total=total)


def produce(kafka: KafkaConfig, args: argparse.Namespace) -> tuple[int, int]:
    counts = counts_that_fit(args)
    with progress_bar("producing", sum(counts)) as (bar, task):
        produced = produce_profile(
            kafka,
            TOPIC,
            explicit(counts, args.record_bytes),
            keys=args.keys,
            compression=args.compression,
            on_progress=lambda done: bar.update(task, completed=done),
        )
    if produced.truncated_partitions():
        sys.exit(f"the broker dropped the start of partitions {produced.truncated_partitions()}")
    console.print(
        f"produced {produced.records:,} records of {args.record_bytes} B into "
        f"{args.partitions} partitions ({args.compression}) at "
        f"{produced.records_per_second:,.0f} records/s"
    )
    return produced.records, produced.value_bytes


def consume_baseline(kafka: KafkaConfig, partitions: int, expected: int) -> Measured:
    """Every partition from the start to its end offset, as fast as one consumer goes."""
    consumer = Consumer(kafka.reader())
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1]
            for p in range(partitions)
        }
        remaining = {p for p, end in ends.items() if end > 0}
        records = size = 0
        with progress_bar("baseline consumer", expected) as (bar, task):
            started = time.perf_counter()
            consumer.assign([TopicPartition(TOPIC, p, 0) for p in remaining])
            while remaining:
                for message in consumer.consume(CONSUME_BATCH, timeout=1.0):
                    error = message.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:
                            raise RuntimeError(error.str())
                        continue
                    key, value = message.key(), message.value()
                    size += (len(key) if key else 0) + (len(value) if value else 0)
                    records += 1
                    partition, offset = message.partition() or 0, message.offset() or 0
                    if offset + 1 >= ends[partition]:
                        remaining.discard(partition)
                bar.update(task, completed=records)
            seconds = time.perf_counter() - started
    finally:
        consumer.close()
    return Measured("confluent-kafka", records, size, seconds)


def warm_up(spark: Any, broker: EmbeddedBroker, workdir: Path, args: argparse.Namespace) -> float:
    """Tiny imports first, so that the measured ones do not pay for starting Python workers."""
    broker.create_topic(WARMUP_TOPIC, args.partitions)
    kafka = KafkaConfig(broker.bootstrap)
    produce_profile(kafka, WARMUP_TOPIC, explicit([WARMUP_RECORDS] * args.partitions))
    started = time.perf_counter()
    for sink in ("parquet", "sqlite"):
        bulk_import(spark, kafka, WARMUP_TOPIC, sink, workdir, args)
    return time.perf_counter() - started


class BarCollector(Collector):
    """The import's progress on a rich bar, without the CLI's summary tables."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self.progress = progress
        self.task = task

    def start(self, lag: int) -> None:
        self.progress.update(self.task, total=lag)

    def batch(self, summary: Summary, lag: int) -> None:
        self.progress.update(self.task, completed=summary.records, total=summary.records + lag)


def start_spark(master: str) -> tuple[Any, float]:
    from lagless.importer.spark import spark_session

    with console.status(f"starting a Spark session on {master}"):
        started = time.perf_counter()
        spark = spark_session(master)
        return spark, time.perf_counter() - started


def bulk_import(
    spark: Any, kafka: KafkaConfig, topic: str, sink: str, workdir: Path, args: argparse.Namespace
) -> Measured:
    url = f"sqlite:///{workdir}/bench.db" if sink == "sqlite" else f"parquet:///{workdir}/lake"
    spec = ImportSpec(
        kafka=kafka,
        topics=(topic,),
        sink_url=url,
        checkpoint=str(workdir / f"checkpoint-{topic}-{sink}"),
        max_records_per_batch=args.max_records_per_batch,
    )
    with progress_bar(f"{topic} → {sink}", None) as (bar, task):
        started = time.perf_counter()
        summary = run_import(spec, BarCollector(bar, task), spark=spark)
        seconds = time.perf_counter() - started
    return Measured(f"lagless → {sink}", summary.records, summary.bytes, seconds)


def report(results: list[Measured], produced: int, warmup: float, args: argparse.Namespace) -> None:
    baseline = results[0]
    table = Table(
        title=f"{produced:,} records x {args.record_bytes} B, {args.partitions} partitions",
        caption=f"drain = run_import on a ready session; warm-up imports took {warmup:.1f} s",
    )
    for column in ("reader", "records", "startup s", "drain s", "records/s", "MB/s", "vs baseline"):
        table.add_column(column, justify="left" if column == "reader" else "right", no_wrap=True)
    for result in results:
        startup = "" if result.startup_seconds is None else f"{result.startup_seconds:.1f}"
        table.add_row(
            result.name,
            f"{result.records:,}",
            startup,
            f"{result.seconds:.2f}",
            f"{result.records_per_second:,.0f}",
            f"{result.mb_per_second:.1f}",
            f"{result.records_per_second / baseline.records_per_second:.3f}",
        )
    # Wide enough for the table when stdout is a pipe (rich assumes 80 columns there).
    Console(width=max(Console().width, 100)).print(table)
    figures: dict[str, object] = {
        "records": produced,
        "record_bytes": args.record_bytes,
        "partitions": args.partitions,
        "compression": args.compression,
        "master": args.master,
    }
    for key, result in zip(("baseline", "parquet", "sqlite"), results, strict=True):
        entry: dict[str, float] = {
            "records_per_s": round(result.records_per_second),
            "mb_per_s": round(result.mb_per_second, 2),
            "seconds": round(result.seconds, 2),
        }
        if result is not baseline:
            entry["ratio"] = round(result.records_per_second / baseline.records_per_second, 4)
        figures[key] = entry
    figures["spark_startup_s"] = round(results[1].startup_seconds or 0.0, 2)
    figures["warmup_imports_s"] = round(warmup, 2)
    print(json.dumps(figures))


def main() -> int:
    args = parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="lagless-bench-"))
    try:
        with EmbeddedBroker(topics={TOPIC: args.partitions}) as broker:
            kafka = KafkaConfig(broker.bootstrap)
            produced, _ = produce(kafka, args)
            results = [consume_baseline(kafka, args.partitions, produced)]
            spark, startup = start_spark(args.master)
            try:
                warmup = warm_up(spark, broker, workdir, args) if args.warmup else 0.0
                for sink in ("parquet", "sqlite"):
                    results.append(bulk_import(spark, kafka, TOPIC, sink, workdir, args))
            finally:
                spark.stop()
            results[1].startup_seconds = startup
        short = [r.name for r in results if r.records != produced]
        if short:
            sys.exit(f"{', '.join(short)} read a different number of records than produced")
        report(results, produced, warmup, args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
