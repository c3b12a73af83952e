"""PostgreSQL, written from the executors. Raw appends are COPYed into the table by the
source's tasks that read them (task_copy.py). Other rows: each Spark task streams its rows
into a staging table of the batch (task_ingest.py), then the driver merges the batch in one
transaction with the INSERT ... ON CONFLICT that a replay cannot double, and drops the staging
table. The driver never holds a batch's rows; dead letters (rare, few) still come to it as one
Arrow table. The password never appears in a message.

`?write_from=driver` on the URL brings each batch to the driver as one Arrow table instead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from lagless.cdc.key_change import MOVE_ONLY, UNKNOWN
from lagless.exceptions import BadInput, TransientError, from_spark
from lagless.failpoints import failpoint
from lagless.first_line import first_line
from lagless.retry import retried
from lagless.secret import Secret
from lagless.sinks.base import (
    ALREADY_HELD,
    DriverSink,
    Sink,
    Target,
    TaskWriter,
    TaskWrittenSink,
    Written,
)
from lagless.sinks.ledger import TP, Batch, HeldRecord, holds
from lagless.sinks.postgresql import task_copy
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
    quoted,
    record_ranges,
    skipped_offsets,
    spark_type,
    target_layout,
    tombstone_layout,
    unknown_count,
    upsert,
)
from lagless.sinks.task_ingest import INGEST_RECEIPT_SCHEMA, ingest_task_rows
from lagless.sinks.upsert_order import newest_first_sql
from lagless.sinks.url import SinkUrl, parse_server

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType

try:
    import adbc_driver_postgresql.dbapi as adbc_pg
    import psycopg
except ImportError:  # pragma: no cover - depends on the installation
    psycopg = None  # type: ignore[assignment]

STAGE = "lagless_stage"
TASK_APPLICATION = "lagless-task"
# A row's place among its key's rows of a batch, newest first (_statements).
_RANK = "_lagless_rank"
# PostgreSQL cuts longer names, which could make two staging tables one.
MAX_NAME = 63

T = TypeVar("T")

CONNECT_TIMEOUT_S = 10


class PostgresSink(DriverSink, TaskWrittenSink):
    scheme = "postgresql"
    # The tasks stream the rows to the server: a batch's size does not weigh on the driver.
    max_batch_bytes: int = Sink.max_batch_bytes

    def __init__(self, address: SinkUrl) -> None:
        super().__init__(address.shown, address.shown)
        self._address = address
        self.write_from = address.write_from
        if self.write_from == "driver":
            self.max_batch_bytes = DriverSink.max_batch_bytes

    @classmethod
    def from_url(cls, url: str) -> PostgresSink:
        if psycopg is None:
            raise BadInput("the postgresql sink needs psycopg: pip install 'lagless[postgresql]'")
        return cls(parse_server(url, write_from=True))

    @property
    def identity(self) -> str:
        address = self._address
        user = f"{address.user}@" if address.user else ""
        return f"{self.scheme}://{user}{address.host}:{address.port or 5432}/{address.path}"

    def _connect(self) -> Any:
        address = self._address
        info: dict[str, Any] = {
            "host": address.host,
            "port": address.port or 5432,
            "dbname": address.path,
            "connect_timeout": CONNECT_TIMEOUT_S,
        }
        if address.user:
            info["user"] = address.user
        if address.password is not None:
            info["password"] = address.password.reveal()
        try:
            return psycopg.connect(**info)
        except psycopg.OperationalError as exc:
            raise TransientError(f"cannot connect to {self.url}: {first_line(exc)}") from None

    def check(self, target: Target) -> None:
        try:
            with self._connect() as conn:
                for layout in layouts(target, "postgresql"):
                    _evolution(conn, layout)
        except TransientError as exc:
            raise BadInput(str(exc)) from None

    def prepare(self, target: Target) -> None:
        def attempt() -> None:
            with self._connect() as conn:
                for layout in layouts(target, "postgresql"):
                    for statement in _evolution(conn, layout):
                        conn.execute(statement)

        self._retried(attempt)

    def empty(self, target: Target) -> None:
        def attempt() -> None:
            with self._connect() as conn:
                conn.execute(f"DELETE FROM {quoted(target.table)}")

        self._retried(attempt)

    def table_types(self, target: Target) -> dict[str, DataType | None]:
        with self._connect() as conn:
            found = conn.execute(
                "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
                "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped "
                "ORDER BY a.attnum",
                (quoted(target.table),),
            ).fetchall()
        return {name: spark_type(kind.lower()) for name, kind in found}

    def executor_writer(self, target: Target, decoded: str | None = None) -> TaskWriter | None:
        """Raw appends: the source's tasks COPY the records they read into the table."""
        table = _copies_into(target)
        if self.write_from == "driver" or table is None:
            return None
        merge = insert(target_layout(target, "postgresql"), task_copy.TASK_STAGE)
        config = json.dumps({"table": table, "merge": merge})
        name = f"{task_copy.__name__}:{task_copy.writer.__name__}"
        return TaskWriter(name, config, Secret(self._arrow_uri(TASK_APPLICATION)))

    def discard_staged(self, target: Target) -> None:
        """Nothing is staged: each task's COPY commits all of its records or none."""

    def run_tasks(self, receipts: DataFrame) -> pa.Table:
        """The tasks again, all of them, while the server is away (up to the retry budget): a task
        that wrote before finds its records there and adds none twice."""

        def attempt() -> pa.Table:
            try:
                return receipts.toArrow()
            except Exception as exc:  # Spark's error, with the task's error marked in its text
                carried = from_spark(exc)
                if isinstance(carried, TransientError):
                    raise carried from None
                raise

        return self._retried(attempt)

    def ledger(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        return self._from_ledger(target, held_offsets)

    def log_times(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        return self._from_ledger(target, log_times) if target.mode == "upsert" else {}

    def skipped(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        return self._from_ledger(target, skipped_offsets, "skipped")

    def _from_ledger(
        self, target: Target, query: Callable[[Layout], str], column: str = "end_offset"
    ) -> dict[TP, int]:
        """(topic, partition, a number) of each partition, by `query` of the ledger table;
        nothing where the ledger lacks `column` (an earlier lagless's)."""
        layout = ledger_layout(target, "postgresql")
        with self._connect() as conn:
            if not conn.execute(
                "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = %s "
                "AND NOT attisdropped",
                (quoted(layout.table), column),
            ).fetchone():
                return {}  # no import into the table yet, or one by a lagless before the ledger
            found = conn.execute(query(layout)).fetchall()
        return by_partition(found)

    def unknown_rows(self, table: str) -> int | None:
        with self._connect() as conn:
            found = conn.execute(
                "SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = %s "
                "AND NOT attisdropped",
                (quoted(table), UNKNOWN),
            ).fetchone()
            if found is None:
                return None
            return int(conn.execute(unknown_count(table)).fetchone()[0])

    def newest_rows(self, target: Target, held: Mapping[TP, int]) -> dict[TP, HeldRecord]:
        with self._connect() as conn:
            return held_records(conn, target.table, held)

    def commit_staged(self, files: list[str], target: Target, batch: Batch) -> None:
        """The tasks committed their records themselves; the batch's ranges follow in a
        transaction of their own (a crash between leaves rows the ledger does not list: the
        unique key makes their replay add nothing)."""
        failpoint("mid-write")  # the batch written, not yet in the ledger nor committed by Spark
        self._retried(lambda: self._record(target, batch))

    def _record(self, target: Target, batch: Batch) -> None:
        with closing(self._connect_arrow()) as conn, closing(conn.cursor()) as cur:
            self._merge(conn, cur, [], record_ranges(ledger_layout(target, "postgresql"), batch))

    def write(
        self, rows: DataFrame, target: Target, batch: Batch, before_commit: Callable[[], None]
    ) -> int | Written:
        """The batch's tasks stream their rows into `<table>_stage_<batch>` (created afresh:
        what a crashed attempt left there is dropped), then one transaction merges it and drops
        it. Retried whole while the server is away, up to the retry budget."""
        if self.write_from == "driver":
            return super().write(rows, target, batch, before_commit)
        shipped = rows.select(*(self.transported(f.name, f.dataType) for f in rows.schema.fields))
        stage = staging_table(target.table, batch.id)
        merged, counted = self._statements(target, quoted(stage))
        statements = [*merged, f"DROP TABLE {quoted(stage)}"]
        columns = _arrow_schema(shipped)
        uri = Secret(self._arrow_uri(TASK_APPLICATION))
        copy_into = _copies_into(target)

        def ingest(table: str) -> pa.Table:
            receipts = shipped.mapInArrow(
                partial(ingest_task_rows, uri, table), INGEST_RECEIPT_SCHEMA
            )
            collected = receipts.toArrow()
            unreachable = [r for r in collected.column("unreachable").to_pylist() if r]
            if unreachable:
                raise TransientError(unreachable[0])
            return collected

        def attempt() -> int | Written:
            if copy_into is not None:
                # Each task COPYs its rows straight into the table, all or nothing. A replay
                # meets rows written before: those tasks wrote nothing, and the batch is staged
                # and merged below (the rows already there are left as they are).
                receipts = ingest(copy_into)
                if not any(receipts.column("conflict").to_pylist()):
                    failpoint("mid-write")  # the batch written, not yet in the ledger
                    before_commit()
                    self._record(target, batch)
                    return int(pc.sum(receipts.column("records")).as_py() or 0)
            with closing(self._connect_arrow()) as conn, closing(conn.cursor()) as cur:
                cur.execute(f"DROP TABLE IF EXISTS {quoted(stage)}")
                # Created through ADBC, whose types are those its COPY from the tasks sends.
                cur.adbc_ingest(stage, columns.empty_table(), mode="create")
                # Rows that only live until the merge need no write-ahead log.
                cur.execute(f"ALTER TABLE {quoted(stage)} SET UNLOGGED")
                conn.commit()
            ingest(stage)
            failpoint("mid-write")  # the batch staged, not yet merged
            before_commit()
            # After before_commit: an upsert's log times are the batch's then.
            recorded = record_ranges(ledger_layout(target, "postgresql"), batch)
            with closing(self._connect_arrow()) as conn, closing(conn.cursor()) as cur:
                # The target's statement is the one before the DROP of the stage.
                return self._merge(conn, cur, statements, recorded, counted, (target, batch))

        return self._retried(attempt)

    def _statements(self, target: Target, source: str) -> tuple[list[str], str]:
        """What stores the rows of `source` (in the target's columns, with the tombstone flag
        in upsert mode) into the target, idempotently, and which of them is the target's."""
        if target.mode == "upsert":
            layout = target_layout(target, "postgresql")
            keys = ", ".join(quoted(name) for name in layout.unique)
            moves = moves_layout(target, "postgresql") if target.marks else None
            # One statement may not update a row twice: keep each key's newest record (and a
            # marked mirror's deletes kept for their key changes: sql.upsert).
            kept = f"{quoted(MOVE_ONLY)} IS TRUE OR " if moves is not None else ""
            newest = (
                f"(SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY {keys} ORDER BY "
                f"{newest_first_sql()}) AS {quoted(_RANK)} FROM {source}) AS r WHERE {kept}"
                f"{quoted(_RANK)} = 1)"
                if moves is not None
                else f"(SELECT DISTINCT ON ({keys}) * FROM {source} "
                f"ORDER BY {keys}, {newest_first_sql()})"
            )
            statements = upsert(layout, tombstone_layout(target, "postgresql"), newest, moves)
            return statements + awaiting_filled(layout, moves), statements[-1]
        statement = insert(target_layout(target, "postgresql"), source)
        return [statement], statement

    def _retried(self, attempt: Callable[[], T]) -> T:
        """attempt() again while the server is away, up to the retry budget (retry_s)."""
        return retried(
            attempt,
            what=f"PostgreSQL at {self.url}",
            budget_s=self.retry_s,
            retry_on=(psycopg.OperationalError, adbc_pg.OperationalError, TransientError),
            reason=first_line,
        )

    def write_arrow(
        self, rows: pa.RecordBatchReader, target: Target, batch: Batch | None
    ) -> int | Written:
        """Retries while the server is away, up to the retry budget; each try is one transaction:
        the Arrow table into a temporary table through ADBC (binary COPY, no Python object per
        cell), then one INSERT ... ON CONFLICT (three in upsert mode: tombstones delete, are
        remembered, then records are stored), and the batch's ranges into the ledger."""
        # Records unique on (topic, partition, offset) in columns as Spark gives them (no cast)
        # can be copied straight into their table.
        copy_into = None
        recorded: list[str] = []
        if batch is None:
            statements = [insert(dead_letter_layout(target, "postgresql"), STAGE)]
            counted = statements[-1]
            copy_into = target.dead_letter_table
        else:
            recorded = record_ranges(ledger_layout(target, "postgresql"), batch)
            statements, counted = self._statements(target, STAGE)
            copy_into = _copies_into(target)
        table = rows.read_all()
        of = (target, batch) if batch is not None else None
        return self._retried(
            lambda: self._write_once(table, statements, copy_into, recorded, counted, of)
        )

    def _write_once(
        self,
        table: pa.Table,
        statements: list[str],
        copy_into: str | None,
        recorded: list[str],
        counted: str,
        of: tuple[Target, Batch] | None,
    ) -> int | Written:
        with closing(self._connect_arrow()) as conn, closing(conn.cursor()) as cur:
            if copy_into is not None and _appended(conn, cur, table, copy_into, recorded):
                return table.num_rows
            cur.adbc_ingest(STAGE, table, mode="create", temporary=True)
            failpoint("mid-write")
            return self._merge(conn, cur, statements, recorded, counted, of)

    def _merge(
        self,
        conn: Any,
        cur: Any,
        statements: list[str],
        recorded: Sequence[str] = (),
        counted: str | None = None,
        of: tuple[Target, Batch] | None = None,
    ) -> int | Written:
        """The statements, then the ledger's (`recorded`), in one transaction; the rows the
        `counted` statement (the target's: an upsert's tombstones delete, and are remembered,
        before it) changed, or ALREADY_HELD when the ledger held the batch (`of`) already."""
        changed = 0
        for statement in statements:
            rounds = SETTLING_ROUNDS if isinstance(statement, Settling) else 1
            for _ in range(rounds):  # a Settling statement: again while it changes rows
                cur.execute(str(statement))  # ADBC takes a str, not a subclass
                if cur.rowcount <= 0:
                    break
            if statement is counted:
                changed = max(cur.rowcount, 0)
        replay = False
        if of is not None:
            target, batch = of
            cur.execute(held_offsets(ledger_layout(target, "postgresql")))
            replay = holds(batch, by_partition(cur.fetchall()))
        for statement in recorded:
            cur.execute(statement)
        conn.commit()
        return ALREADY_HELD if replay else changed

    def _connect_arrow(self) -> Any:
        """An ADBC connection (its temporary tables go with it)."""
        try:
            return adbc_pg.connect(self._arrow_uri())
        except adbc_pg.Error as exc:
            raise TransientError(f"cannot connect to {self.url}: {first_line(exc)}") from None

    def _arrow_uri(self, application: str = "lagless") -> str:
        """The URL with the password: only for the client that connects. The application name
        tells the driver's sessions from the tasks' in pg_stat_activity and the server's log."""
        return self._address.uri(application_name=application).reveal()


def staging_table(table: str, batch_id: int) -> str:
    """`<table>_stage_<batch>`; a long table name is cut and a digest of it keeps it apart."""
    suffix = f"_stage_{batch_id}"
    if len(table) + len(suffix) <= MAX_NAME:
        return table + suffix
    digest = hashlib.sha256(table.encode()).hexdigest()[:8]
    return f"{table[: MAX_NAME - len(suffix) - 9]}_{digest}{suffix}"


def _arrow_schema(rows: DataFrame) -> pa.Schema:
    """The Arrow columns the rows' tasks receive: as mapInArrow hands them over."""
    from pyspark.sql.pandas.types import to_arrow_schema

    timezone = rows.sparkSession.conf.get("spark.sql.session.timeZone")
    return to_arrow_schema(rows.schema, timezone=timezone)


def _copies_into(target: Target) -> str | None:
    """The target when a batch's rows can be COPYed straight into it: an append, unique on
    (topic, partition, offset), of the columns as Spark gives them. Binary COPY cannot turn
    Arrow text into jsonb, so JSON values and typed tables go through a staging table."""
    layout = target_layout(target, "postgresql")
    if target.mode == "append" and target.fields is None and not layout.casts_on_insert:
        return target.table
    return None


def _appended(conn: Any, cur: Any, table: pa.Table, copy_into: str, recorded: list[str]) -> bool:
    """COPY the rows straight into the table, then the `recorded` statements, in one
    transaction: twice as fast as staging them and merging with ON CONFLICT. A replayed batch
    meets a row it wrote before, and the unique key fails the whole COPY: False, nothing
    written, and the caller merges instead."""
    try:
        cur.adbc_ingest(copy_into, table, mode="append")
        failpoint("mid-write")
        for statement in recorded:
            cur.execute(statement)
        conn.commit()
    except adbc_pg.IntegrityError:
        conn.rollback()
        return False
    return True


def _evolution(conn: Any, layout: Layout) -> list[str]:
    """What brings the table to layout (sql.evolve): BadInput when nothing can. Types are read
    as format_type writes them, the names sql.py uses."""
    found = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped "
        "ORDER BY a.attnum",
        (quoted(layout.table),),
    ).fetchall()
    keyed = tuple(
        row[0]
        for row in conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = to_regclass(%s) AND i.indisprimary "
            "ORDER BY array_position(i.indkey::int2[], a.attnum)",
            (quoted(layout.table),),
        ).fetchall()
    )
    return evolve(layout, [(row[0], row[1]) for row in found], keyed)
