"""What every store does: check a target without touching it, prepare it, read its ledger,
write one batch.

Writes are idempotent by construction: append rows are unique on (topic, partition, offset)
(SQL) or a batch is committed only when the store's ledger does not hold its offsets yet
(Parquet, Delta: ledger.py), and an upsert replaces a stored row only with a newer record. So a
batch replayed after a crash, or imported again from a fresh checkpoint, changes nothing.
"""

from __future__ import annotations

import os
import re
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, Self

import pyarrow as pa

from lagless.cdc.envelope import Deletes
from lagless.cdc.key_change import BATCH_COLUMNS, MARK_COLUMNS
from lagless.cdc.unavailable import kept_columns
from lagless.exceptions import BadInput
from lagless.retry import DEFAULT_RETRY_S
from lagless.secret import Secret
from lagless.sinks.ledger import TP, Batch, HeldRecord
from lagless.sinks.upsert_order import LOG_TIME

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType, StructType


WriteMode = Literal["append", "upsert"]
ValueFormat = Literal["raw", "json", "avro", "debezium"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

# Columns every sink stores, in this order. The timestamp is milliseconds since the epoch.
COLUMNS = ("topic", "partition", "offset", "key", "value", "timestamp")
# A typed table keeps the record's coordinates (the newer-only rule and append uniqueness need
# them) and the Kafka key as read; the value's fields follow, in place of `value`.
TYPED_COLUMNS = ("topic", "partition", "offset", "key", "timestamp")
# In upsert mode the rows a sink gets carry this column too: true for a tombstone (a null
# value), which deletes its key's row instead of being stored.
TOMBSTONE = "tombstone"
# A record that could not be imported: its value as read, the stage that failed and why.
DEAD_LETTER_COLUMNS = (
    "topic",
    "partition",
    "offset",
    "timestamp",
    "key",
    "value",
    "stage",
    "error",
)
# Their Arrow types, as Spark's rows carry them (the timestamp in ms).
DEAD_LETTER_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("stage", pa.string()),
        ("error", pa.string()),
    ]
)
assert tuple(DEAD_LETTER_SCHEMA.names) == DEAD_LETTER_COLUMNS


def spark_types(schema: pa.Schema) -> dict[str, DataType | None]:
    """Each column of an Arrow schema with its Spark type (None: one Spark has not)."""
    from pyspark.sql.pandas.types import from_arrow_type

    found: dict[str, DataType | None] = {}
    for column in schema:
        try:
            found[column.name] = from_arrow_type(column.type)
        except (TypeError, ValueError, NotImplementedError):  # a type Spark has not
            found[column.name] = None
    return found


def in_schema(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """`rows` in the columns and types of `schema`, a column they lack as nulls (added to the
    table since they were written)."""
    columns = [
        rows.column(f.name).cast(f.type)
        if f.name in rows.column_names
        else pa.nulls(rows.num_rows, f.type)
        for f in schema
    ]
    return pa.table(columns, schema=schema)


@dataclass(frozen=True)
class Written:
    """What committing a batch did to its table (Sink.write, TaskWrittenSink.commit_staged),
    counted the same way in every store."""

    # Rows the table gained or replaced (an upsert's newer record replaces its key's row);
    # None: one per row given (an append).
    rows: int | None = None
    # The ledger held the batch's offsets already (a replay): nothing was written.
    replay: bool = False


ALREADY_HELD = Written(0, replay=True)


def check_identifier(name: str, what: str = "table name") -> str:
    if not _IDENTIFIER.fullmatch(name):
        raise BadInput(
            f"{what} {name!r} is not a valid identifier "
            "(letters, digits and _, not starting with a digit, at most 63 characters)"
        )
    return name


def check_writable_path(path: str, what: str, *, folder: bool) -> None:
    """The path can be created or written as a folder (or a file): a probe folder is made and
    removed in the nearest folder that exists, so nothing is left behind. Permission bits do not
    tell (root may write anywhere they say, yet not under /sys or /proc)."""
    absolute = os.path.abspath(path)
    if os.path.exists(absolute) and os.path.isdir(absolute) != folder:
        kind = "a directory" if os.path.isdir(absolute) else "a file"
        raise BadInput(f"{what} path {path!r} is {kind}")
    # A file's folder takes SQLite's journal and lagless's staging beside it.
    nearest = absolute if folder else os.path.dirname(absolute)
    while not os.path.lexists(nearest):
        nearest = os.path.dirname(nearest)
    if not os.path.isdir(nearest):
        raise BadInput(f"{what} path {path!r} cannot be created: {nearest!r} is not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".lagless-probe-", dir=nearest))
    except OSError as exc:
        raise BadInput(
            f"{what} path {path!r} is not writable: nothing can be created in {nearest!r} "
            f"({exc.strerror})"
        ) from None
    if not folder and os.path.exists(absolute):
        try:
            os.close(os.open(absolute, os.O_WRONLY))
        except OSError as exc:
            raise BadInput(f"{what} path {path!r} is not writable ({exc.strerror})") from None


@dataclass(frozen=True)
class RowRule:
    """A rule the table sets on each row it takes (a Delta CHECK constraint or invariant): a
    Spark SQL condition over the table's columns. A row for which it is false or NULL breaks
    it (Delta's rule, delta-rs's and Spark's alike), and is dead-lettered alone."""

    name: str
    condition: str

    @property
    def broken(self) -> str:
        """The dead letter's error for a row that breaks the rule."""
        return f"breaks the table's rule {self.name}: {self.condition}"


@dataclass(frozen=True)
class Target:
    table: str
    mode: WriteMode
    value_format: ValueFormat
    # The value's fields, each a column (a typed table); None: the value is one column.
    fields: StructType | None = None
    # The upsert key: these fields of the value; empty: the Kafka key.
    key_fields: tuple[str, ...] = ()
    # What tells this import's staging folders from another's writing into the same table at
    # the same time (ImportSpec: a digest of its checkpoint's path, the same on every rerun).
    run_id: str = "run"
    # Debezium: a tombstone row is a delete, or (soft) an update of the row's _deleted flag.
    deletes: Deletes = "hard"
    # What the table requires of each row it takes (Sink.row_rules): evaluated in Spark on the
    # shaped rows (importer/rows.py), so rows take Spark's path (write_path.decide).
    row_rules: tuple[RowRule, ...] = ()
    # The Schema Registry the values are read through (Avro in Confluent's wire format: a
    # Debezium mirror's change events, importer/debezium.py `events_of`); None: none.
    schema_registry: str | None = None

    @property
    def dead_letter_table(self) -> str:
        return f"{self.table}_dlq"

    @property
    def ledger_table(self) -> str:
        """SQL stores: the offset ranges each committed batch covered (ledger.py)."""
        return f"{self.table}_ledger"

    @property
    def tombstone_table(self) -> str:
        """Upsert mode: the newest tombstone of each deleted key, so that an older record
        replayed later cannot bring the row back."""
        return f"{self.table}_tombstones"

    @property
    def moves_table(self) -> str:
        """A mirror's key changes: each one's moved values, by its id (cdc/key_change.py)."""
        return f"{self.table}_moves"

    @property
    def marks(self) -> bool:
        """A mirror's table whose columns Debezium may send as its placeholder: it keeps the
        values it cannot know marked (cdc/key_change.py), and its key changes' moves."""
        return (
            self.value_format == "debezium"
            and self.mode == "upsert"
            and self.fields is not None
            and bool(kept_columns(self.fields, self.unique))
        )

    @property
    def unique(self) -> tuple[str, ...]:
        if self.mode == "upsert":
            return self.key_fields or ("key",)
        return ("topic", "partition", "offset")

    @property
    def row_columns(self) -> tuple[str, ...]:
        """The columns of the rows `Sink.write` gets: the stored ones, then in upsert mode the
        tombstone flag, then a marked mirror's key changes (key_change.BATCH_COLUMNS)."""
        flags = [TOMBSTONE] if self.mode == "upsert" else []
        return (*self.schema().fieldNames(), *flags, *(BATCH_COLUMNS if self.marks else ()))

    def schema(self) -> StructType:
        """The stored columns and their Spark types: what a sink derives its layout from."""
        from pyspark.sql.types import (
            BinaryType,
            IntegerType,
            LongType,
            StringType,
            StructField,
            StructType,
        )

        types: dict[str, DataType] = {
            "topic": StringType(),
            "partition": IntegerType(),
            "offset": LongType(),
            "key": BinaryType(),
            "value": StringType() if self.value_format == "json" else BinaryType(),
            "timestamp": LongType(),
        }
        # Upsert: each row's rank needs its log time (upsert_order.py), last so that a table an
        # earlier lagless made gains it where a column added goes.
        ranked = [StructField(LOG_TIME, LongType(), True)] if self.mode == "upsert" else []
        if self.fields is None:
            return StructType(
                [StructField(n, types[n], n not in self.unique) for n in COLUMNS] + ranked
            )
        # A marked mirror's own columns, last too (key_change.MARK_COLUMNS).
        marks = [StructField(n, StringType(), True) for n in MARK_COLUMNS if self.marks]
        return StructType(
            [StructField(n, types[n], n not in self.unique) for n in TYPED_COLUMNS]
            + [StructField(f.name, f.dataType, f.name not in self.unique) for f in self.fields]
            + ranked
            + marks
        )


@dataclass(frozen=True)
class TaskWriter:
    """Where the source's tasks write accepted records themselves (source/executor_write.py):
    the writer's "module:function", its JSON config, and a secret it needs (a password)."""

    name: str
    config: str
    secret: Secret | None = None


class Sink(ABC):
    """A store the importer writes to, each batch's rows coming through Spark (the DataFrame
    foreachBatch hands over). The importer calls, in this order:

    1. `table_name`, `identity`, `driver_folder_for_tasks`: while the import is specified,
       before anything is opened;
    2. `check`: before anything is written anywhere;
    3. `prepare`: once every check passed;
    4. `ledger`: once, before the first batch: where each partition resumes; then
       `newest_rows`: what tells the topic the table holds from one recreated since;
    5. per batch, `write`, which calls back for `write_dead_letters` when a record was
       rejected;
    6. `close`: last, also when the import fails.

    A store whose batches the source's tasks may write themselves is a TaskWrittenSink too.
    """

    scheme: ClassVar[str]
    # Bytes of records per batch when the user sets no limit. A batch costs a second or two of
    # Spark bookkeeping and ends with every core waiting for its last task, so bulk batches
    # stay large; executors stream rows into the store, so memory does not bound them.
    max_batch_bytes: int = 1024 * 1024 * 1024
    # How long a store that is away (a database restarting) is waited for; the import sets it
    # from --retry-seconds (lagless/retry.py).
    retry_s: float = DEFAULT_RETRY_S
    # A run's first batch is small, so its rows are visible seconds after the start rather than
    # after a whole large batch (a dozen seconds or more here); it costs one batch more.
    FIRST_BATCH_MAX_BYTES: ClassVar[int] = 32 * 1024 * 1024

    def __init__(self, url: str, location: str) -> None:
        self.url = url
        self.location = location

    @property
    def identity(self) -> str:
        """Where rows land, as a checkpoint remembers it: an absolute location, no secret."""
        return f"{self.scheme}:///{os.path.realpath(self.location)}"

    @property
    def destination(self) -> str:
        """Where rows land, as the import's summary names it: a local store's absolute path
        (its database file, its folder), else its URL without a password."""
        local = f"{self.scheme}:///"
        identity = self.identity
        return identity[len(local) :] if identity.startswith(local + "/") else identity

    def table_name(self, name: str) -> str:
        """--table (or the topic's name) as this store takes it; BadInput if it cannot."""
        return check_identifier(name)

    @abstractmethod
    def check(self, target: Target) -> None:
        """First, before anything is written anywhere: raise BadInput if target cannot be
        written (a table of another layout, a path that cannot be created); write nothing."""

    def row_rules(self, target: Target) -> tuple[RowRule, ...]:
        """The rules the table (once checked) sets on each row it takes; none by default."""
        return ()

    @abstractmethod
    def prepare(self, target: Target) -> None:
        """Once every check passed: create the target and its dead-letter table (or folders);
        safe to repeat."""

    @abstractmethod
    def ledger(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        """After prepare, before the first batch: for each of these partitions the table holds
        records of, the first offset above everything it holds (ledger.py). The import starts
        there, whatever its checkpoint says."""

    def empty(self, target: Target) -> None:
        """A mirror's TRUNCATE: every row of target's table removed (its ledger kept), before
        the rows of the events after it are upserted with the batch's ranges."""
        raise NotImplementedError(f"{type(self).__name__} does not apply a TRUNCATE")

    def table_types(self, target: Target) -> dict[str, DataType | None]:
        """The columns target's table has, each with its Spark type where the store tells it
        (None: SQLite's loose types, a type no change event widens); {}: no table yet. A
        mirror's columns take the widest of these and its events' (cdc/schema_change.py)."""
        return {}

    def newest_rows(self, target: Target, held: Mapping[TP, int]) -> dict[TP, HeldRecord]:
        """After `ledger`, before the first batch: for partitions of `held` (what `ledger`
        found), the offset, timestamp and key of the table's row of the highest offset below
        it (ledger.recreated compares them with the log). A partition left out says nothing;
        a store that cannot tell returns {}."""
        return {}

    def unknown_rows(self, table: str) -> int | None:
        """Rows of `table` (a marked mirror's) whose values the mirror cannot know: those its
        UNKNOWN column names any (cdc/key_change.py); None: the table has no such column (or
        does not exist yet). Read from the table whenever asked (the summary, `lag --sink`)."""
        return None

    def log_times(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        """Upsert, with `ledger`: each partition's log time where the ledger ends (kept with
        Batch.log_times; upsert_order.py), where the next batch's running maximum starts. A
        partition left out: none kept (an append table, or one an earlier lagless wrote)."""
        return {}

    def skipped(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        """With `ledger`: per partition, the records below what the table holds that it never
        took, kept with the batches' ranges (Batch.skipped: deleted by the broker before they
        were read, under --skip-lost-offsets). A partition left out skipped nothing; a table
        with any is incomplete (`lag --sink` says so)."""
        return {}

    @abstractmethod
    def write(
        self, rows: DataFrame, target: Target, batch: Batch, before_commit: Callable[[], None]
    ) -> int | Written | None:
        """Per batch: store rows (COLUMNS) idempotently with the batch's ranges in the ledger, in
        one atomic step; returns the rows the table gained or replaced (None: one per row
        given), or Written (ALREADY_HELD: the ledger held the batch). Calls before_commit
        once the rows are staged (Spark's job over them has run) and before that step: the
        batch's dead letters are stored then, so the ledger never holds a batch whose dead
        letters a crash lost."""

    @abstractmethod
    def write_dead_letters(self, rows: DataFrame, target: Target, batch: Batch) -> int | None:
        """Per batch, from write's before_commit, only when some record was rejected: store
        them (DEAD_LETTER_COLUMNS) idempotently."""

    def takes_upsert_rows(self, target: Target) -> bool:
        """Whether `upsert_rows` stores this target's rows (a Debezium mirror's, which the
        source's tasks decode and the driver coalesces: importer/change_files.py)."""
        return False

    def upsert_rows(self, rows: pa.Table, target: Target, batch: Batch) -> int | Written | None:
        """Per batch, in place of `write`, for a target `takes_upsert_rows` took: upsert rows
        (row_columns, one per key, the tombstone flag last) as `write` does, in one atomic
        step with the batch's ranges. The batch's dead letters are stored before."""
        raise NotImplementedError(f"{type(self).__name__} takes its rows through Spark")

    def driver_folder_for_tasks(self, target: Target, tasks_write: bool) -> str | None:
        """Before anything is written: the folder of the driver's filesystem that Spark's tasks
        write files into for target (tasks_write: the source's tasks write the records
        themselves, TaskWrittenSink.executor_writer); None: they write nowhere on the driver's
        disk (a database over the network). On a cluster whose executors do not see the
        driver's disk, such a store is refused up front (importer/cluster.py)."""
        return None

    # What the refusal suggests instead, beside --shared-disk.
    without_shared_disk: ClassVar[str] = "import into PostgreSQL or a table on S3"

    def close(self) -> None:  # noqa: B027 - most sinks hold nothing open
        """Last in the lifecycle, also when the import fails: release connections."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class TaskWrittenSink(Sink):
    """A store the source's tasks may write records into themselves, for a batch that needs
    nothing of Spark's rows (an append: importer/spec.py decides): no record crosses into the
    JVM. The lifecycle is Sink's, with these in place of `write` and `write_dead_letters`:

    1. `executor_writer`: once, before the query starts: the writer the tasks run, or None
       when this target goes through Spark's rows after all (`write`);
    2. per batch, before its tasks run: `discard_staged`;
    3. `run_tasks`: Spark runs the batch's tasks, which write;
    4. only when the tasks left records to Spark's rows (typed values they did not decode):
       `left_records`, then `stage_rows` with the rows importer/rows.py made of them (their
       rejected records go to `write_dead_letters` before the commit);
    5. `commit_staged`: the batch becomes visible with its ranges in the ledger.
    """

    @abstractmethod
    def executor_writer(self, target: Target, decoded: str | None = None) -> TaskWriter | None:
        """Once, before the query starts: where the source's tasks write accepted records
        (source/executor_write.py); typed values come decoded in the source's column `decoded`.
        None: this target's rows come through Spark (write)."""

    @abstractmethod
    def discard_staged(self, target: Target) -> None:
        """Per batch, before the batch's tasks run: drop what a crashed attempt staged."""

    def run_tasks(self, receipts: DataFrame) -> pa.Table:
        """Per batch: run the batch's tasks, which write the records, and collect their
        receipts (source.executor_write.RANGE_RECEIPT_SCHEMA)."""
        return receipts.toArrow()

    def left_records(self, spark: SparkSession, files: list[str]) -> DataFrame:
        """Per batch, when the tasks' receipts name `left` files: their records, in the
        source's columns. Only a store whose writer leaves records implements it."""
        raise NotImplementedError(f"{type(self).__name__}'s tasks leave no records")

    def stage_rows(self, rows: DataFrame, target: Target) -> list[str]:
        """Per batch, after `left_records`: the rows made of them, staged where commit_staged
        takes them; returns the files."""
        raise NotImplementedError(f"{type(self).__name__}'s tasks leave no records")

    @abstractmethod
    def commit_staged(self, files: list[str], target: Target, batch: Batch) -> Written | None:
        """Per batch, after the tasks wrote (files: theirs, and stage_rows'): make the batch
        visible with its ranges in the ledger, in one atomic step, unless the ledger holds
        them already (then ALREADY_HELD; None or Written: what the table gained)."""


class DriverSink(Sink):
    """A store written from the driver: rows arrive as one Arrow table per batch."""

    # The whole batch is one Arrow table in the driver's memory.
    max_batch_bytes: int = 256 * 1024 * 1024

    def write(
        self, rows: DataFrame, target: Target, batch: Batch, before_commit: Callable[[], None]
    ) -> int | Written:
        columns = [self.transported(f.name, f.dataType) for f in rows.schema.fields]
        table = rows.select(*columns).toArrow()
        before_commit()
        return self.write_arrow(table.to_reader(), target, batch)

    def transported(self, name: str, data_type: DataType) -> Column:
        """A column as the store's Arrow ingestion takes it: nested values as JSON text (the
        store's JSON type), converted in the JVM."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import ArrayType, MapType, StructType

        if isinstance(data_type, ArrayType | MapType | StructType):
            return F.to_json(name).alias(name)
        return F.col(name)

    def takes_upsert_rows(self, target: Target) -> bool:
        """Rows of flat columns (nested ones travel as JSON text, which `transported` makes in
        the JVM)."""
        from pyspark.sql.types import ArrayType, MapType, StructType

        nested = (ArrayType, MapType, StructType)
        return not any(isinstance(f.dataType, nested) for f in target.schema().fields)

    def upsert_rows(self, rows: pa.Table, target: Target, batch: Batch) -> int | Written:
        return self.write_arrow(rows.to_reader(), target, batch)

    def write_dead_letters(self, rows: DataFrame, target: Target, batch: Batch) -> None:
        table = rows.select(*DEAD_LETTER_COLUMNS).toArrow()
        self.write_arrow(table.to_reader(), target, None)

    @abstractmethod
    def write_arrow(
        self, rows: pa.RecordBatchReader, target: Target, batch: Batch | None
    ) -> int | Written:
        """Store rows into the target, and the batch's ranges into its ledger, in one
        transaction; with no batch, rows are dead letters (DEAD_LETTER_COLUMNS) for the
        dead-letter table. Returns the rows the target gained or replaced (ALREADY_HELD: the
        ledger held the batch)."""
