"""Rows written to Parquet by the Spark tasks that hold them (DataFrame.mapInArrow), for a store
whose driver then commits the files: each task writes its rows into one file of a staging
folder, through a temporary name, and hands back one receipt row. The driver sees file names,
never the rows.

write_task_file runs on executors: it imports pyarrow and nothing of lagless's driver.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from lagless.sinks.parquet.staged import NO_DICTIONARY

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

RECEIPT_SCHEMA = "file string, records long"


def stage_rows(rows: DataFrame, folder: str) -> list[str]:
    """Runs the rows' tasks, each writing its rows into `folder` (emptied first: what a crashed
    attempt left there is not this batch's); returns the files written, sorted."""
    shutil.rmtree(folder, ignore_errors=True)
    receipts = rows.mapInArrow(partial(write_task_file, folder), RECEIPT_SCHEMA).toArrow()
    return sorted(receipts.column("file").to_pylist())


def write_task_file(folder: str, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """A task's rows into one Parquet file (none for a task without rows); yields its receipt."""
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
