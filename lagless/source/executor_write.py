"""Writing records where they are read: a task hands its Arrow batches straight to a store.

On the usual path a task's records cross into the JVM as rows (Arrow to UnsafeRow) and a Spark
writer encodes them again; on two cores that JVM work took three times the CPU of reading the
records in Python. With the `executorWriter` option the source's task writes its batches itself
through the named writer and hands Spark only a receipt per piece (RECEIPT_SCHEMA): the driver
then makes the batch's files visible in one step. Offsets are still planned and journaled by
Spark as before, so exactly-once holds as long as the writer's output for a task depends only on
the task's pieces (a retried or replayed task replaces it) and nothing is visible before the
driver's commit.

The writer is named as "module:function" (the source never imports a store, as Spark's sources
name classes in options); function(config) returns an ExecutorWriter.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from lagless.exceptions import BadInput
from lagless.planner.ranges import OffsetRange

RECEIPT_SCHEMA = (
    "file string, topic string, partition int, start long, end long, records long, bytes long"
)
RECEIPT_ARROW_SCHEMA = pa.schema(
    [
        ("file", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("start", pa.int64()),
        ("end", pa.int64()),
        ("records", pa.int64()),
        ("bytes", pa.int64()),
    ]
)


class TaskFile(Protocol):
    """Where one task's records go; `path` names it in the receipts."""

    path: str

    def write(self, batch: pa.RecordBatch) -> None: ...


class ExecutorWriter(Protocol):
    def task_file(self, pieces: Sequence[OffsetRange]) -> AbstractContextManager[TaskFile]:
        """The file for a task of these pieces: the same pieces always give the same path."""
        ...


def load_writer(spec: str, config: str) -> ExecutorWriter:
    """The writer "module:function" names, built from its JSON config."""
    module, _, function = spec.partition(":")
    try:
        factory: Callable[[dict[str, object]], ExecutorWriter] = getattr(
            importlib.import_module(module), function
        )
        return factory(json.loads(config or "{}"))
    except (ImportError, AttributeError, ValueError) as exc:
        raise BadInput(f"option executorWriter {spec!r} cannot be loaded: {exc}") from None


def write_task(
    writer: ExecutorWriter,
    pieces: Sequence[OffsetRange],
    read_piece: Callable[[OffsetRange], Iterable[pa.RecordBatch]],
) -> Iterator[pa.RecordBatch]:
    """Read each piece into the task's file; yield one receipt row per piece."""
    rows: list[tuple[str, str, int, int, int, int, int]] = []
    with writer.task_file(pieces) as out:
        for piece in pieces:
            records = size = 0
            for batch in read_piece(piece):
                out.write(batch)
                records += batch.num_rows
                size += _payload_bytes(batch)
            rows.append((out.path, *_where(piece), records, size))
    yield pa.RecordBatch.from_pylist(
        [dict(zip(RECEIPT_ARROW_SCHEMA.names, row, strict=True)) for row in rows],
        schema=RECEIPT_ARROW_SCHEMA,
    )


def _where(piece: OffsetRange) -> tuple[str, int, int, int]:
    return piece.topic, piece.partition, piece.start, piece.end


def _payload_bytes(batch: pa.RecordBatch) -> int:
    """Key plus value bytes, as the summary counts them."""
    total = 0
    for column in ("key", "value"):
        lengths = pc.sum(pc.binary_length(batch.column(column)))
        total += lengths.as_py() or 0
    return total
