"""A SQLite file read from another process, while an import runs in this one.

The SQLite sink writes a batch through ADBC's own copy of SQLite. A read through the sqlite3
module in the same process opened beside that commit takes its journal for a crashed
writer's and rolls it back: the import fails with "disk I/O error", or the file is left
malformed (lagless/sinks/sqlite/__init__.py). A test that reads while an import runs in its
process reads here; one that reads after the import returned may use sqlite3 directly."""

from __future__ import annotations

import pickle
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

_READ = """
import pickle, sqlite3, sys
try:
    with sqlite3.connect(sys.argv[1], timeout=30) as conn:
        found = ("rows", conn.execute(sys.argv[2]).fetchall())
except sqlite3.OperationalError as exc:
    found = ("error", str(exc))
sys.stdout.buffer.write(pickle.dumps(found))
"""


def rows(path: str | Path, sql: str) -> list[tuple[Any, ...]]:
    """`sql`'s rows; sqlite3.OperationalError as the other process met it (no such table yet,
    a lock held beyond 30 s)."""
    done = subprocess.run(
        [sys.executable, "-c", _READ, str(path), sql], capture_output=True, check=True, timeout=60
    )
    kind, found = pickle.loads(done.stdout)
    if kind == "error":
        raise sqlite3.OperationalError(found)
    return list(found)
