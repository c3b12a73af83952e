"""Parquet files written by the Kafka source's tasks themselves (its executorWriter option).

A task writes one file for its pieces into `<table>/_staging`, named by a digest of the pieces,
through a temporary name and a rename: a retried or replayed task replaces it with the same
records. Nothing under `_staging` is visible to readers (pyarrow and Spark skip names that
start with `_`); ParquetSink.commit_staged moves a batch's files into `batch=<id>` at once.

Runs on executors: imports nothing of lagless but the source's types.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lagless.planner.ranges import OffsetRange

STAGING = "_staging"
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


def writer(config: Mapping[str, object]) -> StagedParquet:
    return StagedParquet(str(config["folder"]))


class StagedParquet:
    def __init__(self, folder: str) -> None:
        self.folder = folder

    @contextmanager
    def task_file(self, pieces: Sequence[OffsetRange]) -> Iterator[TaskFile]:
        digest = hashlib.sha1("|".join(map(repr, pieces)).encode()).hexdigest()[:24]
        os.makedirs(self.folder, exist_ok=True)
        out = TaskFile(os.path.join(self.folder, f"part-{digest}.parquet"))
        try:
            yield out
            out.finish()
        finally:
            out.discard()


class TaskFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self._partial = f"{path}.{uuid.uuid4().hex}.partial"
        self._writer: pq.ParquetWriter | None = pq.ParquetWriter(
            self._partial,
            FILE_SCHEMA,
            use_dictionary=[n for n in FILE_SCHEMA.names if n not in NO_DICTIONARY],
            compression="snappy",
        )

    def write(self, batch: pa.RecordBatch) -> None:
        """A batch in the source's columns (source.schema.ARROW_SCHEMA)."""
        assert self._writer is not None
        millis = pc.divide(batch.column("timestamp").cast(pa.int64()), 1000)
        columns = [batch.column(name) for name in FILE_SCHEMA.names[:-1]]
        self._writer.write_batch(pa.RecordBatch.from_arrays([*columns, millis], schema=FILE_SCHEMA))

    def finish(self) -> None:
        assert self._writer is not None
        self._writer.close()
        self._writer = None
        os.replace(self._partial, self.path)

    def discard(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if os.path.exists(self._partial):
            os.remove(self._partial)
