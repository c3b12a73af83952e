"""`lagless demo` as a new user runs it: embedded broker, backlog, import into SQLite, lag 0."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from lagless.gen import build_profile

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
