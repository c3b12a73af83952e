"""SQLite, the embedded default store, written from the driver: the file lives there.

Raw appends are read by the source's tasks into Arrow IPC files beside the database
(staged.py), typed appends the tasks decode into Parquet files (staged_parquet.py: the records
they do not decode go through Spark's rows, into Parquet files beside them), and the driver
ingests a batch's files in one transaction: no record the tasks wrote crosses into the JVM or
through a collect. That needs the executors to share the driver's filesystem (local mode, or
workers on the same machine); `?write_from=driver` brings every batch through Spark's rows
instead. Other batches (JSON text, upsert, dead letters) always come through Spark.

Two copies of SQLite live in this process: Python's sqlite3 module (the sink's small
statements: tables, ledger reads) and the one ADBC's driver bundles (a batch's rows). SQLite's
POSIX locks are the process's, and one copy does not see the other's: a sqlite3 reader opened
beside an ADBC transaction takes its journal for a crashed writer's, rolls it back, and the
commit fails with "disk I/O error" or leaves the file malformed
(https://sqlite.org/howtocorrupt.html, 2.2.1). `_ONE_COPY_AT_A_TIME` keeps the sink's two
uses apart, in any thread; a user's code must read the file from another process while an
import runs in theirs (docs/stores.md).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing, contextmanager, suppress
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lagless.cdc.key_change import UNKNOWN
from lagless.exceptions import BadInput, TerminalError
from lagless.failpoints import failpoint
from lagless.sinks import staged_parquet
from lagless.sinks.base import (
    ALREADY_HELD,
    DriverSink,
    Target,
    TaskWriter,
    TaskWrittenSink,
    Written,
    check_writable_path,
)
from lagless.sinks.ledger import TP, Batch, ConcurrentImport, HeldRecord, holds
from lagless.sinks.sql import (
    SETTLING_ROUNDS,
    Layout,
    Settling,
    awaiting_filled,
    by_partition,
    dead_letter_layout,
    evolve,
    held_offsets,
    held_records,
    insert,
    layouts,
    ledger_layout,
    log_times,
    moves_layout,
    record_ranges,
    skipped_offsets,
    target_layout,
    tombstone_layout,
    unknown_count,
    upsert,
)
from lagless.sinks.sqlite import staged
from lagless.sinks.task_files import stage_rows
from lagless.sinks.url import parse_local

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

STAGE = "lagless_stage"
# A reader of the file (a lag tool, a test) may hold it for a moment: wait rather than fail.
BUSY_TIMEOUT_MS = 30_000
# Held while either copy of SQLite has the file open (the module's docstring). No sink method
# opens one copy inside the other; reentrant, so that a later one cannot hang on it.
_ONE_COPY_AT_A_TIME = threading.RLock()


class SqliteSink(DriverSink, TaskWrittenSink):
    scheme = "sqlite"

    def __init__(self, url: str, location: str, write_from: str = "executors") -> None:
        super().__init__(url, location)
        self.write_from = write_from

    @classmethod
    def from_url(cls, url: str) -> SqliteSink:
        parsed = parse_local(url, cls.scheme, write_from=True)
        return cls(url, parsed.path, parsed.write_from)

    def check(self, target: Target) -> None:
        check_writable_path(self.location, "file", folder=False)
        check_writable_path(self._staging(target), "staging directory", folder=True)
        if os.path.exists(self.location):
            with self._connect() as conn:
                for layout in layouts(target, "sqlite"):
                    _evolution(conn, layout)

    def prepare(self, target: Target) -> None:
        # check() found the folder can be made; SQLite makes the file, not its folder.
        os.makedirs(os.path.dirname(os.path.abspath(self.location)), exist_ok=True)
        with self._connect() as conn, conn:
            for layout in layouts(target, "sqlite"):
                for statement in _evolution(conn, layout):
                    conn.execute(statement)

    def empty(self, target: Target) -> None:
        with self._connect() as conn, conn:
            conn.execute(f'DELETE FROM "{target.table}"')

    def table_types(self, target: Target) -> dict[str, DataType | None]:
        """Names only: SQLite's INTEGER, REAL and TEXT hold every widening already."""
        if not os.path.exists(self.location):
            return {}
        with self._connect() as conn:
            info = conn.execute(f'PRAGMA table_info("{target.table}")').fetchall()
        return {row[1]: None for row in info}

    def transported(self, name: str, data_type: DataType) -> Column:
        from pyspark.sql.types import DecimalType

        if isinstance(data_type, DecimalType):  # ADBC's SQLite driver takes no decimals
            return super().transported(name, data_type).cast("string").alias(name)
        return super().transported(name, data_type)

    def upsert_rows(self, rows: pa.Table, target: Target, batch: Batch) -> int | Written:
        """Decimals as text, as `transported` sends them."""
        for index, column in enumerate(rows.schema):
            if pa.types.is_decimal(column.type):
                rows = rows.set_column(index, column.name, rows.column(index).cast(pa.string()))
        return super().upsert_rows(rows, target, batch)

    without_shared_disk = "add ?write_from=driver to the sink URL"

    def driver_folder_for_tasks(self, target: Target, tasks_write: bool) -> str | None:
        """The tasks stage raw appends beside the database file, which the driver reads."""
        return self._staging(target) if tasks_write else None

    def executor_writer(self, target: Target, decoded: str | None = None) -> TaskWriter | None:
        """Appends: the source's tasks write raw values as Arrow files into the staging folder,
        typed values (from the source's column `decoded`) as Parquet files."""
        if self.write_from == "driver":
            return None
        if target.fields is not None:
            if decoded is None or target.mode != "append":
                return None
            config, _ = staged_parquet.task_config(
                self._staging(target), None, target.fields, decoded
            )
            name = f"{staged_parquet.__name__}:{staged_parquet.writer.__name__}"
            return TaskWriter(name, config)
        config = json.dumps({"folder": self._staging(target)})
        return TaskWriter(f"{staged.__name__}:{staged.writer.__name__}", config)

    def left_records(self, spark: SparkSession, files: list[str]) -> DataFrame:
        """The records the tasks left in `_left` files, read by Spark's tasks."""
        return staged_parquet.left_records(spark, files, None)

    def stage_rows(self, rows: DataFrame, target: Target) -> list[str]:
        """Rows Spark's tasks write into Parquet files of the staging folder, which
        commit_staged ingests with the tasks' own."""
        return stage_rows(rows, os.path.join(self._staging(target), "_rows"))

    def discard_staged(self, target: Target) -> None:
        """Before a batch's tasks run: drop what a crashed attempt of this import staged
        (another import's folder beside it is left alone: it may be staging now)."""
        staging = self._staging(target)
        shutil.rmtree(staging, ignore_errors=True)
        for folder in (os.path.dirname(staging), os.path.dirname(os.path.dirname(staging))):
            with suppress(OSError):  # not empty: another import or table is staging
                os.rmdir(folder)

    def commit_staged(self, files: list[str], target: Target, batch: Batch) -> Written:
        """After the tasks wrote the batch: its files into the table in one transaction (rows
        a replayed batch stored before are left as they are), then the files are dropped."""
        files = sorted(set(files))
        unseen = [path for path in files if not os.path.exists(path)]
        if unseen:
            raise TerminalError(
                f"the Spark tasks' files are not on the driver's filesystem ({unseen[0]}): "
                f"executors on other machines cannot stage for SQLite; add ?write_from=driver "
                "to the sink URL"
            )
        if target.fields is not None:  # typed: Parquet files (staged_parquet.py)
            rows = staged_parquet.read_files(files, target.fields.json())
        else:
            rows = staged.read_files(files) if files else staged.no_rows()
        written = self.write_arrow(rows, target, batch)
        self.discard_staged(target)
        return written if isinstance(written, Written) else Written(written)

    def _staging(self, target: Target) -> str:
        """`<db>-lagless-staging/<table>/<run>`: a folder per import (Target.run_id), so two
        imports into one table at once never drop each other's files."""
        # Absolute: a task on a standalone worker runs in a folder of its own.
        folder = os.path.abspath(f"{self.location}-lagless-staging")
        return os.path.join(folder, target.table, target.run_id)

    def ledger(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        return self._from_ledger(target, held_offsets)

    def log_times(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        return self._from_ledger(target, log_times) if target.mode == "upsert" else {}

    def skipped(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        return self._from_ledger(target, skipped_offsets, "skipped")

    def _from_ledger(
        self, target: Target, query: Callable[[Layout], str], column: str | None = None
    ) -> dict[TP, int]:
        """(topic, partition, a number) of each partition, by `query` of the ledger table;
        nothing where the ledger lacks `column` (an earlier lagless's)."""
        if not os.path.exists(self.location):
            return {}
        layout = ledger_layout(target, "sqlite")
        with self._connect() as conn:
            names = [row[1] for row in conn.execute(f'PRAGMA table_info("{layout.table}")')]
            if not names or (column is not None and column not in names):
                return {}  # no import into the table yet, or one by a lagless before the ledger
            found = conn.execute(query(layout)).fetchall()
        return by_partition(found)

    def unknown_rows(self, table: str) -> int | None:
        if not os.path.exists(self.location):
            return None
        with self._connect() as conn:
            names = [row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')]
            if UNKNOWN not in names:
                return None
            return int(conn.execute(unknown_count(table)).fetchone()[0])

    def newest_rows(self, target: Target, held: Mapping[TP, int]) -> dict[TP, HeldRecord]:
        if not held or not os.path.exists(self.location):
            return {}  # nothing held (and no file to open: its folder may not exist yet)
        with self._connect() as conn:
            return held_records(conn, target.table, held)

    def write_arrow(
        self, rows: pa.RecordBatchReader, target: Target, batch: Batch | None
    ) -> int | Written:
        """One transaction: the rows into a temporary table through ADBC (no Python object per
        cell: 600k rows/s against 100k with executemany), then one INSERT (three in upsert
        mode: tombstones delete, are remembered, then records are stored) and the batch's
        ranges into the ledger."""
        after: list[str] = []
        if batch is None:
            statements = [insert(dead_letter_layout(target, "sqlite"), f"temp.{STAGE}")]
        elif target.mode == "upsert":
            layout = target_layout(target, "sqlite")
            moves = moves_layout(target, "sqlite") if target.marks else None
            graves = tombstone_layout(target, "sqlite")
            statements = upsert(layout, graves, f"temp.{STAGE}", moves)
            after = awaiting_filled(layout, moves)
        else:
            statements = [insert(target_layout(target, "sqlite"), f"temp.{STAGE}")]
        recorded = record_ranges(ledger_layout(target, "sqlite"), batch) if batch else []
        # Here, not at the top: ADBC's DB-API loads pandas and polars (2 s on a busy machine),
        # which an import with nothing to write (up to date) never needs.
        import adbc_driver_sqlite.dbapi as adbc_sqlite

        with (
            _ONE_COPY_AT_A_TIME,
            closing(adbc_sqlite.connect(self.location)) as conn,
            closing(conn.cursor()) as cur,
        ):
            cur.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            cur.adbc_ingest(STAGE, rows, mode="create", temporary=True)
            failpoint("mid-write")
            with self._one_writer():
                for statement in statements:
                    _execute(cur, statement)
                # What the target gained or replaced: its own statement's changes, the last one
                # (an upsert's tombstones delete, and are remembered, before it).
                changed = _changes(cur)
                for statement in after:
                    _execute(cur, statement)
                # A replay: the unique key kept its rows out (changed is 0); said apart.
                replay = batch is not None and holds(batch, self._held(cur, target))
                for statement in recorded:
                    cur.execute(statement)
                cur.execute(f"DROP TABLE temp.{STAGE}")
                conn.commit()
        return ALREADY_HELD if replay else changed

    @staticmethod
    def _held(cur: Any, target: Target) -> dict[TP, int]:
        """The ledger as this transaction sees it (before the batch's ranges are recorded)."""
        cur.execute(held_offsets(ledger_layout(target, "sqlite")))
        return by_partition(cur.fetchall())

    @contextmanager
    def _one_writer(self) -> Iterator[None]:
        """One lagless import writes the database at a time. SQLite's own wait (busy_timeout)
        gives up at once when two transactions that read first both want to write (it would
        deadlock), which failed one of two imports into one file: writers queue on the flock
        of `<db>-lagless.lock` instead (the kernel drops it with a crashed holder), for as
        long as the import waits for a store that is away (retry_s); then ConcurrentImport
        (exit 75: a rerun resumes after what the table holds). The holder removes the file
        before it lets go, so none is left beside the database; a waiter that then holds the
        lock of a removed file tries again."""
        path = f"{self.location}-lagless.lock"
        deadline = time.monotonic() + self.retry_s
        while True:
            handle = open(path, "a")  # noqa: SIM115 - held past this block
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                if time.monotonic() > deadline:
                    raise ConcurrentImport(
                        f"SQLite file {self.location!r}: another import held it for "
                        f"{self.retry_s:.0f} s (--retry-seconds); rerun to resume after what "
                        "the table holds"
                    ) from None
                time.sleep(0.05)
                continue
            if _same_file(path, handle.fileno()):
                break
            handle.close()  # locked a file its holder removed meanwhile
        try:
            yield
        finally:
            os.remove(path)
            handle.close()  # lets go of the lock

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with _ONE_COPY_AT_A_TIME:
            try:
                conn = sqlite3.connect(self.location, timeout=BUSY_TIMEOUT_MS / 1000)
            except sqlite3.OperationalError as exc:
                raise BadInput(f"cannot open SQLite file {self.location!r}: {exc}") from None
            try:
                yield conn
            finally:
                conn.close()


def _execute(cur: Any, statement: str) -> None:
    """One statement; a Settling one again while it changes rows (sql.SETTLING_ROUNDS)."""
    for _ in range(SETTLING_ROUNDS if isinstance(statement, Settling) else 1):
        cur.execute(str(statement))  # ADBC takes a str, not a subclass
        if not isinstance(statement, Settling) or not _changes(cur):
            return


def _changes(cur: Any) -> int:
    """The rows the last statement changed."""
    cur.execute("SELECT changes()")
    return int(cur.fetchone()[0])


def _same_file(path: str, descriptor: int) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(descriptor).st_ino
    except FileNotFoundError:
        return False


def _evolution(conn: sqlite3.Connection, layout: Layout) -> list[str]:
    """What brings the table to layout (sql.evolve): BadInput when nothing can."""
    try:
        info = conn.execute(f'PRAGMA table_info("{layout.table}")').fetchall()
    except sqlite3.DatabaseError as exc:
        raise BadInput(f"sink file is not an SQLite database: {exc}") from None
    keyed = tuple(row[1] for row in sorted(info, key=lambda r: r[5]) if row[5])
    return evolve(layout, [(row[1], row[2]) for row in info], keyed)
