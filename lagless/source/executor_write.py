"""Writing records where they are read: a task hands its Arrow batches straight to a store.

On the usual path a task's records cross into the JVM as rows (Arrow to UnsafeRow) and a Spark
writer encodes them again; on two cores that JVM work took three times the CPU of reading the
records in Python. With the `executorWriter` option the source's task writes its batches itself
through the named writer (into a file, or a store's table) and hands Spark only a receipt per
piece (RANGE_RECEIPT_SCHEMA): the driver then makes the batch visible
(TaskWrittenSink.commit_staged). Offsets are still planned and journaled by Spark as before, so
exactly-once holds as long as the writer's output for a task depends only on the task's pieces
(a retried or replayed task replaces it, or finds it there) and readers see either none of a
batch before the driver's commit or rows a replay cannot double.

A writer may leave records to Spark's rows (typed values it cannot decode as Spark would: the
driver decides them as importer/rows.py does, and commits them with the task's own): it writes
them, as read, into a file the receipt names (`left`).

The writer is named as "module:function" (the source never imports a store, as Spark's sources
name classes in options); function(config, secret) returns an ExecutorWriter. The secret (a
store's password) comes in an option of its own, whose name Spark redacts wherever it shows
options.

A routed import (many topics, a table each) names `routed` (ROUTED_WRITER): its config maps each
topic to its table's writer and config, and the source then plans every task's pieces of one
topic (oneTopicPerTask), so a task writes into one table.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

import numpy as np
import pyarrow as pa

from lagless.exceptions import BadInput, TerminalError
from lagless.planner.ranges import OffsetRange
from lagless.secret import Secret

RANGE_RECEIPT_SCHEMA = (
    "file string, left string, topic string, partition int, start long, end long, "
    "records long, bytes long"
)
RANGE_RECEIPT_ARROW_SCHEMA = pa.schema(
    [
        ("file", pa.string()),
        ("left", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("start", pa.int64()),
        ("end", pa.int64()),
        ("records", pa.int64()),
        ("bytes", pa.int64()),
    ]
)


class ExecutorWriter(Protocol):
    def write(
        self, pieces: Sequence[OffsetRange], batches: Iterator[pa.RecordBatch]
    ) -> tuple[str, str | None]:
        """Store every batch (a task's records, in source.schema.ARROW_SCHEMA) for the task of
        these pieces; returns where they went, as the receipts name it, and the file of those
        it left to Spark's rows (None: it wrote them all). Runs again for the same pieces when
        a task is retried or a batch replayed: the outcome must be the same."""
        ...


# Every writer the source's tasks may run, by the "module:function" a TaskWriter names it: the
# stores' and the mirror's (the source may not import them: tests/unit/test_layering.py, which
# also checks that each of these names a function of an executor-side module). A name not
# here is refused: an option of the source never imports arbitrary code.
TASK_WRITERS = frozenset(
    {
        "lagless.sinks.staged_parquet:writer",  # Parquet, Delta, Iceberg; SQLite's typed values
        "lagless.sinks.sqlite.staged:writer",  # SQLite's raw values
        "lagless.sinks.postgresql.task_copy:writer",  # PostgreSQL's COPY from the tasks
        "lagless.importer.change_files:writer",  # a mirror's change files
        f"{__name__}:routed",  # a routed import's: each topic's table's writer
    }
)


def load_writer(spec: str, config: str, secret: Secret | None = None) -> ExecutorWriter:
    """The writer "module:function" names (one of TASK_WRITERS), built from its JSON config
    and its secret."""
    if spec not in TASK_WRITERS:
        raise BadInput(f"option executorWriter {spec!r} is none of lagless's task writers")
    module, _, function = spec.partition(":")
    try:
        factory: Callable[[dict[str, object], Secret | None], ExecutorWriter] = getattr(
            importlib.import_module(module), function
        )
        return factory(json.loads(config or "{}"), secret)
    except (ImportError, AttributeError, ValueError) as exc:
        raise BadInput(f"option executorWriter {spec!r} cannot be loaded: {exc}") from None


ROUTED_WRITER = f"{__name__}:routed"


class RoutedWriter:
    """The writer of the table a task's topic is routed to."""

    def __init__(self, routes: dict[str, list[str]], secret: Secret | None) -> None:
        self.routes = routes
        self.secret = secret

    def write(
        self, pieces: Sequence[OffsetRange], batches: Iterator[pa.RecordBatch]
    ) -> tuple[str, str | None]:
        topics = sorted({piece.topic for piece in pieces})
        if len(topics) != 1:
            raise TerminalError(f"a routed task read topics {topics}: one table each")
        route = self.routes.get(topics[0])
        if route is None:  # the driver prepares a topic's table before its first batch runs
            raise TerminalError(f"topic {topics[0]!r} has no table in this import's routes")
        name, config = route
        return load_writer(name, config, self.secret).write(pieces, batches)


def routed(config: Mapping[str, object], secret: Secret | None = None) -> RoutedWriter:
    routes = config["routes"]
    assert isinstance(routes, dict)
    return RoutedWriter(routes, secret)


def write_task(
    writer: ExecutorWriter,
    pieces: Sequence[OffsetRange],
    read: Callable[
        [Sequence[OffsetRange], Callable[[pa.RecordBatch], None]], Iterable[pa.RecordBatch]
    ],
) -> Iterator[pa.RecordBatch]:
    """Read the pieces into the writer; yield one receipt row per piece. `read` calls back
    with each batch as read (of one piece), before it gathers them."""
    counted = [[0, 0] for _ in pieces]
    piece_of = _PieceOf(pieces)

    def count(batch: pa.RecordBatch) -> None:
        if batch.num_rows:
            counts = counted[piece_of(batch)]
            counts[0] += batch.num_rows
            counts[1] += _payload_bytes(batch)

    written = writer.write(pieces, iter(read(pieces, count)))
    rows = [
        (*written, *_where(piece), records, size)
        for piece, (records, size) in zip(pieces, counted, strict=True)
    ]
    yield pa.RecordBatch.from_pylist(
        [dict(zip(RANGE_RECEIPT_ARROW_SCHEMA.names, row, strict=True)) for row in rows],
        schema=RANGE_RECEIPT_ARROW_SCHEMA,
    )


class _PieceOf:
    """Which of a task's pieces a batch is of: the piece of its partition that holds its first
    offset (the first such, should a task's pieces overlap)."""

    def __init__(self, pieces: Sequence[OffsetRange]) -> None:
        self._by_partition: dict[tuple[str, int], list[tuple[int, OffsetRange]]] = {}
        for index, piece in enumerate(pieces):
            self._by_partition.setdefault(piece.key, []).append((index, piece))

    def __call__(self, batch: pa.RecordBatch) -> int:
        topic = batch.column("topic")[0].as_py()
        partition = batch.column("partition")[0].as_py()
        offset = batch.column("offset")[0].as_py()
        mine = self._by_partition.get((topic, partition), [])
        for index, piece in mine:
            if piece.start <= offset < piece.end:
                return index
        raise TerminalError(f"{topic}[{partition}] offset {offset} is in none of the task's ranges")


def _where(piece: OffsetRange) -> tuple[str, int, int, int]:
    return piece.topic, piece.partition, piece.start, piece.end


def _payload_bytes(batch: pa.RecordBatch) -> int:
    """Key plus value bytes, as the summary counts them: from each binary column's offsets
    (a null is empty), ~4 µs a batch where summing the lengths' compute took ~17."""
    total = 0
    for column in ("key", "value"):
        array = batch.column(column)
        if len(array):
            offsets = np.frombuffer(array.buffers()[1], np.int32)
            total += int(offsets[array.offset + len(array)] - offsets[array.offset])
    return total
