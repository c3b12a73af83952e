"""A random workload on two PostgreSQL tables for the mirror's tests, and each table read back
as comparable rows from the source and from a mirror in any store.

`orders` (one key column) holds every kind of column Debezium types differently: numerics,
dates, times, timestamps with and without zone, booleans, JSON, UUIDs, bytes, arrays, and a
long text of random characters that PostgreSQL TOASTs (an update that leaves it alone sends
Debezium's __debezium_unavailable_value). `items` has a two-column key and REPLICA IDENTITY
FULL: its primary-key changes leave its TOASTed memo alone, which Debezium can send only when
the old row is logged whole (with the default identity the new key's create would carry the
placeholder, a value the connector never read: orders' key changes rewrite the note). The
workload inserts, updates, deletes, changes primary keys, writes NULLs, and adds a column
mid-stream (`add_column`).
"""

from __future__ import annotations

import datetime
import decimal
import json
import random
import string
import uuid
from typing import Any

from tests.harness import sqlite_elsewhere

ORDERS = """CREATE TABLE orders (
    id integer PRIMARY KEY,
    name text,
    price numeric(12, 2),
    qty bigint,
    small smallint,
    ratio real,
    score double precision,
    ok boolean,
    born date,
    at timestamp,
    at_zone timestamptz,
    tm time,
    doc jsonb,
    ident uuid,
    raw bytea,
    tags text[],
    note text
)"""
ITEMS = """CREATE TABLE items (
    shop integer,
    sku text,
    amount numeric(10, 3),
    memo text,
    PRIMARY KEY (shop, sku)
)"""
TABLES = ("public.orders", "public.items")
# Longer than PostgreSQL's TOAST threshold (2 kB) and random: it is stored out of line.
TOASTED_CHARS = 6000


class Workload:
    def __init__(self, conn: Any, seed: int) -> None:
        self.conn = conn
        self.random = random.Random(seed)
        self.next_id = 1
        # Numbers the items' key changes: an inserted sku has no digit, so a changed one never
        # meets another (a bare letter appended did: "ff" + "y" where "ffy" was).
        self.key_changes = 0
        self.added = False

    def create(self) -> None:
        self.conn.execute(ORDERS)
        self.conn.execute(ITEMS)
        self.conn.execute("ALTER TABLE items REPLICA IDENTITY FULL")

    def _long_text(self) -> str:
        return "".join(self.random.choices(string.ascii_letters + string.digits, k=TOASTED_CHARS))

    def _order(self, order_id: int) -> tuple[Any, ...]:
        r = self.random

        def maybe(value: Any) -> Any:
            return None if r.random() < 0.1 else value

        return (
            order_id,
            maybe("".join(r.choices(string.ascii_letters, k=r.randint(0, 12)))),
            maybe(decimal.Decimal(r.randint(-(10**9), 10**9)) / 100),
            maybe(r.randint(-(2**62), 2**62)),
            maybe(r.randint(-30000, 30000)),
            maybe(r.choice([0.5, -1.25, 3.0, 1e-3])),
            maybe(r.uniform(-1e6, 1e6)),
            maybe(r.random() < 0.5),
            maybe(datetime.date(1950, 1, 1) + datetime.timedelta(days=r.randint(0, 40000))),
            maybe(
                datetime.datetime(1990, 1, 1)
                + datetime.timedelta(microseconds=r.randint(0, 10**15))
            ),
            maybe(
                datetime.datetime(2000, 1, 1, tzinfo=datetime.UTC)
                + datetime.timedelta(microseconds=r.randint(0, 10**15))
            ),
            maybe(datetime.time(r.randint(0, 23), r.randint(0, 59), r.randint(0, 59), 1000)),
            maybe(json.dumps({"n": r.randint(0, 99), "s": "x"})),
            maybe(uuid.UUID(int=r.getrandbits(128))),
            maybe(r.randbytes(r.randint(0, 20))),
            maybe([r.choice(["a", "b", "c"]) for _ in range(r.randint(0, 3))]),
            maybe(self._long_text()),
        )

    def insert_orders(self, count: int) -> None:
        with self.conn.transaction():
            for _ in range(count):
                self.conn.execute(
                    "INSERT INTO orders VALUES (" + ", ".join(["%s"] * 17) + ")",
                    self._order(self.next_id),
                )
                self.next_id += 1

    def insert_items(self, count: int) -> None:
        r = self.random
        with self.conn.transaction():
            for _ in range(count):
                self.conn.execute(
                    "INSERT INTO items VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (
                        r.randint(1, 20),
                        r.choice("abcdefgh") * r.randint(1, 3),
                        decimal.Decimal(r.randint(0, 10**7)) / 1000,
                        self._long_text() if r.random() < 0.7 else None,
                    ),
                )

    def add_column(self) -> None:
        """A column added upstream: Debezium's next events carry it."""
        self.conn.execute("ALTER TABLE orders ADD COLUMN extra integer")
        self.added = True

    def step(self, operations: int) -> None:
        """Random changes, a few per transaction."""
        r = self.random
        for _ in range(operations):
            ids = [row[0] for row in self.conn.execute("SELECT id FROM orders").fetchall()]
            choice = r.random()
            with self.conn.transaction():
                if choice < 0.25 or not ids:
                    self.insert_orders(1)
                elif choice < 0.55:
                    # An update that leaves the TOASTed note alone.
                    self.conn.execute(
                        "UPDATE orders SET name = %s, qty = qty + 1 WHERE id = %s",
                        (r.choice(["u", None, "upd"]), r.choice(ids)),
                    )
                elif choice < 0.65:
                    row = self._order(r.choice(ids))
                    self.conn.execute(
                        "UPDATE orders SET (name, price, qty, small, ratio, score, ok, born, at, "
                        "at_zone, tm, doc, ident, raw, tags, note) = ("
                        + ", ".join(["%s"] * 16)
                        + ") WHERE id = %s",
                        (*row[1:], row[0]),
                    )
                elif choice < 0.75:
                    self.conn.execute("DELETE FROM orders WHERE id = %s", (r.choice(ids),))
                elif choice < 0.82:
                    # A primary-key change: Debezium sends a delete and a create.
                    self.conn.execute(
                        "UPDATE orders SET id = %s, note = %s WHERE id = %s",
                        (self.next_id, self._long_text(), r.choice(ids)),
                    )
                    self.next_id += 1
                elif choice < 0.9 and self.added:
                    self.conn.execute(
                        "UPDATE orders SET extra = %s WHERE id = %s",
                        (r.randint(0, 9), r.choice(ids)),
                    )
                elif choice < 0.9:
                    self.insert_items(2)
                elif choice < 0.93:
                    self.conn.execute(
                        "UPDATE items SET amount = amount + 1 WHERE ctid IN (SELECT ctid FROM "
                        "items ORDER BY random() LIMIT 2)"
                    )
                elif choice < 0.96:
                    # A key change leaving the TOASTed memo alone (REPLICA IDENTITY FULL).
                    self.conn.execute(
                        "UPDATE items SET sku = sku || %s WHERE ctid IN (SELECT ctid FROM items "
                        "ORDER BY random() LIMIT 1)",
                        (f"{r.choice('xyz')}{self.key_changes}",),
                    )
                    self.key_changes += 1
                else:
                    self.conn.execute(
                        "DELETE FROM items WHERE ctid IN (SELECT ctid FROM items ORDER BY "
                        "random() LIMIT 1)"
                    )


def _canonical(value: Any) -> Any:
    """One text for a value whichever store or driver gave it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(float(value)) if isinstance(value, float) else str(value)
    if isinstance(value, decimal.Decimal):
        return str(value.normalize()) if value != 0 else "0"
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.UTC).replace(tzinfo=None)
        return value.isoformat(sep=" ")
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | memoryview | bytearray):
        return bytes(value).hex()
    if isinstance(value, list):
        return json.dumps(value)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return str(value)


COLUMN_KINDS = {
    "price": "decimal",
    "amount": "decimal",
    "ratio": "float",
    "score": "float",
    "ok": "bool",
    "born": "date",
    "at": "timestamp",
    "at_zone": "timestamp",
    "tm": "time",
    "doc": "json",
    "tags": "json",
    "raw": "bytes",
    "_deleted": "bool",
}


def canonical(column: str, value: Any) -> Any:
    """As _canonical, after reading a store's text back as the source's type."""
    if value is None:
        return None
    kind = COLUMN_KINDS.get(column)
    if isinstance(value, str):
        if kind == "decimal":
            value = decimal.Decimal(value)
        elif kind == "date":
            value = datetime.date.fromisoformat(value[:10])
        elif kind == "timestamp":
            value = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
        elif kind == "time":
            value = datetime.time.fromisoformat(value)
        elif kind in ("json",):
            value = json.loads(value)
    if kind == "bool" and isinstance(value, int):
        value = bool(value)
    if kind == "float" and value is not None:
        return repr(round(float(value), 4))
    if isinstance(value, float):
        return repr(round(value, 4))
    return _canonical(value)


def source_rows(conn: Any, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    quoted = ", ".join(f'"{c}"' for c in columns)
    rows = conn.execute(f"SELECT {quoted} FROM {table}").fetchall()
    return sorted(
        (tuple(canonical(c, v) for c, v in zip(columns, row, strict=True)) for row in rows),
        key=repr,
    )


def mirror_rows(sink_url: str, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    """The mirror's table in any store, read as a user would, in the source's columns."""
    return _sorted(stored_rows(sink_url, table, columns), columns)


def stored_rows(sink_url: str, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    """A table in any store, these columns of each row as its reader gives them."""
    if "+s3://" in sink_url:
        return _s3_rows(sink_url, table, columns)
    scheme, _, rest = sink_url.partition(":///")
    if scheme == "sqlite":
        quoted = ", ".join(f'"{c}"' for c in columns)
        # From another process: the import may be running in this one (sqlite_elsewhere.py).
        rows = sqlite_elsewhere.rows(rest, f'SELECT {quoted} FROM "{table}"')
    elif scheme == "delta":
        from deltalake import DeltaTable

        found = DeltaTable(f"{rest}/{table}").to_pyarrow_table(columns=columns)
        rows = [tuple(r.values()) for r in found.to_pylist()]
    elif scheme == "iceberg":
        from pyiceberg.catalog.sql import SqlCatalog

        catalog = SqlCatalog(
            "lagless", uri=f"sqlite:///{rest}/catalog.db", warehouse=f"file://{rest}"
        )
        try:
            found = catalog.load_table(f"default.{table}").scan().to_arrow().select(columns)
        finally:
            catalog.engine.dispose()
        rows = [tuple(r.values()) for r in found.to_pylist()]
    else:
        import psycopg

        quoted = ", ".join(f'"{c}"' for c in columns)
        with psycopg.connect(sink_url) as conn:
            rows = conn.execute(f'SELECT {quoted} FROM "{table}"').fetchall()
    return rows


def _sorted(rows: list[Any], columns: list[str]) -> list[tuple[Any, ...]]:
    return sorted(
        (tuple(canonical(c, v) for c, v in zip(columns, row, strict=True)) for row in rows),
        key=repr,
    )


def _s3_rows(sink_url: str, table: str, columns: list[str]) -> list[Any]:
    """A table on S3 (the AWS variables of tests/harness/s3.py set)."""
    import os

    store, _, rest = sink_url.partition("+s3://")
    location, _, query = rest.partition("?")
    if store == "delta":
        from deltalake import DeltaTable

        found = DeltaTable(f"s3://{location}/{table}").to_pyarrow_table(columns=columns)
    else:
        from pyiceberg.catalog.sql import SqlCatalog

        catalog_file = query.removeprefix("catalog=")
        catalog = SqlCatalog(
            "lagless",
            uri=f"sqlite:///{catalog_file}",
            warehouse=f"s3://{location}",
            **{
                "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO",
                "s3.endpoint": os.environ["AWS_ENDPOINT_URL"],
                "s3.access-key-id": os.environ["AWS_ACCESS_KEY_ID"],
                "s3.secret-access-key": os.environ["AWS_SECRET_ACCESS_KEY"],
                "s3.region": os.environ["AWS_REGION"],
            },
        )
        try:
            found = catalog.load_table(f"default.{table}").scan().to_arrow().select(columns)
        finally:
            catalog.engine.dispose()
    return [tuple(r.values()) for r in found.to_pylist()]
