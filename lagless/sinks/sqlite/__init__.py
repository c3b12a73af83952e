"""SQLite, the embedded default store. Written from the driver: the file lives there."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from lagless.exceptions import BadInput
from lagless.sinks import local_path
from lagless.sinks.base import COLUMNS, Sink, Target, check_writable_path
from lagless.sinks.rows import arrow_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# A stored row gives way only to a newer record: a later offset of the same partition or, when
# the key comes from another partition, a later timestamp (then the higher partition on a tie).
NEWER = (
    "(excluded.partition = t.partition AND excluded.offset > t.offset)"
    " OR (excluded.partition <> t.partition AND (excluded.timestamp > t.timestamp"
    " OR (excluded.timestamp = t.timestamp AND excluded.partition > t.partition)))"
)


class SqliteSink(Sink):
    scheme = "sqlite"
    on_driver = True

    @classmethod
    def from_url(cls, url: str) -> SqliteSink:
        return cls(url, local_path(url, cls.scheme))

    def check(self, target: Target) -> None:
        check_writable_path(self.location, "file")
        with self._connect(create=False) as conn:
            if conn is not None:
                _check_layout(conn, target)

    def prepare(self, target: Target) -> None:
        with self._connect(create=True) as conn:
            assert conn is not None
            value_type = "TEXT" if target.value_format == "json" else "BLOB"
            unique = (
                "PRIMARY KEY (key)"
                if target.mode == "upsert"
                else "PRIMARY KEY (topic, partition, offset)"
            )
            key_null = " NOT NULL" if target.mode == "upsert" else ""
            conn.execute(
                f'CREATE TABLE IF NOT EXISTS "{target.table}" (topic TEXT NOT NULL, '
                f"partition INTEGER NOT NULL, offset INTEGER NOT NULL, key BLOB{key_null}, "
                f"value {value_type}, timestamp INTEGER, {unique})"
            )

    def write(self, rows: DataFrame, target: Target, batch_id: int) -> int:
        table = rows.select(*COLUMNS).toArrow()
        return self.write_arrow(table, target)

    def write_arrow(self, table: object, target: Target) -> int:
        placeholders = ", ".join("?" for _ in COLUMNS)
        if target.mode == "upsert":
            sql = (
                f'INSERT INTO "{target.table}" AS t VALUES ({placeholders}) '
                "ON CONFLICT (key) DO UPDATE SET "
                + ", ".join(f"{c} = excluded.{c}" for c in COLUMNS if c != "key")
                + f" WHERE {NEWER}"
            )
        else:
            sql = f'INSERT OR IGNORE INTO "{target.table}" VALUES ({placeholders})'
        with self._connect(create=True) as conn:
            assert conn is not None
            before = conn.total_changes
            with conn:
                conn.executemany(sql, arrow_rows(table))
            return conn.total_changes - before

    @contextmanager
    def _connect(self, create: bool) -> Iterator[sqlite3.Connection | None]:
        mode = "rwc" if create else "rw"
        try:
            conn = sqlite3.connect(f"file:{self.location}?mode={mode}", uri=True, timeout=30)
        except sqlite3.OperationalError as exc:
            if not create:
                yield None
                return
            raise BadInput(f"cannot open SQLite file {self.location!r}: {exc}") from None
        try:
            yield conn
        finally:
            conn.close()


def _check_layout(conn: sqlite3.Connection, target: Target) -> None:
    try:
        info = conn.execute(f'PRAGMA table_info("{target.table}")').fetchall()
    except sqlite3.DatabaseError as exc:
        raise BadInput(f"sink file is not an SQLite database: {exc}") from None
    if not info:
        return
    columns = tuple(row[1] for row in info)
    keyed = tuple(row[1] for row in sorted(info, key=lambda r: r[5]) if row[5])
    wanted_key = ("key",) if target.mode == "upsert" else ("topic", "partition", "offset")
    if columns != COLUMNS or keyed != wanted_key:
        raise BadInput(
            f"table {target.table!r} exists with another layout (columns {', '.join(columns)}; "
            f"unique on {', '.join(keyed) or 'nothing'}); pick another --table or --write mode"
        )
