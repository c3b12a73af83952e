"""What every store does: check a target without touching it, prepare it, write one batch.

Writes are idempotent by construction, never by bookkeeping: append rows are unique on
(topic, partition, offset) and an upsert replaces a stored row only with a newer record,
so a batch replayed after a crash changes nothing it already wrote.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal, Self

from lagless.exceptions import BadInput
from lagless.retry import DEFAULT_RETRY_S
from lagless.secret import Secret

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType, StructType

WriteMode = Literal["append", "upsert"]
ValueFormat = Literal["raw", "json", "avro"]

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


def check_identifier(name: str, what: str = "table name") -> str:
    if not _IDENTIFIER.fullmatch(name):
        raise BadInput(
            f"{what} {name!r} is not a valid identifier "
            "(letters, digits and _, not starting with a digit, at most 63 characters)"
        )
    return name


def check_writable_path(path: str, what: str, *, folder: bool) -> None:
    """The path can be created or written as a folder (or a file), judged without creating it."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if os.path.exists(path) and os.path.isdir(path) != folder:
        kind = "a directory" if os.path.isdir(path) else "a file"
        raise BadInput(f"{what} path {path!r} is {kind}")
    if not os.path.isdir(probe) and probe != os.path.abspath(path):
        raise BadInput(f"{what} path {path!r} cannot be created: {probe!r} is not a directory")
    if not os.access(probe, os.W_OK):
        raise BadInput(f"{what} path {path!r} is not writable")


@dataclass(frozen=True)
class Target:
    table: str
    mode: WriteMode
    value_format: ValueFormat
    # The value's fields, each a column (a typed table); None: the value is one column.
    fields: StructType | None = None
    # The upsert key: these fields of the value; empty: the Kafka key.
    key_fields: tuple[str, ...] = ()
    # What the batch ids count in: the checkpoint's query id, set by the importer once the query
    # runs. A store that records the batches it committed (Delta) keys them by it, so a fresh
    # checkpoint, whose batch ids start again at 0, is not taken for a replay.
    run_id: str = ""

    @property
    def dead_letter_table(self) -> str:
        return f"{self.table}_dlq"

    @property
    def tombstone_table(self) -> str:
        """Upsert mode: the newest tombstone of each deleted key, so that an older record
        replayed later cannot bring the row back."""
        return f"{self.table}_tombstones"

    @property
    def unique(self) -> tuple[str, ...]:
        if self.mode == "upsert":
            return self.key_fields or ("key",)
        return ("topic", "partition", "offset")

    @property
    def row_columns(self) -> tuple[str, ...]:
        """The columns of the rows `Sink.write` gets."""
        return (*self.schema().fieldNames(), *([TOMBSTONE] if self.mode == "upsert" else []))

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
        if self.fields is None:
            return StructType([StructField(n, types[n], n not in self.unique) for n in COLUMNS])
        return StructType(
            [StructField(n, types[n], n not in self.unique) for n in TYPED_COLUMNS]
            + [StructField(f.name, f.dataType, f.name not in self.unique) for f in self.fields]
        )


@dataclass(frozen=True)
class TaskWriter:
    """Where the source's tasks write accepted records themselves (source/executor_write.py):
    the writer's "module:function", its JSON config, and a secret it needs (a password)."""

    name: str
    config: str
    secret: Secret | None = None


class Sink(ABC):
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

    @abstractmethod
    def check(self, target: Target) -> None:
        """Raise BadInput if target cannot be written; write nothing."""

    @abstractmethod
    def prepare(self, target: Target) -> None:
        """Create the target and its dead-letter table (or folders); safe to repeat."""

    @abstractmethod
    def write(self, rows: DataFrame, target: Target, batch_id: int) -> int | None:
        """Store rows (COLUMNS) idempotently; returns the rows written (None: all of them)."""

    @abstractmethod
    def write_dead_letters(self, rows: DataFrame, target: Target, batch_id: int) -> int | None:
        """Store rejected records (DEAD_LETTER_COLUMNS) idempotently."""

    def executor_writer(self, target: Target) -> TaskWriter | None:
        """Where the source's tasks may write accepted records themselves; None: this store
        takes rows through Spark. Asked once, before the query starts."""
        return None

    def discard_staged(self, target: Target) -> None:  # noqa: B027 - only with executor_writer
        """Before a batch's tasks run: drop what a crashed attempt staged."""

    def run_tasks(self, receipts: DataFrame) -> pa.Table:
        """With executor_writer: run the batch's tasks, which write the records, and collect
        their receipts (source.executor_write.RECEIPT_SCHEMA)."""
        return receipts.toArrow()

    def commit_staged(self, receipts: pa.Table, target: Target, batch_id: int) -> None:
        """After a batch's tasks wrote (receipts in source.executor_write.RECEIPT_SCHEMA):
        make the batch visible, idempotently."""
        raise NotImplementedError(f"{type(self).__name__} takes rows through Spark")

    def close(self) -> None:  # noqa: B027 - most sinks hold nothing open
        """Last in the lifecycle, also when the import fails: release connections."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class DriverSink(Sink):
    """A store written from the driver: rows arrive as one Arrow table per batch."""

    # The whole batch is one Arrow table in the driver's memory.
    max_batch_bytes: int = 256 * 1024 * 1024

    def write(self, rows: DataFrame, target: Target, batch_id: int) -> int:
        columns = [self.transported(f.name, f.dataType) for f in rows.schema.fields]
        table = rows.select(*columns).toArrow()
        return self.write_arrow(table.to_reader(), target, dead_letters=False)

    def transported(self, name: str, data_type: DataType) -> Column:
        """A column as the store's Arrow ingestion takes it: nested values as JSON text (the
        store's JSON type), converted in the JVM."""
        from pyspark.sql import functions as F
        from pyspark.sql.types import ArrayType, MapType, StructType

        if isinstance(data_type, ArrayType | MapType | StructType):
            return F.to_json(name).alias(name)
        return F.col(name)

    def write_dead_letters(self, rows: DataFrame, target: Target, batch_id: int) -> int:
        table = rows.select(*DEAD_LETTER_COLUMNS).toArrow()
        return self.write_arrow(table.to_reader(), target, dead_letters=True)

    @abstractmethod
    def write_arrow(self, rows: pa.RecordBatchReader, target: Target, *, dead_letters: bool) -> int:
        """Store rows (in the columns of the target or of its dead-letter table, in order) into
        the target or its dead-letter table; returns the rows changed."""
