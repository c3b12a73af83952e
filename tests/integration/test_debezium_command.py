"""`lagless debezium`, the command a user runs beside their own PostgreSQL (issue 56, point 11),
with a real PostgreSQL and real Debezium, producing to the embedded broker: it captures the
table's snapshot and changes into PREFIX.SCHEMA.TABLE, stops on SIGTERM with exit 0 and its
offsets flushed, and a restart with the same --state sends what changed while it was down
and not the snapshot again. Then a Debezium import (in process, on the shared session)
mirrors the topic into the table the database holds. Bad input is one line, exit 2, before
Debezium starts."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from lagless.importer.job import run_import
from lagless.scenarios.debezium_connector import drop_slot
from tests.harness.debezium import connection, records_in, skip_reason
from tests.harness.mirror_workload import mirror_rows
from tests.harness.postgres import PostgresServer
from tests.integration.test_ledger import spec_for

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason())),
]

TOPIC = "shop.public.orders"


def wait_for_records(bootstrap: str, count: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while records_in(bootstrap, TOPIC) < count:
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, f"{records_in(bootstrap, TOPIC)} of {count} events"
        time.sleep(0.5)


def test_the_command_captures_stops_on_sigterm_and_resumes(broker, kafka, tmp_path: Path, spark):
    server = PostgresServer.start_new(logical=True)
    slot = f"lagless_{uuid.uuid4().hex[:8]}"
    db = server.connection
    url = f"postgresql://{db['user']}:{db['password']}@{db['host']}:{db['port']}/{db['dbname']}"
    command = [
        *(sys.executable, "-m", "lagless", "debezium", "--bootstrap", kafka.bootstrap),
        *("--database", url, "--table", "public.orders", "--topic-prefix", "shop"),
        *("--state", str(tmp_path / "debezium"), "--slot", slot),
    ]

    def start() -> subprocess.Popen:
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def stop(process: subprocess.Popen) -> str:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0 and err == "", err
        return out

    try:
        with connection(server) as conn:
            conn.execute("CREATE TABLE public.orders (id int PRIMARY KEY, item text)")
            conn.execute(
                "INSERT INTO public.orders SELECT n, 'item ' || n FROM generate_series(1, 50) n"
            )
        broker.create_topic(TOPIC, 2)  # as Kafka Connect makes it (the mock makes none)

        first = start()
        wait_for_records(kafka.bootstrap, 50, first)  # the snapshot
        out = stop(first)
        assert out.splitlines()[0].startswith("debezium: public.orders of ")
        assert out.splitlines()[-1] == "debezium: stopped, 50 change events sent; a restart resumes"

        with connection(server) as conn:  # while it is down
            conn.execute("INSERT INTO public.orders VALUES (51, 'item 51')")
            conn.execute("UPDATE public.orders SET item = 'changed' WHERE id = 1")
        second = start()
        wait_for_records(kafka.bootstrap, 52, second)
        out = stop(second)
        # The two changes, not the snapshot again (it comes first: 50 more).
        assert out.splitlines()[-1] == "debezium: stopped, 2 change events sent; a restart resumes"
        assert records_in(kafka.bootstrap, TOPIC) == 52

        sink = f"sqlite:///{tmp_path}/mirror.db"
        mirror = {"table": "orders", "write": "upsert", "value_format": "debezium"}
        mirrored = run_import(
            spec_for(kafka, TOPIC, sink, tmp_path / "ckpt", **mirror), spark=spark
        )
        assert mirrored.records == 52
        with connection(server) as conn:
            source = conn.execute("SELECT id, item FROM public.orders ORDER BY id").fetchall()
        rows = sorted((int(i), item) for i, item in mirror_rows(sink, "orders", ["id", "item"]))
        assert rows == [tuple(row) for row in source] and rows[0] == (1, "changed")
    finally:
        drop_slot(server.url, slot)
        server.destroy()


@pytest.mark.parametrize(
    ("over", "said"),
    [
        (("--database", "mysql://me@db/shop"), "not a postgresql://USER@HOST/DBNAME URL"),
        (("--database", "postgresql://db/shop"), "a URL postgresql://USER@HOST[:PORT]/DBNAME"),
        (("--table", "orders"), "--table 'orders': SCHEMA.TABLE"),
        (("--property", "novalue"), "--property 'novalue': KEY=VALUE"),
    ],
)
def test_bad_input_is_one_line_before_debezium_starts(tmp_path, over, said):
    args = {
        "--bootstrap": "127.0.0.1:9",
        "--database": "postgresql://me@127.0.0.1:9/shop",
        "--table": "public.orders",
        "--topic-prefix": "shop",
        "--state": str(tmp_path / "state"),
    }
    args[over[0]] = over[1]
    done = subprocess.run(
        [sys.executable, "-m", "lagless", "debezium", *(x for kv in args.items() for x in kv)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1
    assert not (tmp_path / "state").exists()
