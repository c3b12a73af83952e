"""Rows streamed into a PostgreSQL staging table by the Spark tasks that hold them
(DataFrame.mapInArrow): each task opens one connection, sends its Arrow batches through ADBC's
binary COPY as they arrive, commits, and hands back one receipt row. The driver then merges the
staging table; it never holds the rows.

ingest_task_rows runs on executors: it imports pyarrow, the ADBC driver and lagless.secret,
nothing of lagless's driver.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from itertools import chain

import pyarrow as pa

from lagless.first_line import first_line
from lagless.secret import Secret

# `unreachable`: null, or why the server could not take the rows (the driver retries the batch).
# `conflict`: the table held one of the rows already (a replay), so none were written.
INGEST_RECEIPT_SCHEMA = "records long, unreachable string, conflict boolean"
_RECEIPT = pa.schema(
    [("records", pa.int64()), ("unreachable", pa.string()), ("conflict", pa.bool_())]
)


def ingest_task_rows(
    uri: Secret, stage: str, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """A task's rows appended to the table `stage`, in one transaction of one connection.
    `stage` may be the target itself when its unique key makes the COPY all or nothing: a row
    already there (a replay) fails the whole COPY, which the receipt says (`conflict`).

    A server that is away is reported in the receipt rather than raised: a failed Spark task
    would fail the batch's job with the error buried in a JVM trace, and Spark would retry the
    task against the same absent server. The driver retries the whole batch instead."""
    import adbc_driver_postgresql.dbapi as adbc_pg

    first = next(batches, None)
    if first is None:
        return
    rows = pa.RecordBatchReader.from_batches(first.schema, chain([first], batches))
    try:
        with closing(adbc_pg.connect(uri.reveal())) as conn, closing(conn.cursor()) as cur:
            records = cur.adbc_ingest(stage, rows, mode="append")
            conn.commit()
    except adbc_pg.IntegrityError:
        for _ in batches:  # the task's input is read to its end, as Spark expects
            pass
        yield _receipt(0, conflict=True)
        return
    except adbc_pg.OperationalError as exc:
        for _ in batches:
            pass
        yield _receipt(0, unreachable=first_line(exc))
        return
    yield _receipt(records)


def _receipt(
    records: int, unreachable: str | None = None, conflict: bool = False
) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {"records": [records], "unreachable": [unreachable], "conflict": [conflict]}, _RECEIPT
    )
