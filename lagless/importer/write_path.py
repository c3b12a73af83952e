"""How an import's batches reach its store: decided here, once per query, and passed down.

Three write paths (Way), one per query, for every table it writes (one query's tasks read
every table's records, so they take one path or the other):

- ROWS: Spark's rows come to the driver's BatchWriter, which writes each table's part
  (Sink.write, or Sink.upsert_rows for an upsert);
- TASK_FILES: the source's tasks write each range's records into the store's staging files
  themselves (TaskWrittenSink.executor_writer); the driver commits the files;
- CHANGE_FILES: the source's tasks decode a mirror's change events (or an upsert's raw values)
  into change files in the checkpoint (change_files.py); the driver upserts their rows.

`decide` makes the choice from the import's options (WriteOptions), the store and the
tables (Destination); the plan (plan.ImportPlan) holds it as `write_path`, and the source's
options, Spark's start and the BatchWriter read it there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum

from lagless.importer import change_files
from lagless.importer.cluster import executors_share_disk, master_url
from lagless.importer.routing import Destination
from lagless.sinks import Sink, Target
from lagless.sinks.base import TaskWriter, TaskWrittenSink
from lagless.source import avro_values, json_values
from lagless.source.executor_write import ROUTED_WRITER
from lagless.source.json_values import decodable


class Way(Enum):
    ROWS = "rows"
    TASK_FILES = "task files"
    CHANGE_FILES = "change files"


@dataclass(frozen=True)
class WriteOptions:
    """What of an import's options the write path depends on (ImportSpec.write_options)."""

    max_record_bytes: int | None
    dead_letter_topic: str | None
    routed: bool
    master: str | None
    shared_disk: bool
    # Where the tasks write a mirror's change files (ImportSpec.changes_folder).
    changes_folder: str

    @property
    def executors_share_disk(self) -> bool:
        return executors_share_disk(master_url(self.master), self.shared_disk)


@dataclass(frozen=True)
class WritePath:
    """One query's write path: its Way, and the writer the source's tasks run (None: ROWS)."""

    way: Way
    writer: TaskWriter | None = None

    @property
    def records_in_jvm(self) -> bool:
        """Every record passes through Spark's JVM (its rows): Spark starts for that."""
        return self.way is Way.ROWS


ROWS = WritePath(Way.ROWS)


def decide(options: WriteOptions, sink: Sink, destinations: list[Destination]) -> WritePath:
    """The write path of a query that writes `destinations`: change files where every table
    takes them, else task files where every table takes them, else rows."""
    changes = change_files_writer(options, sink, destinations)
    if changes is not None:
        return WritePath(Way.CHANGE_FILES, changes)
    files = task_files_writer(options, sink, destinations)
    if files is not None:
        return WritePath(Way.TASK_FILES, files)
    return ROWS


def task_files_writer(
    options: WriteOptions, sink: Sink, destinations: list[Destination]
) -> TaskWriter | None:
    """The writer the source's tasks run when they write every table's records (each table's
    writer, by topic, for a routed import: executor_write.routed); else None."""
    if len({(_json(each.target), each.avro) for each in destinations}) > 1:
        return None  # the tasks decode values one way for all tables
    writers = {}
    for each in destinations:
        writer = table_writer(options, sink, each.target)
        if writer is None:
            return None
        writers.update(dict.fromkeys(each.topics, writer))
    if not writers:
        return None
    if not options.routed:
        return next(iter(writers.values()))
    secret = next(iter(writers.values())).secret  # one store's
    routes = {topic: [writer.name, writer.config] for topic, writer in writers.items()}
    return TaskWriter(ROUTED_WRITER, json.dumps({"routes": routes}), secret)


def table_writer(options: WriteOptions, sink: Sink, target: Target) -> TaskWriter | None:
    """The store's writer for the source's tasks, when they write one table's records
    themselves: an append without a size limit, of raw values (none can be rejected, none
    goes to a dead-letter topic) or of typed values in columns of INT, BIGINT, DOUBLE,
    BOOLEAN and STRING (json_values.decodable), JSON or Avro, which the tasks decode (the
    values they do not decode, they leave to Spark's rows), into a store that takes them so
    for this target, which sets no rules on rows (Target.row_rules). Else None: rows go
    through Spark (Sink.write). target: as the checks
    resolved it; a typed one is known only then."""
    if (
        not isinstance(sink, TaskWrittenSink)
        or target.row_rules  # evaluated on Spark's rows (rows.py)
        or target.mode != "append"
        or target.value_format == "debezium"
        or options.max_record_bytes is not None
    ):
        return None
    if target.value_format == "raw":
        if options.dead_letter_topic is not None:
            return None
    elif target.fields is None or not decodable(target.fields.json()):
        return None
    return sink.executor_writer(target, decoded_column(target))


def may_write_change_files(options: WriteOptions) -> bool:
    """What of the change files' conditions the options alone decide: no --max-record-bytes,
    executors that see the driver's disk (the change files lie in the checkpoint)."""
    return options.max_record_bytes is None and options.executors_share_disk


def change_files_writer(
    options: WriteOptions, sink: Sink, destinations: list[Destination]
) -> TaskWriter | None:
    """The writer of the source's tasks when they decode the records of an upsert themselves
    (change_files.py): every table a mirror of JSON events upserted with hard deletes (soft
    deletes take Spark's rows) or an upsert of raw values, in a store that upserts the
    driver's rows, into tables that set no rules on rows, and may_write_change_files. Else
    None."""
    if not destinations or not may_write_change_files(options):
        return None
    targets = {}
    for each in destinations:
        if each.avro is not None or not takes_change_files(sink, each.target):
            return None
        targets.update(dict.fromkeys(each.topics, each.target))
    config = change_files.task_config(options.changes_folder, targets)
    return TaskWriter(change_files.WRITER, config)


def takes_change_files(sink: Sink, target: Target) -> bool:
    """A table whose upserts the tasks' change files can bring: a mirror of JSON events with
    hard deletes, or an upsert of raw values, into a store that upserts the driver's rows."""
    mirrored = (
        target.value_format == "debezium" and target.deletes == "hard" and target.fields is not None
    )
    raw = target.value_format == "raw" and target.fields is None
    return (
        target.mode == "upsert"
        and (mirrored or raw)
        and not target.row_rules  # evaluated on Spark's rows (rows.py)
        and sink.takes_upsert_rows(target)
    )


def decoded_column(target: Target) -> str | None:
    """The source's column of typed values decoded in its tasks, for a typed target."""
    if target.fields is None:
        return None
    return avro_values.COLUMN if target.value_format == "avro" else json_values.COLUMN


def _json(target: Target) -> str | None:
    return target.fields.json() if target.fields is not None else None
