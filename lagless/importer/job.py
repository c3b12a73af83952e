"""The import job: a Structured Streaming query from the lagless Kafka source into a sink.

Offsets are decided by the source on the driver and journaled by Spark in the checkpoint
before a batch runs; the batch is written to the sink (idempotently); Spark then records
the batch as committed. A crash anywhere replays the batch into the same rows.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pyarrow.compute as pc

from lagless.exceptions import BadInput, TerminalError
from lagless.importer.checkpoint import batch_end_offsets, last_end_offsets
from lagless.importer.dead_letter_topic import DeadLetterTopic
from lagless.importer.failpoints import failpoint
from lagless.importer.group import GroupCommitter
from lagless.importer.rows import accepted, dead_letters, rejection_reasons, shape
from lagless.kafka_config import KafkaConfig
from lagless.progress import Collector, Summary
from lagless.sinks import Sink, Target, check_identifier, sink_from_url
from lagless.sinks.base import ValueFormat, WriteMode, check_writable_path
from lagless.source import SOURCE_NAME
from lagless.source.offsets import OffsetReader, Offsets

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

RunMode = Literal["bulk", "continuous"]

# Task slots per Spark core: a little more than one keeps a core busy while a task starts.
SLOTS_PER_CORE = 2


def slots_for(parallelism: int) -> int:
    return max(2, parallelism * SLOTS_PER_CORE)


@dataclass(frozen=True)
class ImportSpec:
    kafka: KafkaConfig
    topics: tuple[str, ...]
    sink_url: str
    checkpoint: str
    table: str | None = None
    write: WriteMode = "append"
    mode: RunMode = "bulk"
    value_format: ValueFormat = "raw"
    max_records_per_batch: int | None = None
    max_bytes_per_batch: int | None = None
    slots: int | None = None
    trigger_seconds: float = 0.5
    fail_on_data_loss: bool = True
    master: str | None = None
    group: str | None = None
    max_record_bytes: int | None = None
    dead_letter_topic: str | None = None
    # Milliseconds since the epoch: start at the first record this recent; in bulk mode, stop
    # before the first one that recent (Spark's startingTimestamp / endingTimestamp).
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    extra_source_options: dict[str, str] = field(default_factory=dict)

    def target(self) -> Target:
        if self.table is None and len(self.topics) != 1:
            raise BadInput("importing several topics needs --table")
        return Target(check_identifier(self.table or self.topics[0]), self.write, self.value_format)

    def source_options(self, slots: int) -> dict[str, str]:
        options = self.kafka.source_options()
        options.update(
            {
                "kafka.bootstrap.servers": self.kafka.bootstrap,
                "subscribe": ",".join(self.topics),
                "startingOffsets": "earliest",
                "failOnDataLoss": str(self.fail_on_data_loss).lower(),
                "slots": str(slots),
            }
        )
        if self.max_records_per_batch:
            options["maxRecordsPerBatch"] = str(self.max_records_per_batch)
        else:
            options["maxBytesPerBatch"] = str(
                self.max_bytes_per_batch or sink_from_url(self.sink_url).max_batch_bytes
            )
        if self.starting_timestamp is not None:
            options["startingTimestamp"] = str(self.starting_timestamp)
        if self.ending_timestamp is not None:
            options["availableNowEndingTimestamp"] = str(self.ending_timestamp)
        writer = self.executor_writer()
        if writer is not None:
            options["executorWriter"], options["executorWriterConfig"] = writer
        options.update(self.extra_source_options)
        return options

    def executor_writer(self) -> tuple[str, str] | None:
        """The store's writer for the source's tasks, when they may write records themselves:
        no record can be rejected (raw values, no size limit), none goes to a dead-letter topic,
        nothing needs Spark's rows (append). Else None: rows go through Spark."""
        target = self.target()
        if (
            target.value_format != "raw"
            or target.mode != "append"
            or self.max_record_bytes is not None
            or self.dead_letter_topic is not None
        ):
            return None
        return sink_from_url(self.sink_url).executor_writer(target)


@dataclass
class Checked:
    """What validation found, so the run does not ask the broker twice."""

    sink: Sink
    target: Target
    broker: OffsetReader
    partitions: list[tuple[str, int]]


def check(spec: ImportSpec) -> Checked:
    """Every bad-input check, before anything is written to the sink or the checkpoint."""
    target = spec.target()
    sink = sink_from_url(spec.sink_url)
    sink.check(target)
    check_writable_path(spec.checkpoint, "checkpoint directory", folder=True)
    broker = OffsetReader(spec.kafka)
    partitions = broker.partitions(spec.topics)
    if spec.dead_letter_topic is not None:
        if spec.dead_letter_topic in spec.topics:
            raise BadInput(f"--dead-letter-topic {spec.dead_letter_topic!r} is being imported")
        broker.partitions([spec.dead_letter_topic])
    return Checked(sink, target, broker, partitions)


class BatchWriter:
    """foreachBatch: write one micro-batch, then report it."""

    def __init__(
        self, spec: ImportSpec, checked: Checked, collector: Collector, target_end: Offsets | None
    ) -> None:
        self.spec = spec
        self.checked = checked
        self.collector = collector
        self.target_end = target_end
        self.summary = Summary()
        self.committer = GroupCommitter(spec.kafka, spec.group) if spec.group else None
        self.dead_letter_topic = (
            DeadLetterTopic(spec.kafka, spec.dead_letter_topic) if spec.dead_letter_topic else None
        )
        self.written_by_tasks = spec.executor_writer() is not None

    def __call__(self, records: DataFrame, batch_id: int) -> None:
        end = batch_end_offsets(self.spec.checkpoint, batch_id)
        if self.written_by_tasks:
            self._commit_task_files(records, batch_id)
        else:
            self._write_rows(records, batch_id, sorted(end))
        if self.committer is not None:
            self.committer.commit(end)
            failpoint("after-group-commit")
        self.collector.batch(self.summary, self.remaining_lag(end))

    def _commit_task_files(self, receipts: DataFrame, batch_id: int) -> None:
        """The source's tasks wrote the records (executorWriter); `receipts` says what."""
        target = self.checked.target
        sink = self.checked.sink
        sink.discard_staged(target)
        failpoint("before-write")
        collected = receipts.toArrow()  # runs the tasks: a row per piece, not per record
        sink.commit_staged(collected, target, batch_id)
        failpoint("after-write")
        by_partition: Counter[tuple[str, int]] = Counter()
        for topic, partition, records in zip(
            *(collected.column(c).to_pylist() for c in ("topic", "partition", "records")),
            strict=True,
        ):
            by_partition[(topic, partition)] += records
        read = sum(by_partition.values())
        size = pc.sum(collected.column("bytes")).as_py() or 0
        self.summary.add_batch({tp: n for tp, n in by_partition.items() if n}, size, read, {})

    def _write_rows(
        self, records: DataFrame, batch_id: int, partitions: list[tuple[str, int]]
    ) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        target = self.checked.target
        sink = self.checked.sink
        reasons = rejection_reasons(target, self.spec.max_record_bytes)
        # Counted while the rows stream into the sink: one pass over the batch, not three.
        # Two SQL expressions rather than a Column per partition: building Columns costs a
        # JVM round trip each, which on 24 partitions was half a second of every batch.
        observation = Observation(f"lagless_batch_{batch_id}")
        shaped = shape(records, target, self.spec.max_record_bytes).observe(
            observation,
            F.expr("coalesce(sum(bytes), 0) AS bytes"),
            F.expr(f"array({_counts_sql(partitions, reasons)}) AS counts"),
        )
        failpoint("before-write")
        written = sink.write(accepted(shaped, target), target, batch_id)
        observed = observation.get
        per_partition = observed["counts"][: len(partitions)]
        dead = {
            r: n for r, n in zip(reasons, observed["counts"][len(partitions) :], strict=True) if n
        }
        if dead:
            # Rare: read the batch again rather than cache every batch for it.
            rejected = dead_letters(shaped)
            if self.dead_letter_topic is not None:
                collected = rejected.toArrow()  # once, for the topic and the table both
                self.dead_letter_topic.send(collected)
                rejected = records.sparkSession.createDataFrame(collected)
            sink.write_dead_letters(rejected, target, batch_id)
        failpoint("after-write")
        by_partition = {tp: n for tp, n in zip(partitions, per_partition, strict=True) if n}
        if written is None:
            written = sum(by_partition.values()) - sum(dead.values())
        self.summary.add_batch(by_partition, observed["bytes"], written, dead)

    def remaining_lag(self, end: Offsets) -> int:
        broker = self.checked.broker
        latest = self.target_end or broker.latest(self.checked.partitions)
        return sum(max(0, high - end.get(tp, 0)) for tp, high in latest.items())


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _counts_sql(partitions: list[tuple[str, int]], reasons: list[str]) -> str:
    """Records per partition, then per rejection reason, as SQL aggregates."""
    return ", ".join(
        [f"count_if(topic = {_sql_string(t)} AND partition = {p})" for t, p in partitions]
        + [f"count_if(error = {_sql_string(r)})" for r in reasons]
    )


@contextmanager
def _stop_requests(enabled: bool) -> Iterator[threading.Event]:
    """SIGINT/SIGTERM ask a continuous import to stop after the batch in flight."""
    requested = threading.Event()
    if not enabled:
        yield requested
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda *_: requested.set())
    try:
        yield requested
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_import(spec: ImportSpec, collector: Collector | None = None, spark: Any = None) -> Summary:
    collector = collector or Collector()
    checked = check(spec)
    from lagless.importer.spark import spark_session, warm_up_in_background

    warming = None
    if spark is None:
        spark = spark_session(spec.master)
        warming = warm_up_in_background(spark)
    slots = spec.slots or slots_for(spark.sparkContext.defaultParallelism)
    checked.sink.prepare(checked.target)

    low, high = checked.broker.watermarks(checked.partitions)
    done = last_end_offsets(spec.checkpoint)
    target_end = dict(high) if spec.mode == "bulk" else None
    if target_end is not None and spec.ending_timestamp is not None:
        target_end = timestamp_offsets(checked, spec.ending_timestamp, low, target_end)
    if spec.starting_timestamp is not None:
        low = timestamp_offsets(checked, spec.starting_timestamp, low, high)
    high = target_end or high
    writer = BatchWriter(spec, checked, collector, target_end)
    started = time.monotonic()
    collector.start(sum(max(0, h - max(done.get(tp, low[tp]), low[tp])) for tp, h in high.items()))

    stream = spark.readStream.format(SOURCE_NAME).options(**spec.source_options(slots)).load()
    writer_stream = stream.writeStream.foreachBatch(writer).option(
        "checkpointLocation", spec.checkpoint
    )
    if spec.mode == "bulk":
        writer_stream = writer_stream.trigger(availableNow=True)
    else:
        writer_stream = writer_stream.trigger(processingTime=f"{spec.trigger_seconds} seconds")
    with _stop_requests(spec.mode == "continuous") as stop:
        query = writer_stream.start()
        try:
            _await(query, stop)
        finally:
            if query.isActive:
                query.stop()
    writer.summary.seconds = time.monotonic() - started
    if warming is not None:
        warming.join()
    if writer.committer is not None:
        writer.committer.close()
    failure = query.exception()
    if failure is not None:
        raise TerminalError(f"import stopped: {_first_line(str(failure))}")
    collector.finish(writer.summary)
    return writer.summary


def timestamp_offsets(checked: Checked, ms: int, low: Offsets, high: Offsets) -> Offsets:
    """Each partition's first offset at or after ms, else its high offset."""
    found = checked.broker.offsets_for_times(dict.fromkeys(high, ms), high)
    resolved = {}
    for tp, h in high.items():
        offset = found.get(tp)
        resolved[tp] = h if offset is None else min(max(offset, low[tp]), h)
    return resolved


def _await(query: Any, stop: threading.Event) -> None:
    # A source that fails while planning leaves the query active but stalled: poll its error.
    while query.isActive and query.exception() is None:
        if stop.is_set() and not query.status.get("isTriggerActive", False):
            return
        query.awaitTermination(0.2)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:500]
    return text
