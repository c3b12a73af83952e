"""The SQLite sink's two copies of SQLite in one process (sqlite3's and ADBC's): a batch's
commit beside the sink's own sqlite3 reads, in another thread. Without the sink's lock, a read
opened during the commit took its journal for a crashed writer's and rolled it back: the commit
failed with "disk I/O error", or the file was left malformed (seen within a second here)."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pyarrow as pa

from lagless.sinks import Target
from lagless.sinks.ledger import Batch
from lagless.sinks.sqlite import SqliteSink
from lagless.sinks.task_files import FILE_SCHEMA

SECONDS = 3.0
ROWS = 2_000


def test_commits_beside_ledger_reads_in_another_thread_keep_the_file_whole(
    tmp_path: Path,
) -> None:
    sink = SqliteSink.from_url(f"sqlite:///{tmp_path / 'out.db'}")
    target = Target("events", "append", "raw")
    sink.check(target)
    sink.prepare(target)
    partitions = [("events", 0)]
    stop = threading.Event()
    failures: list[BaseException] = []
    commits: list[int] = []
    reads: list[int] = []

    def commit_batches() -> None:
        start = 0
        try:
            while not stop.is_set():
                batch = Batch(len(commits), {("events", 0): (start, start + ROWS)})
                sink.write_arrow(rows(start).to_reader(), target, batch)
                commits.append(start)
                start += ROWS
        except BaseException as exc:
            failures.append(exc)

    def read_the_ledger() -> None:
        try:
            while not stop.is_set():
                reads.append(sum(sink.ledger(target, partitions).values()))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=commit_batches), threading.Thread(target=read_the_ledger)]
    for thread in threads:
        thread.start()
    time.sleep(SECONDS)
    stop.set()
    for thread in threads:
        thread.join(60)

    assert failures == []
    assert len(commits) > 1 and len(reads) > 1
    with sqlite3.connect(tmp_path / "out.db") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        stored = conn.execute('SELECT count(*) FROM "events"').fetchone()[0]
    assert stored == len(commits) * ROWS
    assert reads == sorted(reads)  # the ledger only grows


def rows(start: int) -> pa.Table:
    """A batch's records, as the source's tasks stage them."""
    offsets = list(range(start, start + ROWS))
    return pa.table(
        {
            "topic": ["events"] * ROWS,
            "partition": [0] * ROWS,
            "offset": offsets,
            "key": [b"k"] * ROWS,
            "value": [b"v" * 50] * ROWS,
            "timestamp": offsets,
        },
        schema=FILE_SCHEMA,
    )
