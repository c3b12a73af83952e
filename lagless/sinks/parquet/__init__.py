"""Parquet files, written by the executors.

Each micro-batch goes to its own folder `<dir>/<table>/batch=<id>`, overwritten whole when a
batch is replayed: a batch's offsets are fixed in the checkpoint before it runs, so a replay
writes the same rows again instead of adding them twice.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from lagless.exceptions import BadInput
from lagless.sinks import local_path
from lagless.sinks.base import COLUMNS, Sink, Target, check_writable_path

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class ParquetSink(Sink):
    scheme = "parquet"
    on_driver = False

    @classmethod
    def from_url(cls, url: str) -> ParquetSink:
        return cls(url, os.path.abspath(local_path(url, cls.scheme)))

    def table_dir(self, target: Target) -> str:
        return os.path.join(self.location, target.table)

    def check(self, target: Target) -> None:
        if target.mode != "append":
            raise BadInput(
                "the parquet sink supports --write append only; use sqlite or postgresql to upsert"
            )
        check_writable_path(self.location, "directory")

    def prepare(self, target: Target) -> None:
        os.makedirs(self.table_dir(target), exist_ok=True)

    def write(self, rows: DataFrame, target: Target, batch_id: int) -> int:
        folder = os.path.join(self.table_dir(target), f"batch={batch_id}")
        rows.select(*COLUMNS).write.mode("overwrite").parquet(folder)
        return rows.count()
