"""Imports started together into one SQLite table (issue 31, point 4): each stages its tasks'
files in a folder of its own (`<db>-lagless-staging/<table>/<run>`), and their commits queue
on the database's lock file, so both finish with every record once. Three imports at once
from the CLI, as users start them: two topics into one table, and one of the topics from a
second checkpoint too. Real Spark (a process each), the embedded broker over TCP."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.integration.test_crash_safety import stored

pytestmark = pytest.mark.spark

RECORDS = 5_000  # 5 batches an import: the first staged under the held lock, the rest queue


def produce(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for n in range(RECORDS):
        producer.produce(topic, value=b"%s-%06d" % (topic.encode(), n), partition=n % 2)
        if n % 5000 == 4999:
            producer.flush(30)
    assert producer.flush(30) == 0


def staging_folders(staging: Path) -> int:
    """The imports staging now. An import removes the table's staging folder when it leaves
    it empty, between the test's look for it and its listing."""
    try:
        return len(os.listdir(staging))
    except FileNotFoundError:
        return 0


def test_three_imports_at_once_into_one_sqlite_table_all_finish_with_every_record_once(
    broker, tmp_path: Path
) -> None:
    """The test holds the database's commit lock (`<db>-lagless.lock`, as an import holds it
    while it commits) until all three have staged a batch, so they are staging at once
    whatever the machine's speed (the first used to finish before the third started). Each
    starts once the one before stages (three Spark sessions starting at once on two cores
    time out waiting for their Python processes)."""
    broker.create_topics(["orders:2", "refunds:2"])
    for topic in ("orders", "refunds"):
        produce(broker.bootstrap, topic)
    url = f"sqlite:///{tmp_path}/d.db"
    staging = tmp_path / "d.db-lagless-staging" / "T"
    args = ["--bootstrap", broker.bootstrap, "--sink", url, "--table", "T", "--json"]
    args += ["--max-records-per-batch", "1000"]
    started: list[subprocess.Popen[str]] = []
    most_at_once = 0
    lock_path = f"{tmp_path}/d.db-lagless.lock"
    lock = open(lock_path, "a")  # noqa: SIM115 - held while the imports start
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        for more in (
            ["--topic", "orders", "--checkpoint", str(tmp_path / "a")],
            ["--topic", "orders", "--checkpoint", str(tmp_path / "b")],
            ["--topic", "refunds", "--checkpoint", str(tmp_path / "c")],
        ):
            started.append(
                subprocess.Popen(
                    [sys.executable, "-m", "lagless", "import", *args, *more],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and started[-1].poll() is None:
                staging_now = staging_folders(staging)
                most_at_once = max(most_at_once, staging_now)
                if staging_now == len(started):
                    break  # each import so far is staging a batch
                time.sleep(0.02)
        os.remove(lock_path)  # as an import lets go: its waiters then lock a file of their own
        lock.close()
        while any(process.poll() is None for process in started):
            most_at_once = max(most_at_once, staging_folders(staging))
            time.sleep(0.02)
        finished = [process.communicate() for process in started]
    finally:  # a failed look leaves none of them importing into the next tests' machine
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait()

    assert [process.returncode for process in started] == [0, 0, 0], [e for _, e in finished]
    assert most_at_once == 3  # all three staged at once, each in a folder of its own
    for out, _ in finished:
        assert json.loads(out.strip().splitlines()[-1])["records"] <= RECORDS
    rows = stored(url, "T", ("topic", "offset", "value"))
    assert len(rows) == len(set(rows)) == 2 * RECORDS  # every record, each once
    assert {value for _, _, value in rows} == {
        b"%s-%06d" % (topic, n) for topic in (b"orders", b"refunds") for n in range(RECORDS)
    }
    assert not (tmp_path / "d.db-lagless-staging").exists()  # each import cleared its own
