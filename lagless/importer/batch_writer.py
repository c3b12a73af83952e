"""foreachBatch: write one micro-batch to the sink, then commit it to the group and report it.

Called by Spark after it journaled the batch's offsets and before it records the batch as
committed, so everything here may run again for the same batch: every write is idempotent.
A batch whose tasks decode its records into change files (a mirror, a raw upsert) returns
once they ran: its commits run on a thread of their own beside the next batch's tasks (one
batch's reading and the other's store write take a core each), marked in the checkpoint until
the store holds the batch (checkpoint.py `mark_storing`; job.py reads it again after a crash).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from lagless.cdc.envelope import CDC_COLUMNS, DELETED, NEW_SCHEMA_COLUMN, row_columns
from lagless.exceptions import NewTopics, SchemaChangeRefused, Stopped, TerminalError
from lagless.failpoints import failpoint
from lagless.importer import change_files
from lagless.importer.checkpoint import (
    batch_end_offsets,
    mark_storing,
    stop_table,
    unmark_storing,
)
from lagless.importer.dead_letter_topic import DeadLetterTopic
from lagless.importer.debezium import SchemaChanged, tell_columns_gone
from lagless.importer.group import GroupCommitter
from lagless.importer.maintenance import Schedule, schedule_for
from lagless.importer.plan import ImportPlan
from lagless.importer.routing import Destination
from lagless.importer.rows import (
    BYTES,
    ERROR,
    accepted,
    dead_letters,
    rejection_reasons,
    shape,
    sql_string,
)
from lagless.importer.spec import BatchSettings
from lagless.importer.write_path import Way
from lagless.kafka import TP, Offsets
from lagless.progress import Collector, Summary
from lagless.signals import StopRequest
from lagless.sinks.base import TaskWrittenSink, Written
from lagless.sinks.ledger import Batch, batch_ranges

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation, SparkSession

log = logging.getLogger(__name__)


@dataclass
class Tally:
    """What one table's part of a batch did, added up over the tables into the summary."""

    by_partition: Counter[TP] = field(default_factory=Counter)
    bytes: int = 0
    written: int = 0
    dead: Counter[str] = field(default_factory=Counter)
    # Records of table parts the ledger held already (another import committed them).
    already: int = 0

    def add(
        self,
        by_partition: dict[TP, int],
        size: int,
        written: int,
        dead: dict[str, int],
        already: bool = False,
    ) -> None:
        self.by_partition.update(by_partition)
        self.bytes += size
        if already:
            self.already += sum(by_partition.values())
            return
        self.written += written
        self.dead.update(dead)


@dataclass(frozen=True)
class Finished:
    """A batch committed: where it ended, the tables it wrote to, the seconds its tasks took
    (reading and decoding its records) where they ran before the driver's commits, and the
    seconds of the driver's work after them (mostly the store's commit)."""

    end: Offsets
    tables: list[str]
    tasks_s: float | None
    driver_s: float


def open_batch_writer(
    plan: ImportPlan,
    collector: Collector,
    target_end: Offsets | None,
    first_start: Offsets,
    opened: ExitStack,
    *,
    overlap: bool,
) -> BatchWriter:
    """An import's BatchWriter with what it writes to besides the store (the group's offsets,
    the dead-letter topic), each opened in `opened`: assembled alike in this process and in a
    Spark Connect server (connect_writer.py). overlap: the store's commits of a batch run
    beside the next batch's tasks (this process; a server commits each batch in it)."""
    spec = plan.spec
    committer = GroupCommitter(plan.reader.groups, spec.group) if spec.group else None
    dead_letter_topic = (
        opened.enter_context(DeadLetterTopic(spec.kafka, spec.dead_letter_topic))
        if spec.dead_letter_topic
        else None
    )
    maintenance = schedule_for(
        plan.sink,
        spec.run_id,
        lambda: [each.target.table for each in plan.destinations],
        spec.maintenance_policy,
        spec.maintain_every_s,
    )
    return BatchWriter(
        spec.batch_settings,
        plan,
        collector,
        target_end,
        committer,
        dead_letter_topic,
        first_start,
        overlap=overlap,
        maintenance=maintenance,
    )


class BatchWriter:
    """foreachBatch: write one micro-batch, each table's part with its own ranges, then report
    it. Made by open_batch_writer."""

    def __init__(
        self,
        settings: BatchSettings,
        plan: ImportPlan,
        collector: Collector,
        target_end: Offsets | None,
        committer: GroupCommitter | None = None,
        dead_letter_topic: DeadLetterTopic | None = None,
        first_start: Offsets | None = None,
        *,
        overlap: bool = False,
        maintenance: Schedule | None = None,
    ) -> None:
        self.settings = settings
        # The tables, each with what its ledger held when the import began (the source reads
        # nothing below it): with Spark's journaled ends, a batch's ranges in each. A routed
        # import adds the tables of topics that appear while it runs (job.admit_new_topics).
        self.plan = plan
        self.collector = collector
        self.target_end = target_end
        # Where the query's first batch starts.
        self.first_start = first_start or {}
        # Upsert: each partition's log time where the next batch starts (upsert_order.py):
        # each table's ledger's at the start (read after prepare, which gives a ledger an
        # earlier lagless made its column), then what each batch read.
        self.log_times: dict[TP, int] = ledger_log_times(plan)
        # Offsets the checks found lost before the run (retention, a recreated topic), skipped.
        self.summary = Summary(skipped=sum(lost.skipped for lost in plan.lost))
        self.counted_before_run = {lost.tp: lost.skipped_range for lost in plan.lost}
        # Each partition's first batch in this run (Batch.skipped takes the records the checks
        # before the run counted with it).
        self._first_batch_of: dict[TP, int] = {}
        self.committer = committer
        self.dead_letter_topic = dead_letter_topic
        # The store, when the source's tasks write the records; None: rows come through Spark.
        # Decided per query, as its source's options (batch_function).
        self.task_written: TaskWrittenSink | None = None
        # A Debezium mirror whose change events the source's tasks decode (change_files.py).
        self.changes_decoded = False
        # Set by the run loop: after a stop request, the batch in flight is finished and the
        # next one refused (job.py).
        self.stop: threading.Event | None = None
        self._done_after_stop = False
        # The store's work of the last batch (its driver's commits) runs beside the next
        # batch's tasks (this process's writer; open_batch_writer).
        self.overlap = overlap
        self._store_work: _StoreWork | None = None
        self._last_finished: Finished | None = None
        # A batch's tasks run (a stop waits for them: stopping the query then would interrupt
        # them, and fail the batch with Spark's error).
        self.tasks_running = False
        # Batches written by this run; the error of the last failed one, as raised (the query's
        # own error only holds its text).
        self.done = 0
        self.failure: BaseException | None = None
        self.last_end: Offsets = {}
        # Compaction and expiry of the import's tables between batches (maintenance.py).
        self.maintenance = maintenance

    def batch_function(self) -> BatchWriter:
        """foreachBatch's function for a query started now, on the write path the plan
        decided for its tables (write_path.decide)."""
        way = self.plan.write_path.way
        self.changes_decoded = way is Way.CHANGE_FILES
        sink = self.plan.sink
        task_files = way is Way.TASK_FILES and isinstance(sink, TaskWrittenSink)
        self.task_written = sink if task_files and isinstance(sink, TaskWrittenSink) else None
        return self

    def refresh(self) -> None:
        """Nothing to fetch: this writer runs in this process (connect_writer.py's does not)."""

    def batch(self, batch_id: int) -> tuple[Batch, Offsets]:
        """The batch as the store commits it (its ranges, every table's), and its end offsets."""
        end = batch_end_offsets(self.settings.checkpoint, batch_id)
        ranges = batch_ranges(self._batch_start(batch_id), end, self.plan.held)
        batch = Batch(batch_id, ranges)
        if not self.settings.fail_on_data_loss:
            batch.skipped.update(self._skipped(batch))
        return batch, end

    def _skipped(self, batch: Batch) -> dict[TP, int]:
        """failOnDataLoss=false: per partition, the batch's records the table never takes
        (Batch.skipped): those of its range below the log's start now (the source, which reads
        after this, goes on from there), and with the first batch of a partition, those the
        checks before the run found deleted below its range (a mirror's first records)."""
        covered = batch.covered
        if not covered:
            return {}
        low, _ = self.plan.reader.log.watermarks(list(covered))
        skipped = {}
        for tp, (since, until) in covered.items():
            first = self._first_batch_of.setdefault(tp, batch.id) == batch.id
            before_run = self.counted_before_run.get(tp, (0, 0)) if first else (0, 0)
            n = max(0, min(until, low[tp]) - since) + max(
                0, min(before_run[1], since) - before_run[0]
            )
            if n:
                skipped[tp] = n
        return skipped

    def _batch_start(self, batch_id: int) -> Offsets:
        """Where the batch's ranges start: the end of the batch before it."""
        if batch_id == 0:
            return dict(self.first_start)
        try:
            return batch_end_offsets(self.settings.checkpoint, batch_id - 1)
        except OSError:  # Spark keeps the offsets of its last 100 batches only
            return dict(self.last_end or self.first_start)

    def parts(self, batch: Batch) -> list[tuple[Destination, Batch]]:
        """Each table's part of the batch: its topics' ranges, as its ledger takes them. Only
        tables the batch has records for (the first table, when none has: a batch of nothing
        commits as before). NewTopics when a topic it reads has no table yet: nothing of the
        batch is written, the run loop prepares their tables and replays it."""
        covered = batch.covered
        new = sorted(
            {t for t, _ in covered} - {t for d in self.plan.destinations for t in d.topics}
        )
        if new:
            raise NewTopics(f"batch {batch.id} reads new topics {', '.join(new)}")
        parts = [
            (each, batch.part(each.ranges_of(batch.ranges)))
            for each in self.plan.destinations
            if each.stopped is None
        ]
        return [part for part in parts if part[1].covered] or parts[:1]

    def __call__(self, records: DataFrame, batch_id: int) -> None:
        # No batch commits after one the store lacks (its ledger would skip the gap): a failed
        # batch fails every later call. Its tasks may run beside the batch before's commits.
        self._raise_a_store_failure(wait=self.stop is not None and self.stop.is_set())
        if self.stop is not None and self.stop.is_set() and self._done_after_stop:
            # Nothing of this batch is written: the checkpoint replays it on the next run.
            log.info("batch %d: not started, a stop was asked for", batch_id)
            raise Stopped(0, "a stop request")
        started = time.monotonic()
        try:
            finish = self._write(records, batch_id)
        except BaseException as exc:
            self.drain()
            if self._store_work is None:  # else the batch before's failure is the run's
                self._failed(batch_id, exc)
            raise
        self._raise_a_store_failure(wait=True)
        self._store_work = None
        if self._overlaps():
            self._finish_beside_the_next(finish, batch_id, started)
        else:
            self._finish(finish, batch_id, started)

    def _overlaps(self) -> bool:
        if not (self.overlap and self.changes_decoded):
            return False
        last = self._last_finished
        tasks_s, driver_s = (last.tasks_s or 0.0, last.driver_s) if last else (0.0, 0.0)
        settings = self.settings
        return commits_beside_tasks(settings.mode, tasks_s, driver_s, settings.trigger_seconds)

    def _finish_beside_the_next(
        self, finish: Callable[[], Finished], batch_id: int, started: float
    ) -> None:
        """The batch's commits on a thread of their own: Spark records the batch, plans the
        next and runs its tasks meanwhile. The checkpoint's mark says so until the store holds
        the batch: a run that ends before has it read again (job.py)."""
        checkpoint = self.settings.checkpoint
        mark_storing(checkpoint, batch_id)

        def commit() -> None:
            self._finish(finish, batch_id, started)
            unmark_storing(checkpoint, batch_id)

        self._store_work = _StoreWork(batch_id, commit)
        self._store_work.start()

    def _failed(self, batch_id: int, exc: BaseException) -> None:
        self.failure = exc
        if isinstance(exc, NewTopics):
            log.info("batch %d: %s", batch_id, exc)
        else:
            log.error("batch %d failed", batch_id, exc_info=True)

    def _finish(self, finish: Callable[[], Finished], batch_id: int, started: float) -> None:
        """The batch's commits (when they overlap the next batch's tasks: on a thread of its
        own, whose failure fails the next batch, or the run's end), then its report and the
        maintenance due between batches."""
        try:
            finished = finish()
        except BaseException as exc:
            self._failed(batch_id, exc)
            raise
        self.done += 1
        self._done_after_stop = self.stop is not None and self.stop.is_set()
        self._last_finished = finished
        took = time.monotonic() - started
        log.info(
            "batch %d: %d records, %d bytes, up to offsets %s, in %.2f s%s",
            batch_id,
            self.summary.last_records,
            self.summary.last_bytes,
            _offsets_text(finished.end),
            took,
            _phases_text(finished),
        )
        if self.maintenance is not None and not self._done_after_stop:
            self.maintenance.between_batches(finished.tables)

    def end(self) -> None:
        """The run ended unstopped, its last batch's commits drained: the maintenance left
        beside its batches committed."""
        if self.maintenance is not None:
            self.maintenance.end(lambda: self.stop is not None and self.stop.is_set())

    def _raise_a_store_failure(self, *, wait: bool) -> None:
        """The failure of the batch before's commits (ended, or waited for), raised again by
        every later call. Stopped when a second signal ended the wait: this batch is not
        committed after one the store may lack, and the checkpoint replays both."""
        work = self._store_work
        if work is None:
            return
        if wait and not self._waited_for(work):
            raise Stopped(0, "a second signal")
        if work.error is not None:
            raise work.error

    def drain(self) -> None:
        """Until the last batch's commits end (the run's end, a stop, a failure): its failure
        is the writer's `failure`, logged already; the next call raises it again."""
        work = self._store_work
        if work is not None and self._waited_for(work) and work.error is None:
            self._store_work = None

    def _waited_for(self, work: _StoreWork) -> bool:
        """Whether a batch's commits ended. A second signal ends the wait (a store away may
        hold a commit for its whole retry budget): the commit is abandoned with the process,
        as by a kill, and the checkpoint's mark has its batch read again."""
        while work.is_alive() and not (isinstance(self.stop, StopRequest) and self.stop.insisted):
            work.join(0.2)
        return not work.is_alive()

    def _write(self, records: DataFrame, batch_id: int) -> Callable[[], Finished]:
        """The batch's tasks run; what is left (the driver's commits, the group's, the report)
        is returned, to run now or beside the next batch's tasks."""
        batch, end = self.batch(batch_id)
        parts = self.parts(batch)
        start = self._batch_start(batch_id)
        self.last_end = end
        tasks_s = None
        tables_written = [d.target.table for d, part in parts if part.covered]
        store: Callable[[], Tally]
        if self.changes_decoded:
            tasks_started = time.monotonic()
            collected = self._run_change_tasks(records)
            tasks_s = time.monotonic() - tasks_started
            spark = records.sparkSession

            def store() -> Tally:
                return self._upsert_changes(spark, collected, parts, end)
        else:
            if self.task_written is not None:
                done = self._commit_task_files(self.task_written, records, parts)
            else:
                done = self._write_tables(records, parts, end)

            def store() -> Tally:
                return done

        def finish() -> Finished:
            driver_started = time.monotonic()
            read_before = Counter(self.summary.by_partition)
            written = store()
            self.summary.add_batch(
                {tp: n for tp, n in written.by_partition.items() if n},
                written.bytes,
                written.written,
                {reason: n for reason, n in written.dead.items() if n},
                written.already,
            )
            if not self.settings.fail_on_data_loss:
                read = self.summary.by_partition - read_before
                self._count_skipped(batch_id, start, end, read)
            if self.committer is not None:
                self.committer.commit(end)
                failpoint("after-group-commit")
            self.summary.behind = self.remaining_lag(end)
            self.collector.batch(self.summary, self.summary.behind)
            return Finished(end, tables_written, tasks_s, time.monotonic() - driver_started)

        return finish

    def _count_skipped(
        self, batch_id: int, start: Offsets, end: Offsets, read: Counter[TP]
    ) -> None:
        """failOnDataLoss=false: the batch's offsets that retention deleted before they were
        read (below the log start, and no record came from them) count as skipped."""
        low, _ = self.plan.reader.log.watermarks(list(end))
        skipped = 0
        for tp, until in end.items():
            since = start.get(tp, until)
            missing = max(0, until - since - read.get(tp, 0))
            gone_until = min(until, low[tp])
            deleted = max(0, gone_until - since)
            # Those the checks before the run counted already (a checkpoint behind the log).
            counted_from, counted_to = self.counted_before_run.get(tp, (0, 0))
            deleted -= max(0, min(gone_until, counted_to) - max(since, counted_from))
            skipped += min(missing, deleted)
        if skipped:
            log.warning(
                "batch %d: %d records deleted before they were read were skipped "
                "(failOnDataLoss=false)",
                batch_id,
                skipped,
            )
            self.summary.skipped += skipped

    def _commit_task_files(
        self, sink: TaskWrittenSink, receipts: DataFrame, parts: list[tuple[Destination, Batch]]
    ) -> Tally:
        """The source's tasks wrote the records (executorWriter), each task into its topic's
        table; `receipts` says what, and which files hold the records they left to Spark's
        rows. Each table's files are committed with its own ranges, one table after another."""
        for destination, _ in parts:
            sink.discard_staged(destination.target)
        failpoint("before-write")
        collected = sink.run_tasks(receipts)  # a row per piece, not per record
        written = Tally()
        for destination, batch, mine in _each_table(collected, parts):
            self._commit_receipts(sink, receipts.sparkSession, mine, destination, batch, written)
        return written

    def _commit_receipts(
        self,
        sink: TaskWrittenSink,
        spark: SparkSession,
        collected: pa.Table,
        destination: Destination,
        batch: Batch,
        written: Tally,
    ) -> None:
        """One table's part: the files its tasks wrote, and the rows of the records they left
        to Spark, committed with the table's ranges."""
        target = destination.target
        files = collected.column("file").to_pylist()
        left = sorted({path for path in collected.column("left").to_pylist() if path})
        dead: dict[str, int] = {}
        if left:
            records = sink.left_records(spark, left)
            shaped, observation, reasons = self._shaped(records, destination, batch, [])
            files += sink.stage_rows(accepted(shaped, target), target)
            counts = observation.get["counts"]
            by_reason = dict(zip(reasons, counts, strict=True))
            self._store_dead_letters(records, shaped, destination, batch, by_reason, dead)
            log.info("batch %d: %d files of records left to Spark's rows", batch.id, len(left))
        committed = sink.commit_staged(files, target, batch)
        failpoint("after-write")
        if left:
            sink.discard_staged(target)  # the left files, read
        by_partition = _records_by_partition(collected)
        stored = sum(by_partition.values()) - sum(dead.values())
        rows, replay = _written(committed, stored)
        size = pc.sum(collected.column("bytes")).as_py() or 0
        written.add(by_partition, size, rows, dead, already=replay)

    def _run_change_tasks(self, receipts: DataFrame) -> pa.Table:
        """A Debezium mirror's (or a raw upsert's) batch: the source's tasks decode its change
        events into files (change_files.py); `receipts` names them, a row per piece."""
        folder = self.settings.changes_folder
        if self._store_work is None:
            change_files.clear(folder)  # what a crashed attempt wrote; no batch reads it now
        failpoint("before-write")
        self.tasks_running = True
        try:
            return receipts.toArrow()  # runs the tasks: a row per piece, not per record
        finally:
            self.tasks_running = False

    def _upsert_changes(
        self,
        spark: SparkSession,
        collected: pa.Table,
        parts: list[tuple[Destination, Batch]],
        end: Offsets,
    ) -> Tally:
        """The change files of a batch's tasks: each table's part coalesced here and upserted
        with its own ranges, one table after another; then the files are removed."""
        written = Tally()
        for destination, batch, mine in _each_table(collected, parts):
            partitions = sorted(destination.ranges_of(end))
            with self._stops_on_a_refused_change(destination):
                self._upsert_part(spark, mine, destination, batch, partitions, written)
        change_files.remove(collected.column("file").to_pylist())
        return written

    def _upsert_part(
        self,
        spark: SparkSession,
        collected: pa.Table,
        destination: Destination,
        batch: Batch,
        partitions: list[TP],
        written: Tally,
    ) -> None:
        """One table's part: its columns grown by what its events added, its rejected events
        stored as dead letters, then its rows one per key upserted with the table's ranges."""
        changes = change_files.read_changes(collected.column("file").to_pylist())
        schemas = change_files.new_schemas(changes)
        if schemas:
            self._evolve(destination, schemas, must_grow=False)
        target = destination.target
        coalesced = change_files.coalesce(changes, target, self.log_times)
        if coalesced.truncated and not self._holds(destination, batch):
            log.info("%s: emptied by a TRUNCATE", destination.where)
            self.plan.sink.empty(target)
        dead: dict[str, int] = {}
        rejected = coalesced.rejected
        if rejected.num_rows:
            if self.dead_letter_topic is not None:
                self.dead_letter_topic.send(rejected)
            self.plan.sink.write_dead_letters(spark.createDataFrame(rejected), target, batch)
            dead = dict(Counter(rejected.column("error").to_pylist()))
        after = self._log_times_after(partitions, [coalesced.newest.get(tp) for tp in partitions])
        batch.log_times.update(after)
        told = self.plan.sink.upsert_rows(coalesced.rows, target, batch)
        self.log_times.update(after)
        failpoint("after-write")
        by_partition = _records_by_partition(collected)
        rows, replay = _written(told, sum(by_partition.values()) - sum(dead.values()))
        size = pc.sum(collected.column("bytes")).as_py() or 0
        written.add(by_partition, size, rows, dead, already=replay)

    def _shaped(
        self,
        records: DataFrame,
        destination: Destination,
        batch: Batch,
        partitions: list[tuple[str, int]],
    ) -> tuple[DataFrame, Observation, list[str]]:
        """The records as rows (rows.shape), observed while they stream into the sink: their
        bytes, then records per partition and per rejection reason; and the reasons."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        target = destination.target
        avro = destination.avro
        reasons = rejection_reasons(target, self.settings.max_record_bytes, avro)
        # One pass over the batch, not three. Two SQL expressions rather than a Column per
        # partition: building Columns costs a JVM round trip each, which on 24 partitions was
        # half a second of every batch.
        observation = Observation(f"lagless_batch_{batch.id}_{target.table}")
        metrics = [
            F.expr(f"coalesce(sum({BYTES}), 0) AS bytes"),
            F.expr(f"array({_counts_sql(partitions, reasons)}) AS counts"),
        ]
        upsert = target.mode == "upsert" and partitions
        if upsert:  # the newest timestamp of each partition: its log time at the batch's end
            metrics.append(
                F.expr(f"array({_per_partition_sql(partitions, 'max', 'timestamp')}) AS newest")
            )
        if target.value_format == "debezium":
            metrics.append(F.expr(f"collect_set({NEW_SCHEMA_COLUMN}) AS schemas"))
        log_times = self.log_times if target.mode == "upsert" else None
        shaped = shape(records, target, self.settings.max_record_bytes, avro, log_times)
        return shaped.observe(observation, *metrics), observation, reasons

    def _store_dead_letters(
        self,
        records: DataFrame,
        shaped: DataFrame,
        destination: Destination,
        batch: Batch,
        rejected_by_reason: dict[str, int],
        dead: dict[str, int],
    ) -> None:
        """Once the rows are staged, before they commit with the batch's ranges: a crash after
        the commit cannot lose a dead letter, whatever becomes of the checkpoint. `dead`
        takes the counts by reason once they are stored."""
        if dead or not any(rejected_by_reason.values()):
            return  # none, or stored by an earlier try of a retried commit
        # Rare: read the batch again rather than cache every batch for it.
        rejected = dead_letters(shaped)
        if self.dead_letter_topic is not None:
            collected = rejected.toArrow()  # once, for the topic and the table both
            self.dead_letter_topic.send(collected)
            rejected = records.sparkSession.createDataFrame(collected)
        self.plan.sink.write_dead_letters(rejected, destination.target, batch)
        dead.update({r: n for r, n in rejected_by_reason.items() if n})

    def _write_tables(
        self, records: DataFrame, parts: list[tuple[Destination, Batch]], end: Offsets
    ) -> Tally:
        """Spark's rows, each table's part written with its own ranges, one table after
        another. Several tables read the batch once: it is kept (persist) while they write."""
        from pyspark.sql import functions as F

        written = Tally()
        _no_constraint_propagation(records.sparkSession)
        several = len(self.plan.destinations) > 1
        kept = several and len(parts) > 1
        if kept:
            records = records.persist()
        try:
            for index, (destination, batch) in enumerate(parts):
                if index:
                    failpoint("between-tables")
                rows = (
                    records.where(F.col("topic").isin(*destination.topics)) if several else records
                )
                partitions = sorted(destination.ranges_of(end))
                with self._stops_on_a_refused_change(destination):
                    while True:  # a mirror's part again once its table has new columns
                        try:
                            self._write_rows(rows, destination, batch, partitions, written)
                            break
                        except SchemaChanged as changed:
                            self._evolve(destination, changed.schemas)
        finally:
            if kept:
                records.unpersist()
        return written

    def _holds(self, destination: Destination, batch: Batch) -> bool:
        """The table's ledger holds the batch already (a replay): a TRUNCATE in it was applied
        with it, and the rows after it; it is not applied again."""
        held = self.plan.sink.ledger(destination.target, sorted(batch.covered))
        return bool(batch.covered) and all(
            held.get(tp, 0) >= end for tp, (_, end) in batch.covered.items()
        )

    @contextlib.contextmanager
    def _stops_on_a_refused_change(self, destination: Destination) -> Iterator[None]:
        """Around a table's part of a batch: a schema change it cannot follow (raised before
        anything of the part commits) stops that table, for this run and the checkpoint's
        next ones, and the other tables go on; with --schema-changes fail, the import."""
        try:
            yield
        except SchemaChangeRefused as refused:
            if self.settings.schema_changes == "fail":
                raise
            destination.stopped = str(refused)
            stop_table(self.settings.checkpoint, destination.target.table, str(refused))
            log.error("%s is stopped (the other tables go on): %s", destination.where, refused)

    def _evolve(self, destination: Destination, schemas: list[str], must_grow: bool = True) -> None:
        """A Debezium mirror's events brought columns its table lacks (SchemaChanged, raised
        before the table's part was committed): the columns are added, nullable, and the part
        is written again. The source's tasks (change_files.py) note schemas the table took
        already: nothing to add then (`must_grow` False)."""
        target = destination.target
        assert target.fields is not None
        fields = change_files.grown_fields(target.fields, sorted(schemas), target.table)
        if fields == target.fields:
            if not must_grow:
                return
            raise TerminalError(f"the change events' schemas did not evolve {destination.where}")
        grown = replace(target, fields=fields)
        held = {f.name: f.dataType for f in target.fields}
        added = [name for name in fields.fieldNames() if name not in held]
        if added:
            log.info("%s: columns %s added by the change events", destination.where, added)
        for each in fields:
            if each.name in held and held[each.name] != each.dataType:
                log.info(
                    "%s: column %r widened from %s to %s by the change events",
                    destination.where,
                    each.name,
                    held[each.name].simpleString(),
                    each.dataType.simpleString(),
                )
        for schema in schemas:
            given = [c.name for c in row_columns(json.loads(schema))]
            own = [*CDC_COLUMNS, DELETED]
            tell_columns_gone(destination.where, fields.fieldNames(), [*given, *own])
        self.plan.sink.check(grown)
        self.plan.sink.prepare(grown)
        destination.target = grown

    def _write_rows(
        self,
        records: DataFrame,
        destination: Destination,
        batch: Batch,
        partitions: list[tuple[str, int]],
        written: Tally,
    ) -> None:
        target = destination.target
        sink = self.plan.sink
        shaped, observation, reasons = self._shaped(records, destination, batch, partitions)
        failpoint("before-write")
        dead: dict[str, int] = {}

        def store_dead_letters() -> None:
            observed = observation.get
            if target.value_format == "debezium" and observed["schemas"]:
                raise SchemaChanged(list(observed["schemas"]))
            if target.mode == "upsert":
                batch.log_times.update(self._log_times_after(partitions, observed["newest"]))
            counts = observed["counts"][len(partitions) :]
            by_reason = dict(zip(reasons, counts, strict=True))
            self._store_dead_letters(records, shaped, destination, batch, by_reason, dead)

        stored = sink.write(accepted(shaped, target), target, batch, store_dead_letters)
        observed = observation.get
        if target.mode == "upsert":
            self.log_times.update(self._log_times_after(partitions, observed["newest"]))
        per_partition = observed["counts"][: len(partitions)]
        failpoint("after-write")
        by_partition = {tp: n for tp, n in zip(partitions, per_partition, strict=True) if n}
        rows, replay = _written(stored, sum(by_partition.values()) - sum(dead.values()))
        written.add(by_partition, observed["bytes"], rows, dead, already=replay)

    def _log_times_after(self, partitions: list[TP], newest: list[int | None]) -> dict[TP, int]:
        """Each partition's log time at the batch's end: the newest of where it started and of
        the timestamps the batch read (None: it read none)."""
        after = {}
        for tp, stamp in zip(partitions, newest, strict=True):
            known = [t for t in (self.log_times.get(tp), stamp) if t is not None]
            if known:
                after[tp] = max(known)
        return after

    def remaining_lag(self, end: Offsets) -> int:
        latest = self.target_end or self.plan.reader.log.latest(self.plan.partitions)
        return sum(max(0, high - end.get(tp, 0)) for tp, high in latest.items())


def _each_table(
    receipts: pa.Table, parts: list[tuple[Destination, Batch]]
) -> Iterator[tuple[Destination, Batch, pa.Table]]:
    """Each table's part of a batch with the receipts of its topics' pieces, one table after
    another."""
    for index, (destination, batch) in enumerate(parts):
        if index:
            failpoint("between-tables")
        topics = pa.array(destination.topics)
        yield destination, batch, receipts.filter(pc.is_in(receipts.column("topic"), topics))


def _records_by_partition(receipts: pa.Table) -> Counter[TP]:
    """The records the source's tasks read, by partition, from their receipts (a row per
    piece)."""
    by_partition: Counter[TP] = Counter()
    for topic, partition, records in zip(
        *(receipts.column(c).to_pylist() for c in ("topic", "partition", "records")),
        strict=True,
    ):
        by_partition[(topic, partition)] += records
    return by_partition


def _no_constraint_propagation(spark: SparkSession) -> None:
    """The batch's query session plans without Spark's constraint propagation. It rewrites
    every constraint of a projection once per alias in it, and shaped rows alias many large
    expressions (rejection reasons, each partition's carried log time, a mirror's columns):
    an upsert batch spent 20-30 s of the driver planning, whatever its size (bench/mirror.py).
    Its inferred filters serve joins, which a batch's plan has none of. A stream runs in a
    clone of its session (Spark's MicroBatchExecution): nothing outside the query changes."""
    spark.conf.set("spark.sql.constraintPropagation.enabled", "false")


def _written(told: int | Written | None, stored: int) -> tuple[int, bool]:
    """(rows the table gained or replaced, whether the ledger held the batch) from what the
    store told; `stored`: the records it was given, what an append gains."""
    if isinstance(told, Written):
        return (stored if told.rows is None else told.rows), told.replay
    return (stored if told is None else told), False


def ledger_log_times(plan: ImportPlan) -> dict[TP, int]:
    """Each upsert table's log times where its ledger ends (Sink.log_times): a topic partition
    lands in one table."""
    found: dict[TP, int] = {}
    for each in plan.destinations:
        if each.target.mode == "upsert":
            found.update(plan.sink.log_times(each.target, each.partitions))
    return found


def commits_beside_tasks(mode: str, tasks_s: float, driver_s: float, trigger_s: float) -> bool:
    """Whether a batch's commits run beside the next batch's tasks, by the last batch's time:
    in bulk, always; in a continuous import, once a batch takes over two triggers (it fell
    behind) and its tasks a third of it or more. Not otherwise: each batch has a fixed cost
    (Delta's MERGE rewrites the table's files), which overlapping pays more often, and when
    the store's commit is most of a batch, little runs beside it."""
    if mode == "bulk":
        return True
    return tasks_s + driver_s > 2 * trigger_s and 2 * tasks_s >= driver_s


class _StoreWork(threading.Thread):
    """A batch's commits, beside the next batch's tasks. The run waits for it (drain), unless
    a second signal asks to stop at once: the process then ends without it, as after a kill
    (a store's commit is atomic, and the checkpoint's mark has the batch read again)."""

    def __init__(self, batch_id: int, work: Callable[[], None]) -> None:
        super().__init__(name=f"lagless-store-batch-{batch_id}", daemon=True)
        self.work = work
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.work()
        except BaseException as exc:  # logged by the writer; raised where the next batch waits
            self.error = exc


def _phases_text(finished: Finished) -> str:
    """Where a batch's time went, when its tasks ran before the driver's commits: an operator
    asking why a mirror falls behind learns whether reading or the store is slow."""
    if finished.tasks_s is None:
        return ""
    return f" (tasks {finished.tasks_s:.2f} s, driver {finished.driver_s:.2f} s)"


def _offsets_text(offsets: Offsets) -> str:
    return ", ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(offsets.items())) or "-"


def _per_partition_sql(partitions: list[tuple[str, int]], aggregate: str, value: str) -> str:
    """`aggregate` of `value` over each partition's rows, as SQL aggregates."""
    one_topic = len({topic for topic, _ in partitions}) == 1
    return ", ".join(
        f"{aggregate}(CASE WHEN {_of_partition(t, p, one_topic)} THEN {value} END)"
        for t, p in partitions
    )


def _of_partition(topic: str, partition: int, one_topic: bool) -> str:
    """SQL: the row is of this partition. With one topic, the partition's number alone tells
    (every condition is evaluated on every row)."""
    if one_topic:
        return f"partition = {partition}"
    return f"topic = {sql_string(topic)} AND partition = {partition}"


def _counts_sql(partitions: list[tuple[str, int]], reasons: list[str]) -> str:
    """Records per partition, then per rejection reason (a reason text the error begins
    with: a Debezium event's names its column after it), as SQL aggregates."""
    one_topic = len({topic for topic, _ in partitions}) == 1
    return ", ".join(
        [f"count_if({_of_partition(t, p, one_topic)})" for t, p in partitions]
        + [f"count_if(startswith({ERROR}, {sql_string(r)}))" for r in reasons]
    )
