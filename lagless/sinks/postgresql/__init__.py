"""PostgreSQL, written from the driver: Arrow into a temporary table, then one INSERT ... ON
CONFLICT that a replay cannot double. The password never appears in a message."""

from __future__ import annotations

import time
from contextlib import closing
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pyarrow as pa

from lagless.exceptions import BadInput, TransientError
from lagless.failpoints import failpoint
from lagless.secret import Secret
from lagless.sinks.base import DriverSink, Target
from lagless.sinks.sql import (
    Layout,
    dead_letter_layout,
    evolve,
    insert,
    layouts,
    quoted,
    target_layout,
    tombstone_layout,
    upsert,
)

try:
    import adbc_driver_postgresql.dbapi as adbc_pg
    import psycopg
except ImportError:  # pragma: no cover - depends on the installation
    psycopg = None  # type: ignore[assignment]

STAGE = "lagless_stage"

RETRY_FOR_S = 60.0
CONNECT_TIMEOUT_S = 10


def redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":****@")))


class PostgresSink(DriverSink):
    scheme = "postgresql"

    def __init__(self, url: str, password: Secret | None) -> None:
        super().__init__(redacted(url), redacted(url))
        self._password = password

    @classmethod
    def from_url(cls, url: str) -> PostgresSink:
        if psycopg is None:
            raise BadInput("the postgresql sink needs psycopg: pip install 'lagless[postgresql]'")
        parts = urlsplit(url)
        if not parts.hostname or not parts.path.strip("/"):
            raise BadInput(f"sink URL {redacted(url)!r} needs a host and a database")
        return cls(url, Secret(parts.password) if parts.password else None)

    def _connect(self) -> Any:
        parts = urlsplit(self.url)
        info: dict[str, Any] = {
            "host": parts.hostname,
            "port": parts.port or 5432,
            "dbname": parts.path.strip("/"),
            "connect_timeout": CONNECT_TIMEOUT_S,
        }
        if parts.username:
            info["user"] = parts.username
        if self._password is not None:
            info["password"] = self._password.reveal()
        try:
            return psycopg.connect(**info)
        except psycopg.OperationalError as exc:
            raise TransientError(f"cannot connect to {self.url}: {_first_line(exc)}") from None

    def check(self, target: Target) -> None:
        try:
            with self._connect() as conn:
                for layout in layouts(target, "postgresql"):
                    _evolution(conn, layout)
        except TransientError as exc:
            raise BadInput(str(exc)) from None

    def prepare(self, target: Target) -> None:
        with self._connect() as conn:
            for layout in layouts(target, "postgresql"):
                for statement in _evolution(conn, layout):
                    conn.execute(statement)

    def write_arrow(self, rows: pa.RecordBatchReader, target: Target, *, dead_letters: bool) -> int:
        """Retries while the server is away, up to RETRY_FOR_S; each try is one transaction:
        the Arrow table into a temporary table through ADBC (binary COPY, no Python object per
        cell), then one INSERT ... ON CONFLICT (three in upsert mode: tombstones delete, are
        remembered, then records are stored)."""
        # Records unique on (topic, partition, offset) in columns as Spark gives them (no cast)
        # can be copied straight into their table.
        copy_into = None
        if dead_letters:
            statements = [insert(dead_letter_layout(target, "postgresql"), STAGE)]
            copy_into = target.dead_letter_table
        elif target.mode == "upsert":
            layout = target_layout(target, "postgresql")
            keys = ", ".join(quoted(name) for name in layout.unique)
            # One statement may not update a row twice: keep each key's newest record.
            newest = (
                f"(SELECT DISTINCT ON ({keys}) * FROM {STAGE} "
                f'ORDER BY {keys}, "timestamp" DESC, "partition" DESC, "offset" DESC)'
            )
            statements = upsert(layout, tombstone_layout(target, "postgresql"), newest)
        else:
            layout = target_layout(target, "postgresql")
            statements = [insert(layout, STAGE)]
            # Binary COPY cannot turn Arrow text into jsonb: JSON values go through the stage.
            untyped = target.fields is None and not layout.casts_on_insert
            copy_into = target.table if untyped else None
        table = rows.read_all()
        deadline = time.monotonic() + RETRY_FOR_S
        pause = 0.5
        while True:
            try:
                return self._write_once(table, statements, copy_into)
            except (psycopg.OperationalError, adbc_pg.OperationalError, TransientError) as exc:
                if time.monotonic() + pause > deadline:
                    raise TransientError(
                        f"writing to {self.url} failed for {RETRY_FOR_S:.0f} s: {_first_line(exc)}"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 5.0)

    def _write_once(self, table: pa.Table, statements: list[str], copy_into: str | None) -> int:
        changed = 0
        with closing(self._connect_arrow()) as conn, closing(conn.cursor()) as cur:
            if copy_into is not None and _appended(conn, cur, table, copy_into):
                return table.num_rows
            cur.adbc_ingest(STAGE, table, mode="create", temporary=True)
            failpoint("mid-write")
            for statement in statements:
                cur.execute(statement)
                changed += max(cur.rowcount, 0)
            conn.commit()
        return changed

    def _connect_arrow(self) -> Any:
        """An ADBC connection (its temporary tables go with it)."""
        parts = urlsplit(self.url)
        netloc = parts.hostname or ""
        if parts.port:
            netloc = f"{netloc}:{parts.port}"
        if parts.username:
            password = f":{quote(self._password.reveal(), safe='')}" if self._password else ""
            netloc = f"{quote(parts.username, safe='')}{password}@{netloc}"
        uri = urlunsplit(parts._replace(netloc=netloc))
        try:
            return adbc_pg.connect(uri)
        except adbc_pg.Error as exc:
            raise TransientError(f"cannot connect to {self.url}: {_first_line(exc)}") from None


def _appended(conn: Any, cur: Any, table: pa.Table, copy_into: str) -> bool:
    """COPY the rows straight into the table, in one transaction: twice as fast as staging them
    and merging with ON CONFLICT. A replayed batch meets a row it wrote before, and the unique
    key fails the whole COPY: False, nothing written, and the caller merges instead."""
    try:
        cur.adbc_ingest(copy_into, table, mode="append")
        failpoint("mid-write")
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


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
