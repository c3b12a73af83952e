"""SQLite's staged path: Arrow files the source's tasks write, ingested by the driver in one
transaction. Real files and a real SQLite database; no Spark (the receipts are built here as
source/executor_write.py builds them)."""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest

from lagless.exceptions import BadInput, TerminalError
from lagless.planner.ranges import OffsetRange
from lagless.sinks import Target, sink_from_url
from lagless.sinks.base import ALREADY_HELD, Written
from lagless.sinks.ledger import Batch, ConcurrentImport
from lagless.sinks.sqlite import SqliteSink
from lagless.sinks.task_files import FILE_SCHEMA, StagedFiles
from lagless.source.executor_write import write_task
from lagless.source.schema import ARROW_SCHEMA

Seen = Callable[[pa.RecordBatch], None]

TARGET = Target("t", "append", "raw")


def read(pieces: Sequence[OffsetRange], each: Seen) -> list[pa.RecordBatch]:
    """A task's records as the source reads them: its pieces' batches, each seen as read."""
    batches = [batch for piece in pieces for batch in records(piece)]
    for batch in batches:
        each(batch)
    return batches


def records(piece: OffsetRange) -> list[pa.RecordBatch]:
    """The piece's records in the source's columns, in two batches."""
    offsets = list(range(piece.start, piece.end))
    rows = [
        {
            "key": f"k{o}".encode(),
            "value": f"v{o}".encode(),
            "topic": piece.topic,
            "partition": piece.partition,
            "offset": o,
            "timestamp": datetime.fromtimestamp(1_700_000_000 + o, UTC),
            "timestampType": 0,
            "headers": None,
        }
        for o in offsets
    ]
    half = len(rows) // 2
    return [pa.RecordBatch.from_pylist(part, ARROW_SCHEMA) for part in (rows[:half], rows[half:])]


def run_tasks(sink: SqliteSink, tasks: list[list[OffsetRange]]) -> list[str]:
    """What the source's tasks do with the sink's executor writer; the files their receipts
    name."""
    from lagless.source.executor_write import load_writer

    spec = sink.executor_writer(TARGET)
    assert spec is not None
    writer = load_writer(spec.name, spec.config, spec.secret)
    receipts = pa.Table.from_batches(
        [receipt for pieces in tasks for receipt in write_task(writer, pieces, read)]
    )
    assert receipts.column("left").null_count == len(receipts)  # raw values: none left
    return receipts.column("file").to_pylist()


def stored(path: Path) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(
            'SELECT topic, "partition", "offset", key, value, "timestamp" FROM t ORDER BY 2, 3'
        ).fetchall()


def test_a_batch_staged_by_the_tasks_lands_once_even_when_replayed(tmp_path: Path) -> None:
    path = tmp_path / "out.db"
    sink = SqliteSink.from_url(f"sqlite:///{path}")
    sink.prepare(TARGET)
    tasks = [[OffsetRange("t", 0, 0, 5), OffsetRange("t", 1, 3, 7)], [OffsetRange("t", 0, 5, 9)]]

    batch = Batch(0, {("t", 0): (0, 9), ("t", 1): (3, 7)})

    sink.discard_staged(TARGET)
    assert sink.commit_staged(run_tasks(sink, tasks), TARGET, batch) == Written(13)
    first = stored(path)
    # A replay (crash after the write, before Spark's commit), split into other tasks: told
    # apart (issue 31.5), nothing written.
    sink.discard_staged(TARGET)
    again = run_tasks(sink, [[p] for pieces in tasks for p in pieces])
    assert sink.commit_staged(again, TARGET, batch) == ALREADY_HELD

    expected = sorted(
        ("t", p.partition, o, f"k{o}".encode(), f"v{o}".encode(), (1_700_000_000 + o) * 1000)
        for pieces in tasks
        for p in pieces
        for o in range(p.start, p.end)
    )
    assert first == stored(path) == sorted(expected, key=lambda row: (row[1], row[2]))
    assert [p.name for p in tmp_path.iterdir()] == ["out.db"]  # the staged files went


def test_files_the_driver_cannot_see_fail_the_batch_naming_the_way_out(tmp_path: Path) -> None:
    """Executors on other machines wrote the files on theirs: the batch fails (Spark replays
    it on the rerun), the table untouched."""
    path = tmp_path / "out.db"
    sink = SqliteSink.from_url(f"sqlite:///{path}")
    sink.prepare(TARGET)
    receipts = run_tasks(sink, [[OffsetRange("t", 0, 0, 4)]])
    for staged_file in tmp_path.rglob("*.arrow"):
        staged_file.unlink()

    with pytest.raises(TerminalError, match=r"\?write_from=driver"):
        sink.commit_staged(receipts, TARGET, 0)
    assert stored(path) == []


def test_write_from_driver_takes_rows_through_spark() -> None:
    sink = sink_from_url("sqlite:///x.db?write_from=driver")
    assert isinstance(sink, SqliteSink) and sink.location == "x.db"
    assert sink.executor_writer(TARGET) is None
    writer = sink_from_url("sqlite:///x.db").executor_writer(TARGET)
    assert writer is not None and writer.secret is None


def test_an_unknown_query_parameter_is_bad_input() -> None:
    with pytest.raises(BadInput, match=r"write_from=executors\|driver"):
        sink_from_url("sqlite:///x.db?write_from=nowhere")
    with pytest.raises(BadInput, match=r"write_from=executors\|driver"):
        sink_from_url("sqlite:///x.db?journal=wal")


def test_a_task_that_fails_mid_file_leaves_no_file(tmp_path: Path) -> None:
    """A task killed by an error while writing leaves neither its file nor a partial one, so
    the driver cannot ingest half a task."""
    staged = StagedFiles(str(tmp_path), ".arrow", lambda p: pa.ipc.new_file(p, FILE_SCHEMA))

    def failing(pieces: Sequence[OffsetRange], each: Seen) -> Iterator[pa.RecordBatch]:
        each(first := records(pieces[0])[0])
        yield first
        raise RuntimeError("broker gone")

    with pytest.raises(RuntimeError, match="broker gone"):
        list(write_task(staged, [OffsetRange("t", 0, 0, 6)], failing))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["sqlite:///out.db", "parquet:///lake", "delta:///lake"])
def test_tasks_get_an_absolute_staging_folder_for_a_relative_sink_path(url: str) -> None:
    """A task on a standalone worker runs in a folder of its own: a relative folder would
    stage the files where the driver never looks."""
    writer = sink_from_url(url).executor_writer(TARGET)
    assert writer is not None
    folder = json.loads(writer.config)["folder"]
    assert os.path.isabs(folder) and folder.startswith(os.getcwd())


def test_each_import_stages_in_a_folder_of_its_own(tmp_path: Path) -> None:
    """Two imports into one table at once: one discarding what it staged leaves the other's."""
    sink = SqliteSink.from_url(f"sqlite:///{tmp_path}/d.db")
    a, b = (replace(TARGET, run_id=run) for run in ("import-a", "import-b"))
    writers = [sink.executor_writer(target) for target in (a, b)]
    folders = [json.loads(writer.config)["folder"] for writer in writers if writer is not None]
    assert folders == [f"{tmp_path}/d.db-lagless-staging/{TARGET.table}/import-{x}" for x in "ab"]
    for folder in folders:
        os.makedirs(folder)
        Path(folder, "piece.arrow").write_bytes(b"staged")
    sink.discard_staged(a)
    assert not os.path.exists(folders[0]) and os.listdir(folders[1]) == ["piece.arrow"]
    sink.discard_staged(b)
    assert not os.path.exists(f"{tmp_path}/d.db-lagless-staging")


def test_a_commit_waits_for_another_imports_then_is_transient(tmp_path: Path) -> None:
    """Commits into one database queue on its lock file; one that waited past the retry
    budget is ConcurrentImport (exit 75), nothing written."""
    sink = SqliteSink.from_url(f"sqlite:///{tmp_path}/d.db")
    sink.prepare(TARGET)
    sink.retry_s = 0.3
    batch = Batch(0, {("t", 0): (0, 3)})
    rows = pa.table(
        {
            "topic": ["t"] * 3,
            "partition": [0] * 3,
            "offset": [0, 1, 2],
            "key": [b"k"] * 3,
            "value": [b"v"] * 3,
            "timestamp": [1, 2, 3],
        },
        schema=FILE_SCHEMA,
    )
    with open(f"{tmp_path}/d.db-lagless.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another import's commit
        with pytest.raises(ConcurrentImport, match="another import held it for 0 s"):
            sink.write_arrow(rows.to_reader(), TARGET, batch)
    assert sink.ledger(TARGET, [("t", 0)]) == {}
    sink.write_arrow(rows.to_reader(), TARGET, batch)
    assert sink.ledger(TARGET, [("t", 0)]) == {("t", 0): 3}


def test_receipts_count_each_piece_whatever_order_its_batches_come_in(tmp_path: Path) -> None:
    """A task reads its pieces at once (source/reader.py): batches of its pieces interleave,
    and each piece's receipt counts its own records."""
    staged = StagedFiles(str(tmp_path), ".arrow", lambda p: pa.ipc.new_file(p, FILE_SCHEMA))
    pieces = [OffsetRange("t", 0, 0, 6), OffsetRange("t", 1, 3, 5), OffsetRange("t", 0, 6, 9)]

    def interleaved(asked: Sequence[OffsetRange], each: Seen) -> Iterator[pa.RecordBatch]:
        first, second, third = (records(piece) for piece in asked)
        for batch in (first[0], second[0], third[0], first[1], third[1], second[1]):
            each(batch)
            yield batch

    (receipt,) = write_task(staged, pieces, interleaved)

    assert receipt["partition"].to_pylist() == [0, 1, 0]
    assert receipt["records"].to_pylist() == [6, 2, 3]
    assert receipt["bytes"].to_pylist() == [payload(records(piece)) for piece in pieces]


def payload(batches: list[pa.RecordBatch]) -> int:
    return sum(len(v or b"") for b in batches for c in ("key", "value") for v in b[c].to_pylist())
