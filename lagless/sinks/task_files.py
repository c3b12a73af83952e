"""Files written by Spark tasks for a store whose driver then commits them.

The source's own tasks (its executorWriter) write raw records in FILE_SCHEMA through
StagedFiles. Rows of a DataFrame are written to Parquet by the tasks that hold them
(DataFrame.mapInArrow, stage_rows): each task writes its rows into one file of a staging
folder, through a temporary name, and hands back one receipt row. The driver sees file names,
never the rows.

Runs on executors: imports pyarrow and nothing of lagless's driver."""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lagless.planner.ranges import OffsetRange
from lagless.sinks.s3 import S3Access

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

FILE_RECEIPT_SCHEMA = "file string, records long"
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


class ArrowFileWriter(Protocol):
    """A file that takes record batches (pyarrow's ParquetWriter, a CSV writer...)."""

    def write_batch(self, batch: pa.RecordBatch) -> None: ...

    def close(self) -> None: ...


class StagedFiles:
    """The source's executorWriter for a store whose driver commits the files (Parquet, Delta,
    SQLite): a task writes its records, in FILE_SCHEMA, into one file of `folder` named by its
    pieces, through a temporary name and a rename (on S3, where an upload appears whole or not
    at all, straight under its name). The same pieces always give the same name, so a retried
    or replayed task replaces its file rather than adding one."""

    def __init__(
        self,
        folder: str,
        suffix: str,
        open_writer: Callable[[Any], ArrowFileWriter],
        s3: S3Access | None = None,
    ) -> None:
        self.folder = folder
        self.suffix = suffix
        self.open_writer = open_writer
        self.s3 = s3

    def write(
        self, pieces: Sequence[OffsetRange], batches: Iterator[pa.RecordBatch]
    ) -> tuple[str, None]:
        name = pieces_file_name(pieces, self.suffix)
        with output_file(self.folder, name, self.s3) as sink:
            writer = self.open_writer(sink)
            try:
                for batch in batches:
                    writer.write_batch(stored_columns(batch))
            finally:
                writer.close()
        return f"{self.folder}/{name}", None


def make_folder(folder: str, tries: int = 5) -> None:
    """os.makedirs, tried again where another import's cleanup removed an empty parent between
    its steps (SQLite's staging folders share `<db>-lagless-staging/<table>`, removed by the
    import that empties it): once the folder is made its parents are not empty, so a few tries
    suffice."""
    for tried in range(1, tries + 1):
        try:
            os.makedirs(folder, exist_ok=True)
            return
        except FileNotFoundError:
            if tried == tries:
                raise


@contextmanager
def output_file(folder: str, name: str, s3: S3Access | None) -> Iterator[Any]:
    """Where a task writes one file: locally a temporary path renamed to `name` once whole;
    on S3 an upload under `name` (whole or not at all), removed if the writing fails."""
    path = f"{folder}/{name}"
    if s3 is None:
        make_folder(folder)
        partial = f"{path}.{uuid.uuid4().hex}.partial"
        try:
            yield partial
        except BaseException:
            with suppress(FileNotFoundError):
                os.remove(partial)
            raise
        os.replace(partial, path)
        return
    filesystem = s3.filesystem()
    key = path.removeprefix("s3://")
    with filesystem.open_output_stream(key) as stream:
        try:
            yield stream
        except BaseException:
            stream.close()
            with suppress(OSError):
                filesystem.delete_file(key)
            raise


def stored_columns(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch in the source's columns (source.schema.ARROW_SCHEMA) as FILE_SCHEMA."""
    columns = [batch.column(name) for name in FILE_SCHEMA.names[:-1]]
    return pa.RecordBatch.from_arrays([*columns, millis(batch)], schema=FILE_SCHEMA)


def millis(batch: pa.RecordBatch) -> pa.Array:
    """The source's timestamp column in ms since the epoch, as the stores keep it."""
    return pc.divide(batch.column("timestamp").cast(pa.int64()), 1000)


def pieces_file_name(pieces: Sequence[OffsetRange], suffix: str) -> str:
    """A task's file, named by its pieces: a retried or replayed task writes the same name."""
    digest = hashlib.sha1("|".join(map(repr, pieces)).encode()).hexdigest()[:24]
    return f"part-{digest}{suffix}"


Conform = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]


def stage_rows(
    rows: DataFrame,
    folder: str,
    conform: Conform | None = None,
    *,
    clear: Callable[[str], None] | None = None,
    s3: S3Access | None = None,
) -> list[str]:
    """Runs the rows' tasks, each writing its rows into `folder` (emptied first by `clear`:
    what a crashed attempt left there is not this batch's), through `conform` if given (a
    module-level function: it travels to the tasks), on S3 with `s3`'s access; returns the
    files written, sorted."""
    if clear is None:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        clear(folder)
    task = partial(write_task_file, folder, conform=conform, s3=s3)
    receipts = rows.mapInArrow(task, FILE_RECEIPT_SCHEMA).toArrow()
    return sorted(receipts.column("file").to_pylist())


def write_task_file(
    folder: str,
    batches: Iterator[pa.RecordBatch],
    conform: Conform | None = None,
    s3: S3Access | None = None,
) -> Iterator[pa.RecordBatch]:
    """A task's rows into one Parquet file (none for a task without rows); yields its receipt."""
    if conform is not None:
        batches = conform(batches)
    first = next((b for b in batches if b.num_rows), None)
    if first is None:
        return
    name = f"part-{uuid.uuid4().hex}.parquet"
    records = 0
    with output_file(folder, name, s3) as sink:
        dictionary = [n for n in first.schema.names if n not in NO_DICTIONARY]
        with pq.ParquetWriter(sink, first.schema, use_dictionary=dictionary) as writer:
            for batch in itertools.chain([first], batches):
                if batch.num_rows:
                    writer.write_batch(batch)
                    records += batch.num_rows
    yield pa.RecordBatch.from_pydict({"file": [f"{folder}/{name}"], "records": [records]})
