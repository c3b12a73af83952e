"""Arrow IPC files written by the Kafka source's tasks for an SQLite store (its executorWriter).

SQLite is one file with one writer on the driver's machine, so the tasks do not write into it:
each writes its records as an Arrow IPC file into a staging folder beside the database
(task_files.StagedFiles: a retried or replayed task replaces its file), and
SqliteSink.commit_staged ingests the batch's files, memory-mapped, in one transaction. The rows
cross neither into the JVM nor through Spark's collect to the driver.

Runs on executors: imports nothing of lagless but the source's types and task_files.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa

from lagless.secret import Secret
from lagless.sinks.task_files import FILE_SCHEMA, StagedFiles


def writer(config: Mapping[str, object], secret: Secret | None = None) -> StagedFiles:
    return StagedFiles(str(config["folder"]), ".arrow", _open)


def _open(path: str) -> pa.ipc.RecordBatchFileWriter:
    return pa.ipc.new_file(path, FILE_SCHEMA)


def read_files(paths: Sequence[str]) -> pa.RecordBatchReader:
    """The records of the files, memory-mapped, one batch at a time."""

    def batches() -> Iterator[pa.RecordBatch]:
        for path in paths:
            # Not closed here: a batch handed on may still point into the mapping.
            file = pa.ipc.open_file(pa.memory_map(path))
            for index in range(file.num_record_batches):
                yield file.get_batch(index)

    return pa.RecordBatchReader.from_batches(FILE_SCHEMA, batches())


def no_rows() -> pa.RecordBatchReader:
    """A batch whose tasks read no record: its ranges still go into the ledger."""
    return pa.RecordBatchReader.from_batches(FILE_SCHEMA, [])
