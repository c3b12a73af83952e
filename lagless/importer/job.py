"""The import job's run loop: a Structured Streaming query from the lagless Kafka source into a
sink, until the backlog is drained (bulk) or a stop is requested (continuous).

Offsets are decided by the source on the driver and journaled by Spark in the checkpoint
before a batch runs; the batch is written to the sink (idempotently, `batch_writer.py`); Spark
then records the batch as committed. A crash anywhere replays the batch into the same rows.
Everything the import opens is closed when it ends, and when it fails.
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from typing import Any

from lagless import logs
from lagless.exceptions import BadInput, LaglessError, Stopped, TerminalError, from_spark
from lagless.first_line import first_line
from lagless.importer.batch_writer import BatchWriter
from lagless.importer.checkpoint import (
    committed_ranges,
    last_end_offsets,
    write_first_start,
    write_fit,
)
from lagless.importer.connect_writer import ConnectWriter
from lagless.importer.dead_letter_topic import DeadLetterTopic
from lagless.importer.group import GroupCommitter
from lagless.importer.spec import ImportSpec, check, slots_for, timestamp_offsets
from lagless.kafka import Offsets
from lagless.progress import Collector, Summary
from lagless.signals import StopRequest, stop_requests
from lagless.sinks.base import TaskWriter
from lagless.sinks.ledger import lacking, reconcile
from lagless.source import SOURCE_NAME, to_json_offsets
from lagless.source.options import LOG_TO
from lagless.source.sampling import sample_meanwhile
from lagless.source.warmup import SOURCE_MODULES

log = logging.getLogger(__name__)


def run_import(spec: ImportSpec, collector: Collector | None = None, spark: Any = None) -> Summary:
    from lagless.importer.spark import (
        is_connect,
        is_remote,
        parallelism,
        spark_session,
    )
    from lagless.importer.warm_up import WarmUp

    collector = collector or Collector()
    if is_connect(spec.master):
        # A Spark Connect server resolves paths from its own working folder, not this one.
        spec = spec.with_absolute_paths()
    checked = check(spec)

    with ExitStack() as opened:
        opened.enter_context(checked.sink)
        opened.enter_context(checked.reader)
        low, high = checked.reader.log.watermarks(checked.partitions)
        # The store's ledger decides where each partition starts: a lost, fresh or lagging
        # checkpoint never imports twice what the table holds (sinks/ledger.py). Read, and a
        # ledger that contradicts the log refused, before Spark starts or anything is written.
        held = reconcile(
            checked.sink.ledger(checked.target, checked.partitions), low, high, checked.where
        )
        if held:
            log.info("the table holds %s; the import resumes after it", to_json_offsets(held))
        refuse_a_table_behind(
            spec.checkpoint, held, checked.where, {lost.tp for lost in checked.lost}
        )
        done = last_end_offsets(spec.checkpoint)
        # Bytes per record where the first batch starts, read while Spark starts: planning the
        # first batch would otherwise read them after, on a slow broker for seconds.
        sizes = sample_meanwhile(
            checked.reader.records,
            {tp: max(done.get(tp, 0), low[tp], held.get(tp, 0)) for tp in low},
            high,
        )
        warm_up = None
        if spark is None:
            task_writer = spec.executor_writer(checked.target)
            spark = spark_session(
                spec.master, conf=dict(spec.spark_conf), records_in_jvm=task_writer is None
            )
            if not is_remote(spark):  # a Connect server's workers are started already
                warm_up = WarmUp(spark, _task_modules(task_writer))
                opened.callback(warm_up.join)
        # Every check passed and Spark answers (a Connect server may not): the checkpoint is
        # this import's. Not before: a failed start must leave no checkpoint that refuses the
        # next import's other arguments.
        if checked.fit is not None:
            write_fit(spec.checkpoint, checked.fit)
        slots = spec.slots or slots_for(parallelism(spark))
        checked.sink.retry_s = spec.retry_seconds
        checked.sink.prepare(checked.target)
        target_end = dict(high) if spec.mode == "bulk" else None
        if target_end is not None and spec.ending_timestamp is not None:
            target_end = timestamp_offsets(checked, spec.ending_timestamp, low, target_end)
        if spec.starting_timestamp is not None:
            low = timestamp_offsets(checked, spec.starting_timestamp, low, high)
        high = target_end or high
        first_start = {tp: max(offset, held.get(tp, offset)) for tp, offset in low.items()}
        write_first_start(spec.checkpoint, first_start)
        writer: BatchWriter | ConnectWriter
        if is_remote(spark):
            writer = ConnectWriter(spec, checked, collector)
            opened.callback(writer.close)
            batch_function: Any = writer.server_side(spec, checked, target_end, first_start, held)
        else:
            committer = GroupCommitter(checked.reader.groups, spec.group) if spec.group else None
            dead_letter_topic = (
                opened.enter_context(DeadLetterTopic(spec.kafka, spec.dead_letter_topic))
                if spec.dead_letter_topic
                else None
            )
            writer = BatchWriter(
                spec,
                checked,
                collector,
                target_end,
                committer,
                dead_letter_topic,
                first_start,
                held,
            )
            batch_function = writer
        started = time.monotonic()
        opened.enter_context(collector)
        collector.start(
            sum(max(0, h - max(done.get(tp, 0), first_start[tp])) for tp, h in high.items())
        )

        options = spec.source_options(
            slots, held, sizes(), checked.json_fields_tasks_decode, checked.target, checked.avro
        )
        if is_remote(spark):  # the server's workers log into this import's log too
            options[LOG_TO] = logs.settings()
        stream = spark.readStream.format(SOURCE_NAME).options(**options).load()
        if warm_up is not None:
            warm_up.plan_reads()
        writer_stream = stream.writeStream.foreachBatch(batch_function).option(
            "checkpointLocation", spec.checkpoint
        )
        if spec.mode == "bulk":
            writer_stream = writer_stream.trigger(availableNow=True)
        else:
            writer_stream = writer_stream.trigger(processingTime=f"{spec.trigger_seconds} seconds")
        # Spark's session is up: from here, SIGINT and SIGTERM only ask to stop (signals.py).
        with stop_requests() as stop:
            writer.stop = stop
            query = writer_stream.start()
            try:
                _await(query, stop, writer)
            finally:
                _stop(query)
                writer.refresh()
        writer.summary.seconds = time.monotonic() - started
        # After a stop request, an error is the stop's doing (the batch the writer refused, one
        # that query.stop() interrupted), or, if not, is logged and met again by the rerun.
        failure = None if stop.is_set() else writer.failure or query.exception()
        if failure is not None:
            raise stopped_by(failure)
        if stop.is_set():
            log.warning(
                "stopped by %s after %d batches; a rerun resumes", stop.first.name, writer.done
            )
            if spec.mode == "bulk":  # a continuous import's signal is its usual end
                raise Stopped(stop.first.value, stop.first.name)
        collector.finish(writer.summary)
        log.info("import done: %s", writer.summary.as_dict())
    return writer.summary


def refuse_a_table_behind(
    checkpoint: str, held: Offsets, where: str, lost: set[tuple[str, int]]
) -> None:
    """BadInput, before anything is written, when the table no longer holds what the
    checkpoint's committed batches read (it was deleted, emptied or rolled back since): the
    query would resume past the gap and leave it unfilled, with nothing said. Partitions whose
    checkpoint offsets the log lost (`lost`: a recreated topic, read again from its start under
    --skip-lost-offsets) are another log's: not compared."""
    committed = {tp: r for tp, r in committed_ranges(checkpoint).items() if tp not in lost}
    gap = lacking(held, committed)
    if gap is None:
        return
    topic, partition = gap.tp
    holds = f"only up to offset {gap.held:,}" if gap.held else "none of it"
    raise BadInput(
        f"checkpoint {checkpoint!r} imported {topic}[{partition}] up to offset {gap.end:,}, "
        f"but {where} holds {holds}: the table was deleted, emptied or rolled back since; to "
        "import what it lacks, use a new --checkpoint (the table's ledger then decides where "
        "each partition resumes)"
    )


def _task_modules(task_writer: TaskWriter | None) -> tuple[str, ...]:
    """What the source's tasks import: the source, and the store's writer when they write."""
    return SOURCE_MODULES + ((task_writer.name.partition(":")[0],) if task_writer else ())


def _await(query: Any, stop: StopRequest, writer: BatchWriter | ConnectWriter) -> None:
    """Until the query ends, or until a stop was asked for and the batch in flight is done
    (the batch after it is refused by the writer); a second signal: at once, abandoning the
    batch in flight, which the checkpoint replays."""
    from pyspark.errors import StreamingQueryException

    done_at_stop: int | None = None
    # A source that fails while planning leaves the query active but stalled: poll its error.
    while query.isActive and query.exception() is None:
        writer.refresh()
        if stop.is_set():
            if done_at_stop is None:
                done_at_stop = writer.done
                log.warning("%s: stopping after the batch in flight", stop.first.name)
            if stop.insisted:
                log.warning("a second signal: stopping at once (the checkpoint replays the batch)")
                return
            if writer.done > done_at_stop or not query.status.get("isTriggerActive", False):
                return
        try:
            query.awaitTermination(0.2)
        except StreamingQueryException:
            return  # the caller reads the failure from query.exception()


def _stop(query: Any) -> None:
    """Stop the query if it runs. Spark waits spark.sql.streaming.stopTimeout for its batch
    thread (one inside the source's retries may not answer): past it, the process ends
    anyway, as after a kill, and the checkpoint replays the batch."""
    try:
        if query.isActive:
            query.stop()
    except Exception:
        log.warning("the query did not stop within Spark's stop timeout", exc_info=True)


def stopped_by(failure: BaseException) -> LaglessError:
    """The query's failure as lagless's own: the class it was raised as in foreachBatch, a
    task or the source (exceptions.from_spark); any other failure is terminal."""
    found = from_spark(failure)
    log.error("the import failed", exc_info=failure)
    if found is not None:
        return found
    return TerminalError(f"import stopped: {first_line(str(failure))}")
