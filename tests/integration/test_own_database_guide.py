"""docs/mirror.md's "Your own database" guide, its commands run as written (issue 56, point 11):
the SQL block through psql against a real PostgreSQL standing for the user's, `lagless
debezium` (real Debezium) and the continuous `lagless import` into Delta, with only the
guide's placeholders replaced (the database's host and port, `kafka:9092`, the folders).
Then the mirror equals the database, and follows its changes; both processes stop on SIGTERM
with exit 0.

Not run: the Kafka Connect block (no Kafka Connect here: its jars are Maven's) and Debezium
Server's settings (prose). The topics are made first, as the guide says ("the topics must
exist"): the embedded broker makes none.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lagless.scenarios.debezium_connector import drop_slot
from tests.harness.debezium import skip_reason
from tests.harness.docs import DOCS, Block, sh_blocks
from tests.harness.mirror_workload import mirror_rows, source_rows
from tests.harness.postgres import PostgresServer

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason())),
]

GUIDE = DOCS / "mirror.md"
TABLES = {"orders": ["id", "item", "qty"], "customers": ["id", "name"]}


def connect(server: PostgresServer, dbname: str = "lagless") -> Any:
    import psycopg

    return psycopg.connect(database_url(server, dbname), autocommit=True)


def database_url(server: PostgresServer, dbname: str) -> str:
    return f"{server.url.rsplit('/', 1)[0]}/{dbname}"


def guide_blocks() -> dict[str, Block]:
    """The guide's blocks this test runs: its SQL, `lagless debezium`, the mirror's import."""
    found: dict[str, Block] = {}
    for block in sh_blocks(GUIDE):
        if "test_own_database_guide.py" not in (block.not_run or ""):
            continue  # another test's block, such as the Avro variant's
        if block.text.startswith("psql -d shop"):
            found["sql"] = block
        elif "lagless debezium" in block.text:
            found["debezium"] = block
        elif "lagless import" in block.text and "'shop\\.public\\..*'" in block.text:
            found["mirror"] = block
    assert set(found) == {"sql", "debezium", "mirror"}, f"the guide changed: {found}"
    return found


def as_here(text: str, server: PostgresServer, bootstrap: str, folder: Path) -> str:
    """The block with the guide's placeholders replaced by this test's places."""
    replaced = (
        text.replace("kafka:9092", bootstrap)
        .replace("db.example.com:5432", f"127.0.0.1:{server.port}")
        .replace("/var/lib/lagless/", f"{folder}/state/")
        .replace("delta:///lake/", f"delta:///{folder}/lake/")
    )
    for placeholder in ("kafka:9092", "example.com", "/var/lib", "delta:///lake"):
        assert placeholder not in replaced, placeholder
    return replaced


def environment() -> dict[str, str]:
    """lagless on the PATH, as after `. .venv/bin/activate`."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


def started(text: str, folder: Path, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["bash", "-c", text],
        cwd=folder,
        env=environment(),
        stdout=(folder / f"{name}.out").open("w"),
        stderr=(folder / f"{name}.err").open("w"),
        text=True,
        start_new_session=True,  # a signal to its group reaches lagless and what it started
    )


def equal(server: PostgresServer, sink: str) -> bool:
    for table, columns in TABLES.items():
        with connect(server, "shop") as conn:
            source = source_rows(conn, f"public.{table}", columns)
        try:
            mirrored = mirror_rows(sink, table, columns)
        except Exception:  # not made yet
            return False
        if source != mirrored:
            return False
    return True


def wait_until_equal(
    server: PostgresServer, sink: str, processes: dict[str, subprocess.Popen[str]], folder: Path
) -> None:
    deadline = time.monotonic() + 300
    while not equal(server, sink):
        for name, process in processes.items():
            assert process.poll() is None, (name, (folder / f"{name}.err").read_text())
        assert time.monotonic() < deadline, "the mirror did not come equal to the database"
        time.sleep(1)


def test_the_guide_takes_a_database_to_a_mirror(broker, tmp_path: Path) -> None:
    blocks = guide_blocks()
    server = PostgresServer.start_new(logical=True)
    processes: dict[str, subprocess.Popen[str]] = {}
    try:
        with connect(server) as conn:
            conn.execute("CREATE DATABASE shop")
        with connect(server, "shop") as conn:  # the user's database, before the guide
            conn.execute("CREATE TABLE public.orders (id int PRIMARY KEY, item text, qty int)")
            conn.execute("CREATE TABLE public.customers (id int PRIMARY KEY, name text)")
            conn.execute("CREATE TABLE public.notes (body text)")
            conn.execute(
                "INSERT INTO public.orders SELECT n, 'item ' || n, n FROM generate_series(1, 40) n"
            )
            conn.execute(
                "INSERT INTO public.customers SELECT n, 'c' || n FROM generate_series(1, 10) n"
            )
        db = server.connection
        admin = {
            **environment(),
            **{"PGHOST": str(db["host"]), "PGPORT": str(db["port"])},
            **{"PGUSER": str(db["user"]), "PGPASSWORD": str(db["password"])},
        }
        sql = subprocess.run(
            ["bash", "-c", blocks["sql"].text],
            env=admin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert sql.returncode == 0 and "ERROR" not in sql.stderr, sql.stderr
        for table in TABLES:
            broker.create_topic(f"shop.public.{table}", 2)

        debezium = as_here(blocks["debezium"].text, server, broker.bootstrap, tmp_path)
        mirror = as_here(blocks["mirror"].text, server, broker.bootstrap, tmp_path)
        processes["debezium"] = started(debezium, tmp_path, "debezium")
        processes["mirror"] = started(mirror, tmp_path, "mirror")
        sink = f"delta:///{tmp_path}/lake/shop"
        wait_until_equal(server, sink, processes, tmp_path)  # the snapshot

        with connect(server, "shop") as conn:  # then changes, followed
            conn.execute("UPDATE public.orders SET qty = qty * 10 WHERE id <= 5")
            conn.execute("DELETE FROM public.orders WHERE id > 35")
            conn.execute("INSERT INTO public.customers VALUES (11, 'new')")
        wait_until_equal(server, sink, processes, tmp_path)

        for name in ("mirror", "debezium"):
            os.killpg(processes[name].pid, signal.SIGTERM)
            assert processes[name].wait(timeout=120) == 0, (tmp_path / f"{name}.err").read_text()
    finally:
        for process in processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        drop_slot(database_url(server, "shop"), "lagless")
        server.destroy()
