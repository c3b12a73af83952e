"""The import job's run loop: a Structured Streaming query from the lagless Kafka source into a
sink, until the backlog is drained (bulk) or a stop is requested (continuous).

Offsets are decided by the source on the driver and journaled by Spark in the checkpoint
before a batch runs; the batch is written to the sink (idempotently, `batch_writer.py`); Spark
then records the batch as committed. A crash anywhere replays the batch into the same rows.
Everything the import opens is closed when it ends, and when it fails.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lagless import logs
from lagless.exceptions import (
    LaglessError,
    NewTopics,
    SchemaChangeRefused,
    Stopped,
    TerminalError,
    TransientError,
    chain,
    from_spark,
    text_of,
    worker_error,
)
from lagless.first_line import first_line
from lagless.importer.batch_writer import BatchWriter, open_batch_writer
from lagless.importer.checkpoint import (
    stop_table,
    write_first_start,
    write_fit,
)
from lagless.importer.connect_writer import ConnectWriter
from lagless.importer.debezium import tell_columns_gone
from lagless.importer.group import GroupCommitter
from lagless.importer.plan import (
    ImportPlan,
    check,
    check_destinations,
    source_options,
    timestamp_offsets,
)
from lagless.importer.resume import read_ledgers, refuse_an_incomplete_mirror, resume
from lagless.importer.routing import (
    Destination,
    refuse_a_collision,
    refuse_a_merge,
    topics_of,
)
from lagless.importer.spec import ImportSpec, slots_for
from lagless.kafka import TP, Offsets
from lagless.progress import Collector, Summary, unknown_text
from lagless.signals import StopFile, StopRequest, stop_requests
from lagless.sinks.base import TaskWriter
from lagless.source import SOURCE_NAME
from lagless.source.executor_write import ROUTED_WRITER
from lagless.source.options import LOG_TO, STOP_FILE
from lagless.source.sampling import sample_meanwhile
from lagless.source.warmup import SOURCE_MODULES

if TYPE_CHECKING:
    from lagless.importer.warm_up import WarmUp

log = logging.getLogger(__name__)


@dataclass
class Start:
    """Where the run starts, as the log, the checkpoint and the tables say (start_offsets)."""

    high: Offsets
    # The newest committed batch's ends ({} for a new checkpoint).
    done: Offsets
    # Bulk: where the import ends; None: it follows the log (continuous).
    target_end: Offsets | None
    # Where the query's first batch starts: never below what a table holds.
    first_start: Offsets

    def backlog(self) -> int:
        return sum(
            max(0, h - max(self.done.get(tp, 0), self.first_start[tp]))
            for tp, h in self.high.items()
        )


def run_import(spec: ImportSpec, collector: Collector | None = None, spark: Any = None) -> Summary:
    """Check, read every table's ledger, start Spark, then run the query (run_query) until the
    backlog is drained or a stop is asked for; everything opened is closed however it ends."""
    from lagless.importer.spark import is_connect

    collector = collector or Collector()
    if is_connect(spec.master):
        # A Spark Connect server resolves paths from its own working folder, not this one.
        spec = spec.with_absolute_paths()
    plan = check(spec)
    return _run(plan, collector, spark)


def _run(plan: ImportPlan, collector: Collector, spark: Any) -> Summary:
    """The checked plan's run (run_import): every decision is the plan's from here on."""
    from lagless.importer.spark import is_remote

    spec = plan.spec
    with ExitStack() as opened:
        opened.enter_context(plan.sink)
        opened.enter_context(plan.reader)
        low, high = plan.reader.log.watermarks(plan.partitions)
        lost_under_checkpoint = bool(plan.lost)
        done = resume(plan, collector, low, high)
        held = plan.held
        starts = {tp: max(done.get(tp, 0), low[tp], held.get(tp, 0)) for tp in low}
        # Nothing to read: said without Spark. Not when the checkpoint stood at offsets the log
        # lost (a recreated topic): they are not this log's, and Spark reads on from its start.
        nothing = all(starts[tp] >= high[tp] for tp in high)
        if spec.mode == "bulk" and not lost_under_checkpoint and nothing:
            return up_to_date(plan, collector)
        # Bytes per record where the first batch starts, read while Spark starts: planning the
        # first batch would otherwise read them after, on a slow broker for seconds.
        sizes = sample_meanwhile(plan.reader.records, starts, high)
        warm_up = None
        if spark is None:
            spark, warm_up = _start_spark(plan, opened)
        # Every check passed and Spark answers (a Connect server may not): the checkpoint is
        # this import's. Not before: a failed start must leave no checkpoint that refuses the
        # next import's other arguments.
        if plan.fit is not None:
            write_fit(spec.checkpoint, plan.fit)
        prepare(plan, plan.destinations)
        start = start_offsets(plan, low, high, done)
        write_first_start(spec.checkpoint, start.first_start)
        writer = _writer(plan, collector, start, opened, remote=is_remote(spark))
        opened.enter_context(collector)
        writer.summary.behind = start.backlog()
        collector.start(writer.summary.behind)
        started = time.monotonic()
        run_query(spark, plan, writer, sizes(), warm_up)
        writer.summary.seconds = time.monotonic() - started
        described(writer.summary, plan, held)
        collector.finish(writer.summary)
        log.info("import done: %s", writer.summary.as_dict())
    refuse_stopped_tables(plan)
    return writer.summary


def _start_spark(plan: ImportPlan, opened: ExitStack) -> tuple[Any, WarmUp | None]:
    """Spark's session, started as the plan's write path wants it (records through its JVM or
    not), and the warm-up of its Python workers (none on a Connect server, whose workers are
    up already), joined as the run ends."""
    from lagless.importer.spark import is_remote, spark_session
    from lagless.importer.warm_up import WarmUp

    path, spec = plan.write_path, plan.spec
    spark = spark_session(
        spec.master, conf=dict(spec.spark_conf), records_in_jvm=path.records_in_jvm
    )
    if is_remote(spark):
        return spark, None
    warm_up = WarmUp(spark, _task_modules(path.writer))
    opened.push(_joined_unless_stopped(warm_up))
    return spark, warm_up


def _joined_unless_stopped(warm_up: WarmUp) -> Callable[..., bool]:
    """The warm-up's threads waited for as the run ends, unless a signal ends it: their Spark
    job may take seconds, and a stop during start-up is to end within 10 s (the threads are
    daemons; the JVM ends with this process)."""

    def exit(kind: type[BaseException] | None, *_: object) -> bool:
        if kind is None or not issubclass(kind, KeyboardInterrupt):
            warm_up.join()
        return False

    return exit


def refuse_stopped_tables(plan: ImportPlan) -> None:
    """A bulk import that left a table stopped by a schema change (the others written) ends
    with its reason (exit 2); a continuous one said it when the table stopped."""
    stopped = [each for each in plan.destinations if each.stopped is not None]
    if stopped and plan.spec.mode == "bulk":
        first = stopped[0]
        raise SchemaChangeRefused(str(first.stopped), first.target.table)


def up_to_date(plan: ImportPlan, collector: Collector) -> Summary:
    """A bulk import with nothing to read (the tables hold the log up to its end, or the log is
    empty): said without starting Spark. The tables are made (a first import of an empty topic
    leaves an empty table) and the group, if any, is moved up to what the tables hold."""
    spec = plan.spec
    if plan.fit is not None:
        write_fit(spec.checkpoint, plan.fit)
    prepare(plan, plan.destinations)
    held = plan.held
    if spec.group and held:
        GroupCommitter(plan.reader.groups, spec.group).commit(held)
    summary = described(Summary(), plan, held)
    with collector:
        collector.finish(summary)
    log.info("nothing to import, up to date: %s", summary.as_dict())
    refuse_stopped_tables(plan)
    return summary


def described(summary: Summary, plan: ImportPlan, held: Offsets) -> Summary:
    """The summary with where its rows went (the store, its tables) and what they held before."""
    summary.destination = plan.sink.destination
    summary.table = ", ".join(sorted({each.target.table for each in plan.destinations}))
    summary.topics = tuple(sorted(topics_of(plan.partitions)))
    summary.held_before = dict(held)
    marked = [each.target.table for each in plan.destinations if each.target.marks]
    summary.unknown_rows = sum(plan.sink.unknown_rows(table) or 0 for table in marked)
    if summary.unknown_rows:
        log.warning("%s: %s", summary.table, unknown_text(summary.unknown_rows))
    return summary


def prepare(plan: ImportPlan, destinations: list[Destination]) -> None:
    """Create each table (safe to repeat), once every check passed."""
    spec = plan.spec
    plan.sink.retry_s = spec.retry_seconds
    for each in destinations:
        if each.stopped is not None:
            stop_table(spec.checkpoint, each.target.table, each.stopped)
            log.error("%s is stopped (the other tables go on): %s", each.where, each.stopped)
            continue
        if each.target.value_format == "debezium":
            held = list(plan.sink.table_types(each.target))
            tell_columns_gone(each.where, held, each.target.schema().fieldNames())
        plan.sink.prepare(each.target)


def start_offsets(plan: ImportPlan, low: Offsets, high: Offsets, done: Offsets) -> Start:
    """Where the first batch starts and, in bulk, where the import ends: by the log, the
    timestamps asked for, and never below what a table holds."""
    spec = plan.spec
    target_end = dict(high) if spec.mode == "bulk" else None
    if target_end is not None and spec.ending_timestamp is not None:
        target_end = timestamp_offsets(plan, spec.ending_timestamp, low, target_end)
    if spec.starting_timestamp is not None:
        low = timestamp_offsets(plan, spec.starting_timestamp, low, high)
    held = plan.held
    first_start = {tp: max(offset, held.get(tp, offset)) for tp, offset in low.items()}
    return Start(target_end or high, done, target_end, first_start)


def _writer(
    plan: ImportPlan,
    collector: Collector,
    start: Start,
    opened: ExitStack,
    *,
    remote: bool,
) -> BatchWriter | ConnectWriter:
    """foreachBatch's function: this process's BatchWriter, or a Spark Connect server's."""
    if remote:
        connect = ConnectWriter(plan, collector, start.target_end, start.first_start)
        opened.callback(connect.close)
        return connect
    return open_batch_writer(
        plan, collector, start.target_end, start.first_start, opened, overlap=True
    )


def run_query(
    spark: Any,
    plan: ImportPlan,
    writer: BatchWriter | ConnectWriter,
    sizes: Mapping[TP, float],
    warm_up: WarmUp | None,
) -> None:
    """The Spark query, until it ends (bulk), a stop is asked for, or it fails. A batch that
    reads topics without a table yet (a routed import's, new since it started) stops the
    query before anything of it is written: their tables are checked and prepared
    (admit_new_topics), and the query starts again on the same checkpoint, which replays
    the batch."""
    from lagless.importer.spark import parallelism

    spec = plan.spec
    slots = spec.slots or slots_for(parallelism(spark))
    late_workers = 0
    stop_file = _stop_file(spec.checkpoint)
    # Spark's session is up: from here, SIGINT and SIGTERM only ask to stop (signals.py).
    with stop_requests() as stop:
        writer.stop = stop
        plan.reader.connection.stop = stop  # the group commits' waits, in this process
        while True:
            options = source_options(plan, slots, sizes)
            options[STOP_FILE] = str(stop_file.path)
            query = _start_query(spark, spec, writer, options, warm_up)
            log.info("the query runs, into %d tables", len(plan.destinations))
            warm_up = None  # the planning process is up from the first query on
            try:
                _await(query, stop, writer, stop_file)
            finally:
                _stop(query)
                writer.drain()  # the last batch's commits, when they run beside the query
                writer.refresh()
                stop_file.clear()  # asked and answered; a restarted query starts afresh
            failure = None if stop.is_set() else writer.failure or query.exception()
            if failure is not None and late_worker(failure) and late_workers < LATE_WORKER_RETRIES:
                late_workers += 1
                log.warning(
                    "a Python worker of Spark's did not connect back within Spark's 10 s (a busy "
                    "machine); starting the query again (%d of %d): the checkpoint replays its "
                    "batch",
                    late_workers,
                    LATE_WORKER_RETRIES,
                )
                writer.failure = None
                continue
            if failure is None or not isinstance(from_spark(failure), NewTopics):
                break
            log.info("%s; preparing their tables, then replaying the batch", from_spark(failure))
            if not admit_new_topics(plan, writer.collector.warn):
                break  # gone again (deleted): a rerun resumes
            writer.failure = None
    if failure is None and not stop.is_set():
        writer.end()
    ended(spec, writer, stop, failure)


def _start_query(
    spark: Any,
    spec: ImportSpec,
    writer: BatchWriter | ConnectWriter,
    options: dict[str, str],
    warm_up: WarmUp | None,
) -> Any:
    if isinstance(writer, ConnectWriter):  # the server's workers log into this import's log too
        options[LOG_TO] = logs.settings()
    stream = spark.readStream.format(SOURCE_NAME).options(**options).load()
    if warm_up is not None:
        warm_up.plan_reads()
    writer_stream = stream.writeStream.foreachBatch(writer.batch_function()).option(
        "checkpointLocation", spec.checkpoint
    )
    if spec.mode == "bulk":
        writer_stream = writer_stream.trigger(availableNow=True)
    else:
        writer_stream = writer_stream.trigger(processingTime=f"{spec.trigger_seconds} seconds")
    return writer_stream.start()


def admit_new_topics(plan: ImportPlan, warn: Callable[[str], None] = log.warning) -> list[str]:
    """Topics that appeared while a routed import runs: each table checked, its ledger read and
    the table prepared, as at the start, before the batch that reads them is written. A topic
    whose table is an existing one's joins it, unless the table takes one topic's records
    (ImportSpec.one_topic_per_table): refused then. A topic still empty waits for its first
    change event (spec.with_change_events). Returns the topics admitted."""
    spec = plan.spec
    partitions = spec.partitions(plan.reader)
    known = set(plan.partitions)
    # Topics of no table: new ones, and those that waited for their first change event.
    new = [tp for tp in partitions if plan.destination_of(tp[0]) is None]
    # New partitions of a known topic are its table's: the source reads them from offset 0.
    plan.partitions = sorted(known | set(partitions))
    if not new:
        return []
    low, high = plan.reader.log.watermarks(new)
    refuse_an_incomplete_mirror(spec, low, {}, {})
    tables = {each.target.table: each for each in plan.destinations}
    added = check_destinations(spec, plan.sink, plan.reader, new)
    for each in added:
        joined = tables.get(each.target.table)
        if joined is None:
            continue
        if joined.spelled != each.spelled:
            refuse_a_merge(spec.template, joined.target.table, joined.topics[0], each.topics[0])
        if spec.one_topic_per_table:
            refuse_a_collision(spec.template, joined.target.table, joined.topics[0], each.topics[0])
    read_ledgers(plan, added, low, high)
    prepare(plan, added)
    for each in added:
        if each.warning is not None:
            warn(each.warning)
        joined = tables.get(each.target.table)
        if joined is None:
            plan.destinations.append(each)
            continue
        joined.topics = tuple(sorted({*joined.topics, *each.topics}))
        joined.partitions = sorted({*joined.partitions, *each.partitions})
        joined.held = {**joined.held, **each.held}
    plan.decide_write_path()  # for the tables as they are now
    admitted = topics_of(tp for each in added for tp in each.partitions)
    log.info("new topics %s: their tables are ready", ", ".join(admitted))
    return admitted


def ended(
    spec: ImportSpec,
    writer: BatchWriter | ConnectWriter,
    stop: StopRequest,
    failure: BaseException | None,
) -> None:
    """How the query ended, as lagless says it. After a stop request, an error is the stop's
    doing (the batch the writer refused, one that query.stop() interrupted), or, if not, is
    logged and met again by the rerun."""
    if failure is not None:
        raise stopped_by(failure)
    if stop.is_set():
        log.warning("stopped by %s after %d batches; a rerun resumes", stop.first.name, writer.done)
        if spec.mode == "bulk":  # a continuous import's signal is its usual end
            raise Stopped(stop.first.value, stop.first.name)


def _task_modules(task_writer: TaskWriter | None) -> tuple[str, ...]:
    """What the source's tasks import: the source, and the store's writers when they write."""
    if task_writer is None:
        return SOURCE_MODULES
    names = [task_writer.name]
    if task_writer.name == ROUTED_WRITER:
        names += [name for name, _ in json.loads(task_writer.config)["routes"].values()]
    return SOURCE_MODULES + tuple(sorted({name.partition(":")[0] for name in names}))


def _stop_file(checkpoint: str) -> StopFile:
    """Where this run's stop request is passed to Spark's processes, which no signal reaches:
    the source's planning and tasks then leave a wait for a broker that is away (retry.py).
    In the checkpoint, which a Spark Connect server sees too; a name of its own per run, so
    that one a killed run left behind stops no other."""
    return StopFile(os.path.join(os.path.abspath(checkpoint), f"stop-{uuid.uuid4().hex[:12]}"))


def _await(
    query: Any, stop: StopRequest, writer: BatchWriter | ConnectWriter, stop_file: StopFile
) -> None:
    """Until the query ends, or until a stop was asked for and the batch in flight is done
    (the batch after it is refused by the writer); a second signal: at once, abandoning the
    batch in flight, which the checkpoint replays. A stop request is passed on to Spark's
    processes (stop_file): one waiting for the broker fails the query at once."""
    from pyspark.errors import StreamingQueryException

    done_at_stop: int | None = None
    while True:
        try:
            # A source that fails while planning leaves the query active but stalled: poll
            # its error.
            if not query.isActive or query.exception() is not None or writer.failure is not None:
                return
            writer.refresh()
            if stop.is_set():
                if done_at_stop is None:
                    done_at_stop = writer.done
                    log.warning("%s: stopping after the batch in flight", stop.first.name)
                    stop_file.set()
                if stop.insisted:
                    log.warning(
                        "a second signal: stopping at once (the checkpoint replays the batch)"
                    )
                    return
                if writer.done > done_at_stop and not writer.tasks_running:
                    return  # the next batch's tasks, when they ran beside its commits, ended
                if not query.status.get("isTriggerActive", False):
                    return
            query.awaitTermination(0.2)
        except StreamingQueryException:
            return  # the caller reads the failure from query.exception()
        except Exception as exc:
            if not (stop.is_set() and jvm_gone(exc)):
                raise
            # A signal to the process group reached Spark's JVM too, which ended (or is
            # ending) with it: the stop's doing; the batch in flight, if any, is replayed by
            # the next run.
            log.warning(
                "Spark's JVM ended with the %s: stopping (%s)", stop.first.name, text_of(exc)
            )
            return


def jvm_gone(exc: BaseException) -> bool:
    """py4j could not reach Spark's JVM, or the JVM no longer knows py4j's own classes: it has
    ended, or is ending (a signal to the process group). A Java exception the JVM raised is not
    this: it answered."""
    from py4j.protocol import Py4JError, Py4JJavaError

    return any(
        isinstance(each, ConnectionError)
        or (isinstance(each, Py4JError) and not isinstance(each, Py4JJavaError))
        for each in chain(exc)
    )


def _stop(query: Any) -> None:
    """Stop the query if it runs. Spark waits spark.sql.streaming.stopTimeout for its batch
    thread (one inside the source's retries may not answer): past it, the process ends
    anyway, as after a kill, and the checkpoint replays the batch."""
    try:
        if query.isActive:
            query.stop()
    except Exception:
        log.warning("the query did not stop within Spark's stop timeout", exc_info=True)


# Spark gives the Python process it starts (the source's planning runner, a task's worker) a
# fixed 10 s to connect back (PythonWorkerFactory, not configurable); on a machine busy enough
# that starting Python takes longer, the query fails before it reads anything. It may pass when
# started again, which replays nothing twice (the ledger).
LATE_WORKER_RETRIES = 3
_LATE_WORKER = (
    "Python worker failed to connect back",
    "Timed out while waiting for the Python worker to connect back",
)


def late_worker(failure: BaseException) -> bool:
    """The failure is a Python worker of Spark's that did not connect back in time (Spark's
    own message: no marker can say it)."""
    return any(words in text_of(current) for current in chain(failure) for words in _LATE_WORKER)


def stopped_by(failure: BaseException) -> LaglessError:
    """The query's failure as lagless's own: the class it was raised as in foreachBatch, a
    task or the source (exceptions.from_spark); a Python worker that kept failing to start is
    transient (a rerun on a quieter machine passes); any other failure is terminal, named by
    the innermost error a Python worker raised (exceptions.worker_error: a full disk's OSError,
    not Spark's "An exception was thrown from the Python worker"), else by its first line."""
    found = from_spark(failure)
    log.error("the import failed", exc_info=failure)
    if found is not None:
        return found
    if late_worker(failure):
        return TransientError(
            "Spark's Python workers did not start within its 10 s, "
            f"{LATE_WORKER_RETRIES + 1} times: the machine is too busy; run it again later"
        )
    return TerminalError(f"import stopped: {worker_error(failure) or first_line(str(failure))}")
