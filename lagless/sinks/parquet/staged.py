"""Parquet files written by the Kafka source's tasks themselves (its executorWriter option).

A task writes one file for its pieces into `<table>/_staging` (task_files.StagedFiles): a
retried or replayed task replaces it with the same records. Nothing under `_staging` is visible
to readers (pyarrow and Spark skip names that start with `_`); ParquetSink.commit_staged moves
a batch's files into `batch=<digest>` at once.

Runs on executors: imports nothing of lagless but the source's types and task_files.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow.parquet as pq

from lagless.secret import Secret
from lagless.sinks.task_files import FILE_SCHEMA, NO_DICTIONARY, StagedFiles

STAGING = "_staging"


def writer(config: Mapping[str, object], secret: Secret | None = None) -> StagedFiles:
    return StagedFiles(str(config["folder"]), ".parquet", _open)


def _open(path: str) -> pq.ParquetWriter:
    return pq.ParquetWriter(
        path,
        FILE_SCHEMA,
        use_dictionary=[n for n in FILE_SCHEMA.names if n not in NO_DICTIONARY],
        compression="snappy",
    )
