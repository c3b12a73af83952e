"""foreachBatch: write one micro-batch to the sink, then commit it to the group and report it.

Called by Spark after it journaled the batch's offsets and before it records the batch as
committed, so everything here may run again for the same batch: every write is idempotent.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

import pyarrow.compute as pc

from lagless.exceptions import Stopped
from lagless.failpoints import failpoint
from lagless.importer.checkpoint import batch_end_offsets
from lagless.importer.dead_letter_topic import DeadLetterTopic
from lagless.importer.group import GroupCommitter
from lagless.importer.maintenance import schedule_for
from lagless.importer.rows import (
    BYTES,
    ERROR,
    accepted,
    dead_letters,
    rejection_reasons,
    shape,
)
from lagless.importer.spec import Checked, ImportSpec
from lagless.kafka import TP, Offsets
from lagless.progress import Collector, Summary
from lagless.sinks.base import TaskWrittenSink
from lagless.sinks.ledger import Batch, batch_ranges

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Observation

log = logging.getLogger(__name__)


class BatchWriter:
    """foreachBatch: write one micro-batch, then report it."""

    def __init__(
        self,
        spec: ImportSpec,
        checked: Checked,
        collector: Collector,
        target_end: Offsets | None,
        committer: GroupCommitter | None = None,
        dead_letter_topic: DeadLetterTopic | None = None,
        first_start: Offsets | None = None,
        held: Offsets | None = None,
    ) -> None:
        self.spec = spec
        self.checked = checked
        self.collector = collector
        self.target_end = target_end
        # Where the query's first batch starts, and what the store held when the import began
        # (the source reads nothing below it): with Spark's journaled ends, a batch's ranges.
        self.first_start = first_start or {}
        self.held = held or {}
        # Offsets the checks found lost before the run (retention, a recreated topic), skipped.
        self.summary = Summary(skipped=sum(lost.skipped for lost in checked.lost))
        self.counted_before_run = {lost.tp: lost.skipped_range for lost in checked.lost}
        self.committer = committer
        self.dead_letter_topic = dead_letter_topic
        # The store, when the source's tasks write the records; None: rows come through Spark.
        self.task_written = spec.task_written(checked.sink, checked.target)
        self.target = checked.target
        # Set by the run loop: after a stop request, the batch in flight is finished and the
        # next one refused (job.py).
        self.stop: threading.Event | None = None
        self._done_after_stop = False
        # Batches written by this run; the error of the last failed one, as raised (the query's
        # own error only holds its text).
        self.done = 0
        self.failure: BaseException | None = None
        self.last_end: Offsets = {}
        # Compaction and expiry of the target's tables between batches (maintenance.py).
        self.maintenance = schedule_for(
            checked.sink, self.target, spec.maintenance_policy, spec.maintain_every_s
        )

    def refresh(self) -> None:
        """Nothing to fetch: this writer runs in this process (connect_writer.py's does not)."""

    def batch(self, batch_id: int) -> tuple[Batch, Offsets]:
        """The batch as the store commits it (its ranges), and its end offsets."""
        end = batch_end_offsets(self.spec.checkpoint, batch_id)
        return Batch(batch_id, batch_ranges(self._batch_start(batch_id), end, self.held)), end

    def _batch_start(self, batch_id: int) -> Offsets:
        """Where the batch's ranges start: the end of the batch before it."""
        if batch_id == 0:
            return dict(self.first_start)
        try:
            return batch_end_offsets(self.spec.checkpoint, batch_id - 1)
        except OSError:  # Spark keeps the offsets of its last 100 batches only
            return dict(self.last_end or self.first_start)

    def __call__(self, records: DataFrame, batch_id: int) -> None:
        if self.stop is not None and self.stop.is_set() and self._done_after_stop:
            # Nothing of this batch is written: the checkpoint replays it on the next run.
            log.info("batch %d: not started, a stop was asked for", batch_id)
            raise Stopped(0, "a stop request")
        started = time.monotonic()
        try:
            self._write(records, batch_id)
        except BaseException as exc:
            self.failure = exc
            log.error("batch %d failed", batch_id, exc_info=True)
            raise
        self.done += 1
        self._done_after_stop = self.stop is not None and self.stop.is_set()
        log.info(
            "batch %d: %d records, %d bytes, up to offsets %s, in %.2f s",
            batch_id,
            self.summary.last_records,
            self.summary.last_bytes,
            _offsets_text(self.last_end),
            time.monotonic() - started,
        )
        if self.maintenance is not None:
            self.maintenance.between_batches()

    def _write(self, records: DataFrame, batch_id: int) -> None:
        batch, end = self.batch(batch_id)
        start = self._batch_start(batch_id)
        self.last_end = end
        read_before = Counter(self.summary.by_partition)
        if self.task_written is not None:
            self._commit_task_files(self.task_written, records, batch)
        else:
            self._write_rows(records, batch, sorted(end))
        if not self.spec.fail_on_data_loss:
            self._count_skipped(batch_id, start, end, self.summary.by_partition - read_before)
        if self.committer is not None:
            self.committer.commit(end)
            failpoint("after-group-commit")
        self.collector.batch(self.summary, self.remaining_lag(end))

    def _count_skipped(
        self, batch_id: int, start: Offsets, end: Offsets, read: Counter[TP]
    ) -> None:
        """failOnDataLoss=false: the batch's offsets that retention deleted before they were
        read (below the log start, and no record came from them) count as skipped."""
        low, _ = self.checked.reader.log.watermarks(list(end))
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

    def _commit_task_files(self, sink: TaskWrittenSink, receipts: DataFrame, batch: Batch) -> None:
        """The source's tasks wrote the records (executorWriter); `receipts` says what, and
        which files hold the records they left to Spark's rows."""
        target = self.target
        sink.discard_staged(target)
        failpoint("before-write")
        collected = sink.run_tasks(receipts)  # a row per piece, not per record
        files = collected.column("file").to_pylist()
        left = sorted({path for path in collected.column("left").to_pylist() if path})
        dead: dict[str, int] = {}
        if left:
            records = sink.left_records(receipts.sparkSession, left)
            shaped, observation, reasons = self._shaped(records, batch, [])
            files += sink.stage_rows(accepted(shaped, target), target)
            counts = observation.get["counts"]
            by_reason = dict(zip(reasons, counts, strict=True))
            self._store_dead_letters(records, shaped, batch, by_reason, dead)
            log.info("batch %d: %d files of records left to Spark's rows", batch.id, len(left))
        sink.commit_staged(files, target, batch)
        failpoint("after-write")
        if left:
            sink.discard_staged(target)  # the left files, read
        by_partition: Counter[tuple[str, int]] = Counter()
        for topic, partition, records in zip(
            *(collected.column(c).to_pylist() for c in ("topic", "partition", "records")),
            strict=True,
        ):
            by_partition[(topic, partition)] += records
        written = sum(by_partition.values()) - sum(dead.values())
        size = pc.sum(collected.column("bytes")).as_py() or 0
        self.summary.add_batch({tp: n for tp, n in by_partition.items() if n}, size, written, dead)

    def _shaped(
        self, records: DataFrame, batch: Batch, partitions: list[tuple[str, int]]
    ) -> tuple[DataFrame, Observation, list[str]]:
        """The records as rows (rows.shape), observed while they stream into the sink: their
        bytes, then records per partition and per rejection reason; and the reasons."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        target = self.target
        avro = self.checked.avro
        reasons = rejection_reasons(target, self.spec.max_record_bytes, avro)
        # One pass over the batch, not three. Two SQL expressions rather than a Column per
        # partition: building Columns costs a JVM round trip each, which on 24 partitions was
        # half a second of every batch.
        observation = Observation(f"lagless_batch_{batch.id}")
        shaped = shape(records, target, self.spec.max_record_bytes, avro).observe(
            observation,
            F.expr(f"coalesce(sum({BYTES}), 0) AS bytes"),
            F.expr(f"array({_counts_sql(partitions, reasons)}) AS counts"),
        )
        return shaped, observation, reasons

    def _store_dead_letters(
        self,
        records: DataFrame,
        shaped: DataFrame,
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
        self.checked.sink.write_dead_letters(rejected, self.target, batch)
        dead.update({r: n for r, n in rejected_by_reason.items() if n})

    def _write_rows(
        self, records: DataFrame, batch: Batch, partitions: list[tuple[str, int]]
    ) -> None:
        target = self.target
        sink = self.checked.sink
        shaped, observation, reasons = self._shaped(records, batch, partitions)
        failpoint("before-write")
        dead: dict[str, int] = {}

        def store_dead_letters() -> None:
            counts = observation.get["counts"][len(partitions) :]
            by_reason = dict(zip(reasons, counts, strict=True))
            self._store_dead_letters(records, shaped, batch, by_reason, dead)

        written = sink.write(accepted(shaped, target), target, batch, store_dead_letters)
        observed = observation.get
        per_partition = observed["counts"][: len(partitions)]
        failpoint("after-write")
        by_partition = {tp: n for tp, n in zip(partitions, per_partition, strict=True) if n}
        if written is None:
            written = sum(by_partition.values()) - sum(dead.values())
        self.summary.add_batch(by_partition, observed["bytes"], written, dead)

    def remaining_lag(self, end: Offsets) -> int:
        latest = self.target_end or self.checked.reader.log.latest(self.checked.partitions)
        return sum(max(0, high - end.get(tp, 0)) for tp, high in latest.items())


def _offsets_text(offsets: Offsets) -> str:
    return ", ".join(f"{t}[{p}]={o}" for (t, p), o in sorted(offsets.items())) or "-"


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _counts_sql(partitions: list[tuple[str, int]], reasons: list[str]) -> str:
    """Records per partition, then per rejection reason, as SQL aggregates. Each is evaluated
    on every row: with one topic, the partition's number alone tells them apart."""
    one_topic = len({topic for topic, _ in partitions}) == 1
    return ", ".join(
        [
            f"count_if(partition = {p})"
            if one_topic
            else f"count_if(topic = {_sql_string(t)} AND partition = {p})"
            for t, p in partitions
        ]
        + [f"count_if({ERROR} = {_sql_string(r)})" for r in reasons]
    )
