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
    create_table,
    dead_letter_layout,
    insert,
    quoted,
    target_layout,
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
                for layout in (target_layout(target), dead_letter_layout(target)):
                    _check_layout(conn, layout)
        except TransientError as exc:
            raise BadInput(str(exc)) from None

    def prepare(self, target: Target) -> None:
        with self._connect() as conn:
            for layout in (target_layout(target), dead_letter_layout(target)):
                conn.execute(create_table(layout, "postgresql"))

    def write_arrow(self, rows: pa.RecordBatchReader, target: Target, *, dead_letters: bool) -> int:
        """Retries while the server is away, up to RETRY_FOR_S; each try is one transaction."""
        layout = dead_letter_layout(target) if dead_letters else target_layout(target)
        table = rows.read_all()
        deadline = time.monotonic() + RETRY_FOR_S
        pause = 0.5
        while True:
            try:
                return self._write_once(table, layout)
            except (psycopg.OperationalError, adbc_pg.OperationalError, TransientError) as exc:
                if time.monotonic() + pause > deadline:
                    raise TransientError(
                        f"writing to {self.url} failed for {RETRY_FOR_S:.0f} s: {_first_line(exc)}"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 5.0)

    def _write_once(self, table: pa.Table, layout: Layout) -> int:
        """One transaction: the Arrow table into a temporary table through ADBC (binary COPY,
        no Python object per cell), then one INSERT ... ON CONFLICT. Rows unique on their
        record (append, dead letters) are first copied straight into the table."""
        names = ", ".join(quoted(name) for name in layout.names)
        with closing(self._connect_arrow()) as conn, closing(conn.cursor()) as cur:
            if not layout.newer_only and _appended(conn, cur, table, layout):
                return table.num_rows
            cur.adbc_ingest(STAGE, table, mode="create", temporary=True)
            failpoint("mid-write")
            rows = f"SELECT {names} FROM {STAGE}"
            if layout.newer_only:
                # One statement may not update a row twice: keep each key's newest record.
                rows = (
                    f'SELECT DISTINCT ON ("key") {names} FROM {STAGE} '
                    'ORDER BY "key", "timestamp" DESC, "partition" DESC, "offset" DESC'
                )
            cur.execute(insert(layout, rows))
            changed = cur.rowcount
            conn.commit()
        return max(changed, 0)

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


def _appended(conn: Any, cur: Any, table: pa.Table, layout: Layout) -> bool:
    """COPY the rows straight into the table, in one transaction: twice as fast as staging them
    and merging with ON CONFLICT. A replayed batch meets a row it wrote before, and the unique
    key fails the whole COPY: False, nothing written, and the caller merges instead."""
    try:
        cur.adbc_ingest(layout.table, table, mode="append")
        failpoint("mid-write")
        conn.commit()
    except adbc_pg.IntegrityError:
        conn.rollback()
        return False
    return True


def _check_layout(conn: Any, layout: Layout) -> None:
    """A BadInput when the table exists with other columns or another unique key (an append
    table reused for upsert would keep every record), as the SQLite sink checks."""
    found = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "AND table_schema = current_schema() ORDER BY ordinal_position",
        (layout.table,),
    ).fetchall()
    columns = tuple(row[0] for row in found)
    if not columns:
        return
    keyed = tuple(
        row[0]
        for row in conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = to_regclass(%s) AND i.indisprimary "
            "ORDER BY array_position(i.indkey::int2[], a.attnum)",
            (quoted(layout.table),),
        ).fetchall()
    )
    if columns != layout.names or keyed != layout.unique:
        raise BadInput(
            f"table {layout.table!r} exists with another layout (columns {', '.join(columns)}; "
            f"unique on {', '.join(keyed) or 'nothing'}); pick another --table or --write mode"
        )


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
