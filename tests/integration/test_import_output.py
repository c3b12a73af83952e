"""What `lagless import` tells a user (issues 31.7, 34.2), from the CLI: the summary on stdout
names the absolute database file and the table, what was imported and what the table held,
and ends "up to date"; a rerun with nothing new says so without starting Spark; a relative
path that starts a new folder tree is told with both readings; a percent-escape in a SQLite
path is decoded."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from lagless.broker import EmbeddedBroker
from lagless.gen import explicit, produce_profile
from lagless.kafka.config import KafkaConfig

pytestmark = pytest.mark.spark

TOPIC = "orders"


def run_import(
    bootstrap: str, cwd: Path, log: str, *extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "lagless",
            "--log-file",
            str(cwd / log),
            "import",
            "--bootstrap",
            bootstrap,
            "--topic",
            TOPIC,
            "--sink",
            "sqlite:///data/p%20q.db",
            "--checkpoint",
            "ckpt",
            *extra,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_summary_says_where_the_rows_went_and_a_rerun_says_up_to_date_without_spark(
    tmp_path: Path,
) -> None:
    with EmbeddedBroker(topics={TOPIC: 2}) as broker:
        produce_profile(KafkaConfig(broker.bootstrap), TOPIC, explicit([30, 20]))

        first = run_import(broker.bootstrap, tmp_path, "first.log")

        assert first.returncode == 0, first.stderr
        database = tmp_path / "data" / "p q.db"  # the escape decoded; ./data, as written
        assert first.stderr.splitlines() == [
            f"lagless: warning: sqlite:///data/p%20q.db is the relative path {database} "
            "(three slashes); for the absolute path /data/p q.db, write "
            "sqlite:////data/p%20q.db"
        ]
        lines = first.stdout.splitlines()
        assert lines[0] == f"lagless import: {TOPIC} -> table '{TOPIC}' of {database}"
        assert lines[1].startswith("  imported        50 records")
        assert "  rows written    50" in lines and "  held before     nothing" in lines
        assert lines[-1] == "up to date"
        with sqlite3.connect(database) as conn:
            assert conn.execute(f"SELECT count(*) FROM {TOPIC}").fetchone() == (50,)

        again = run_import(broker.bootstrap, tmp_path, "again.log")

        assert again.returncode == 0 and again.stderr == "", again.stderr  # ./data exists now
        assert again.stdout.splitlines()[1:] == [
            "  imported        nothing new",
            f"  held before     {TOPIC}[0] up to offset 29, {TOPIC}[1] up to 19",
            "up to date",
        ]
        said = (tmp_path / "again.log").read_text()
        assert "nothing to import, up to date" in said
        assert " spark " not in said and "incubator" not in said  # no JVM was started

        as_json = run_import(broker.bootstrap, tmp_path, "json.log", "--json")

        body = json.loads(as_json.stdout)
        assert (body["destination"], body["table"], body["records"]) == (str(database), TOPIC, 0)
        assert body["held_before"] == {f"{TOPIC}[0]": 30, f"{TOPIC}[1]": 20}
        assert body["up_to_date"] is True


def test_records_deleted_before_an_import_read_them_are_told(tmp_path: Path) -> None:
    """Issue 34.3: the embedded broker keeps about 5 MB a partition and deletes the oldest
    records past it, as retention does: an import that finds a log starting above 0, where it
    never read, says so in one line (a fresh import of 726,918 records read 625,237 unsaid)."""
    with EmbeddedBroker(topics={TOPIC: 2}) as broker:
        produce_profile(KafkaConfig(broker.bootstrap), TOPIC, explicit([300, 200]))
        broker.delete_records(TOPIC, 0, 300)  # retention took all of partition 0
        broker.delete_records(TOPIC, 1, 200)  # and of partition 1: nothing left to import

        done = run_import(broker.bootstrap, tmp_path, "log")

    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"lagless: warning: the broker deleted 500 records of 2 partition(s) ({TOPIC}[0], "
        f"{TOPIC}[1]) before they were read: their logs start above offset 0 (retention)"
    )
    assert done.stdout.splitlines()[-1] == "up to date"
