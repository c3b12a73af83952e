"""`lagless demo` as a new user runs it: embedded broker, backlog, import into SQLite, lag 0."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from lagless.cli.demo import DEALS_TOPIC, DEMO_DEAL_BYTES, DEMO_DEALS_PER_PARTITION
from lagless.gen import build_profile, produce_profile
from lagless.gen.deals import DealRecords
from lagless.kafka.config import KafkaConfig

pytestmark = pytest.mark.spark


def test_demo_drains_the_backlog_and_stores_every_record(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "lagless", "demo", "--scale", "0.2", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    produced = build_profile("seed-000", partitions=24, scale=0.2)
    with sqlite3.connect(tmp_path / "demo.db") as conn:
        stored = conn.execute('SELECT count(*) FROM "statements"').fetchone()[0]
        partitions = conn.execute('SELECT count(DISTINCT "partition") FROM "statements"').fetchone()
    assert stored == produced.total_records
    assert partitions == (sum(1 for count in produced.counts if count),)
    said = " ".join(result.stdout.split())  # rich wraps lines at the terminal's width
    assert "after the import" in said
    assert f"{stored:,} rows in" in said
    # Not a terminal: the tables are printed whole, their titles on one line.
    titles = [line.strip() for line in result.stdout.splitlines()]
    assert "lag of group 'lagless-demo' after the import" in titles, result.stdout


def test_demo_without_out_leaves_nothing_in_the_temporary_folder(tmp_path: Path) -> None:
    """Its database and checkpoint (~220 MB at the default scale) go when it ends."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "lagless", "demo", "--scale", "0.05"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(temporary)},
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    said = " ".join(result.stdout.split())
    assert "rows in" in said and "--out DIR keeps the database" in said
    assert list(temporary.iterdir()) == []


def test_demo_typed_upserts_deals_into_a_typed_table(tmp_path: Path, broker) -> None:
    """The same deals produced again (gen is deterministic) to the test's broker say what the
    demo's table must hold: each deal at its newest version, deleted deals absent."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "lagless",
            "demo",
            "--typed",
            "--scale",
            "0.5",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:] + result.stdout[-3000:]
    profile = build_profile("deals", partitions=0, scale=0.5, record_bytes=DEMO_DEAL_BYTES)
    broker.create_topic(DEALS_TOPIC, profile.partitions)
    produced = produce_profile(
        KafkaConfig(broker.bootstrap),
        DEALS_TOPIC,
        profile,
        keys=DEMO_DEALS_PER_PARTITION,
        compression="zstd",
        shape=DealRecords("json"),
    )
    expected = {
        int(key): json.loads(record.value)["version"]
        for key, record in produced.newest_by_key().items()
    }
    with sqlite3.connect(tmp_path / "demo.db") as conn:
        stored = dict(conn.execute('SELECT deal_id, version FROM "deals"').fetchall())
        deleted = {row[0] for row in conn.execute('SELECT deal_id FROM "deals_tombstones"')}
        columns = [row[1] for row in conn.execute('PRAGMA table_info("deals")')]
    assert stored == expected
    assert {int(key) for key in produced.deleted_keys()} <= deleted
    assert columns[-4:] == ["price", "updated_at", "options", "log_time"]  # the rank last
    said = " ".join(result.stdout.split())
    assert f"{len(expected):,} deals in" in said
    assert f"from {produced.records:,} records read" in said


def test_demo_mirror_says_in_one_line_what_is_missing(tmp_path: Path) -> None:
    """Without Java on the PATH: one line naming it and how to install it, exit 2."""
    result = subprocess.run(
        [sys.executable, "-m", "lagless", "demo", "--mirror"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": str(tmp_path)},
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "no Java" in lines[0] and "apt-get install" in lines[0]
