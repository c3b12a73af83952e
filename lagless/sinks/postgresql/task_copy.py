"""Raw records COPYed into their PostgreSQL table by the Kafka source's tasks that read them
(its executorWriter): no record crosses into the JVM or through a second Python worker.

A task opens one connection and asks whether the table holds any record of its pieces. None
(the usual case): its records are COPYed straight into the table in one transaction, all or
nothing thanks to the unique key. Some (a replayed batch, or a retried task whose first attempt
committed): they are COPYed into a temporary table and the driver's INSERT ... ON CONFLICT DO
NOTHING adds the missing ones. Either way the table ends with each record once.

A server that is away raises TransientError; PostgresSink.run_tasks retries the batch's tasks.

Runs on executors: imports pyarrow, the ADBC driver and lagless's source types, secret and
task_files.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import closing

import pyarrow as pa

from lagless.exceptions import TransientError
from lagless.first_line import first_line
from lagless.planner.ranges import OffsetRange
from lagless.secret import Secret
from lagless.sinks.task_files import FILE_SCHEMA, stored_columns

# The temporary table of a task that met records written before; `merge` reads it.
TASK_STAGE = "lagless_task_stage"


def writer(config: Mapping[str, object], secret: Secret | None) -> TaskCopy:
    assert secret is not None, "the task needs the connection URI"
    return TaskCopy(str(config["table"]), str(config["merge"]), secret)


class TaskCopy:
    def __init__(self, table: str, merge: str, uri: Secret) -> None:
        self.table = table
        self.merge = merge
        self.uri = uri

    def write(
        self, pieces: Sequence[OffsetRange], batches: Iterator[pa.RecordBatch]
    ) -> tuple[str, None]:
        import adbc_driver_postgresql.dbapi as adbc_pg

        rows = pa.RecordBatchReader.from_batches(FILE_SCHEMA, map(stored_columns, batches))
        try:
            with closing(adbc_pg.connect(self.uri.reveal())) as conn, closing(conn.cursor()) as cur:
                cur.execute(holds_any(self.table, pieces))
                if cur.fetchone()[0]:
                    cur.adbc_ingest(TASK_STAGE, rows, mode="create", temporary=True)
                    cur.execute(self.merge)
                else:
                    cur.adbc_ingest(self.table, rows, mode="append")
                conn.commit()
        except adbc_pg.OperationalError as exc:
            raise TransientError(f"PostgreSQL is away: {first_line(exc)}") from None
        return f"postgresql:{self.table}", None


def holds_any(table: str, pieces: Sequence[OffsetRange]) -> str:
    """A query: does the table hold a record of these pieces? (An index range scan each.)"""
    ranges = " OR ".join(
        f"(\"topic\" = '{piece.topic.replace(chr(39), chr(39) * 2)}' "
        f'AND "partition" = {int(piece.partition)} '
        f'AND "offset" >= {int(piece.start)} AND "offset" < {int(piece.end)})'
        for piece in pieces
    )
    return f'SELECT EXISTS (SELECT 1 FROM "{table}" WHERE {ranges or "false"})'
