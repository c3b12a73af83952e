"""Parquet files written by the Kafka source's tasks themselves (its executorWriter option),
for the stores kept as folders (folder_table.py: Parquet, Delta, Iceberg).

A task writes one file for its pieces into `<table>/_staging` (task_files.StagedFiles): a
retried or replayed task replaces it with the same records. Nothing under `_staging` is visible
to readers (pyarrow and Spark skip names that start with `_`); each store's commit_staged takes
a batch's files into its table at once.

Runs on executors: imports nothing of lagless but the source's types and task_files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pyarrow.parquet as pq

from lagless.secret import Secret
from lagless.sinks.s3 import S3Access
from lagless.sinks.task_files import FILE_SCHEMA, NO_DICTIONARY, StagedFiles

STAGING = "_staging"


def writer(config: Mapping[str, Any], secret: Secret | None = None) -> StagedFiles:
    """config: the staging "folder" (a local path, or s3://bucket/key with "s3", the access
    S3Access.to_task gave, and its secret)."""
    s3 = S3Access.from_task(config["s3"], secret) if config.get("s3") else None
    return StagedFiles(str(config["folder"]), ".parquet", _open, s3)


def task_config(folder: str, s3: S3Access | None) -> tuple[str, Secret | None]:
    """The JSON config and secret of `writer` for a staging folder."""
    if s3 is None:
        return json.dumps({"folder": folder}), None
    access, secret = s3.to_task()
    return json.dumps({"folder": folder, "s3": access}), secret


def _open(where: Any) -> pq.ParquetWriter:
    return pq.ParquetWriter(
        where,
        FILE_SCHEMA,
        use_dictionary=[n for n in FILE_SCHEMA.names if n not in NO_DICTIONARY],
        compression="snappy",
    )
