"""What the stores kept as files in a folder share: Parquet, Delta and Iceberg.

A folder on the driver's disk (`parquet:///dir`) or on S3 (`parquet+s3://bucket/prefix`,
sinks/s3.py), reached through one Storage (sinks/storage.py). The tasks stage a batch's files
under `<table>/_staging/<run>` (one folder per import: two imports may feed one table at once)
and the driver commits them; how it commits is each store's own.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from lagless.sinks import staged_parquet as staged
from lagless.sinks.base import Target, TaskWriter, TaskWrittenSink
from lagless.sinks.ledger import TP, HeldRecord
from lagless.sinks.s3 import S3Url, is_s3, parse_s3
from lagless.sinks.storage import LocalStorage, S3Storage, Storage
from lagless.sinks.task_files import Conform, stage_rows
from lagless.sinks.url import parse_local

if TYPE_CHECKING:
    import polars as pl
    from pyspark.sql import DataFrame, SparkSession

# The newest row of a partition is looked for first among the offsets this close below what
# the ledger holds (an append table's is just below it; files whose offsets all lie lower are
# not read), then, for a partition not found there (an upsert table's rows replaced), in all.
NEAR_THE_END = 10_000
HELD_RECORD_COLUMNS = ["topic", "partition", "offset", "timestamp", "key"]


class FolderTableSink(TaskWrittenSink):
    """A TaskWrittenSink whose tables are folders: the URL, the storage, and the staging the
    source's tasks write raw appends into. The rest of the lifecycle is the store's."""

    def __init__(self, url: str, location: str, s3: S3Url | None = None) -> None:
        super().__init__(url, location)
        self.s3 = s3
        self.storage: Storage = S3Storage(s3) if s3 else LocalStorage()

    @classmethod
    def from_url(cls, url: str) -> FolderTableSink:
        if is_s3(url):
            s3 = parse_s3(url, cls.scheme)
            return cls(url, s3.root, s3)
        return cls(url, os.path.abspath(parse_local(url, cls.scheme).path))

    @property
    def identity(self) -> str:
        return self.s3.shown if self.s3 else super().identity

    def driver_folder_for_tasks(self, target: Target, tasks_write: bool) -> str | None:
        """Tasks stage every batch's files under the table's folder: on the driver's disk
        unless the table is on S3."""
        return None if self.s3 else os.path.abspath(self.location)

    def executor_writer(self, target: Target, decoded: str | None = None) -> TaskWriter | None:
        """Appends: the source's tasks write the files into the target's staging folder, raw
        values as read, typed values from the source's `decoded` column (staged_parquet.py)."""
        if target.fields is not None and (decoded is None or target.mode != "append"):
            return None
        access = self.storage.task_access
        config, secret = staged.task_config(self._staging(target), access, target.fields, decoded)
        return TaskWriter(f"{staged.__name__}:{staged.writer.__name__}", config, secret)

    def discard_staged(self, target: Target) -> None:
        """Before a batch's tasks run: drop what a crashed attempt staged."""
        self.storage.remove_tree(self._staging(target))

    def tidy_staging(self, target: Target) -> None:
        """After a batch's commit: its staging folder goes, and `_staging` with it once no other
        import of the table stages there, so a clean run leaves only the table's own files."""
        staging = self._staging(target)
        self.storage.remove_tree(staging)
        if not self.s3:
            with contextlib.suppress(OSError):  # another import's folder is there
                os.rmdir(os.path.dirname(staging))

    def left_records(self, spark: SparkSession, files: list[str]) -> DataFrame:
        """The records the tasks left in `_left` files, read by Spark's tasks."""
        return staged.left_records(spark, files, self.storage.task_access)

    def stage_rows(self, rows: DataFrame, target: Target) -> list[str]:
        """Rows (the target's row_columns) written by Spark's tasks into files of the target's
        staging folder, where commit_staged takes them with the tasks' own."""
        folder = self.storage.join(self._staging(target), "_rows")
        access = self.storage.task_access
        return stage_rows(rows, folder, self.conform, clear=self.storage.remove_tree, s3=access)

    @property
    def conform(self) -> Conform | None:
        """What a task does to its rows' batches before they are written (Iceberg's types)."""
        return None

    def _staging(self, target: Target, table: str | None = None) -> str:
        # Absolute: a task on a standalone worker runs in a folder of its own.
        location = self.location if self.s3 else os.path.abspath(self.location)
        folder = self._table_folder(table or target.table)
        return self.storage.join(location, *folder, staged.STAGING, target.run_id)

    def _table_folder(self, table: str) -> tuple[str, ...]:
        """A table's folder under the location, as path parts."""
        return (table,)


def newest_rows_in(rows: pl.LazyFrame, held: Mapping[TP, int]) -> dict[TP, HeldRecord]:
    """Sink.newest_rows over a folder table's rows (HELD_RECORD_COLUMNS at least)."""
    found = _newest(rows, held, NEAR_THE_END)
    rest = {tp: top for tp, top in held.items() if tp not in found}
    return found | (_newest(rows, rest, None) if rest else {})


def _newest(rows: pl.LazyFrame, held: Mapping[TP, int], within: int | None) -> dict[TP, HeldRecord]:
    import polars as pl

    if not held:
        return {}
    wanted = pl.DataFrame(
        {
            "topic": [t for t, _ in held],
            "partition": [p for _, p in held],
            "_held": list(held.values()),
        },
        schema={"topic": pl.String, "partition": pl.Int64, "_held": pl.Int64},
    )
    rows = rows.select(HELD_RECORD_COLUMNS).with_columns(pl.col("partition").cast(pl.Int64))
    if within is not None:  # a bound the scan prunes files and row groups by
        rows = rows.filter(pl.col("offset") >= min(held.values()) - within)
    near = pl.col("offset") < pl.col("_held")
    if within is not None:
        near = near & (pl.col("offset") >= pl.col("_held") - within)
    newest = (
        rows.join(wanted.lazy(), on=["topic", "partition"])
        .filter(near)
        .group_by("topic", "partition")
        .agg(pl.all().sort_by("offset").last())
        .collect()
    )
    return {
        (topic, int(partition)): HeldRecord(int(offset), stamp, None if key is None else bytes(key))
        for topic, partition, offset, stamp, key in newest.select(HELD_RECORD_COLUMNS).iter_rows()
    }
