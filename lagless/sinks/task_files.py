"""Files written by Spark tasks for a store whose driver then commits them.

The source's own tasks (its executorWriter) write raw records in FILE_SCHEMA through
StagedFiles. Rows of a DataFrame are written to Parquet by the tasks that hold them
(DataFrame.mapInArrow, stage_rows): each task writes its rows into one file of a staging
folder, through a temporary name, and hands back one receipt row. The driver sees file names,
never the rows.

Runs on executors: imports pyarrow and nothing of lagless's driver."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lagless.planner.ranges import OffsetRange

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

RECEIPT_SCHEMA = "file string, records long"
# The sink's columns (sinks.base.COLUMNS) for raw values; the timestamp in ms since the epoch.
FILE_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("timestamp", pa.int64()),
    ]
)
# As the Spark path writes them: no dictionary for the columns that are nearly all distinct.
NO_DICTIONARY = ["offset", "timestamp", "value"]


class BatchWriter(Protocol):
    def write_batch(self, batch: pa.RecordBatch) -> None: ...

    def close(self) -> None: ...


class StagedFiles:
    """The source's executorWriter for a store whose driver commits the files (Parquet, Delta,
    SQLite): a task writes its records, in FILE_SCHEMA, into one file of `folder` named by its
    pieces, through a temporary name and a rename. The same pieces always give the same name,
    so a retried or replayed task replaces its file rather than adding one."""

    def __init__(self, folder: str, suffix: str, open_writer: Callable[[str], BatchWriter]) -> None:
        self.folder = folder
        self.suffix = suffix
        self.open_writer = open_writer

    def write(self, pieces: Sequence[OffsetRange], batches: Iterator[pa.RecordBatch]) -> str:
        os.makedirs(self.folder, exist_ok=True)
        digest = hashlib.sha1("|".join(map(repr, pieces)).encode()).hexdigest()[:24]
        path = os.path.join(self.folder, f"part-{digest}{self.suffix}")
        partial = f"{path}.{uuid.uuid4().hex}.partial"
        writer = self.open_writer(partial)
        try:
            for batch in batches:
                writer.write_batch(stored_columns(batch))
        except BaseException:
            writer.close()
            os.remove(partial)
            raise
        writer.close()
        os.replace(partial, path)
        return path


def stored_columns(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch in the source's columns (source.schema.ARROW_SCHEMA) as FILE_SCHEMA."""
    millis = pc.divide(batch.column("timestamp").cast(pa.int64()), 1000)
    columns = [batch.column(name) for name in FILE_SCHEMA.names[:-1]]
    return pa.RecordBatch.from_arrays([*columns, millis], schema=FILE_SCHEMA)


Conform = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def stage_rows(rows: DataFrame, folder: str, conform: Conform | None = None) -> list[str]:
    """Runs the rows' tasks, each writing its rows into `folder` (emptied first: what a crashed
    attempt left there is not this batch's), through `conform` if given (a module-level
    function: it travels to the tasks); returns the files written, sorted."""
    shutil.rmtree(folder, ignore_errors=True)
    task = partial(write_task_file, folder, conform=conform)
    receipts = rows.mapInArrow(task, RECEIPT_SCHEMA).toArrow()
    return sorted(receipts.column("file").to_pylist())


def write_task_file(
    folder: str, batches: Iterator[pa.RecordBatch], conform: Conform | None = None
) -> Iterator[pa.RecordBatch]:
    """A task's rows into one Parquet file (none for a task without rows); yields its receipt."""
    if conform is not None:
        batches = conform(batches)
    path = os.path.join(folder, f"part-{uuid.uuid4().hex}.parquet")
    writing = f"{path}.partial"
    writer: pq.ParquetWriter | None = None
    records = 0
    try:
        for batch in batches:
            if not batch.num_rows:
                continue
            if writer is None:
                os.makedirs(folder, exist_ok=True)
                dictionary = [n for n in batch.schema.names if n not in NO_DICTIONARY]
                writer = pq.ParquetWriter(writing, batch.schema, use_dictionary=dictionary)
            writer.write_batch(batch)
            records += batch.num_rows
    except BaseException:
        if writer is not None:
            writer.close()
            os.remove(writing)
        raise
    if writer is None:
        return
    writer.close()
    os.replace(writing, path)
    yield pa.RecordBatch.from_pydict({"file": [path], "records": [records]})
