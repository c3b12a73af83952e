"""Issue 60's walkthrough: the first hour's rough edges, met in order in one fresh clone as a
newcomer meets them, each point shown by what lagless prints and leaves behind.

1. The setup says each phase (packages, the class archive) and why an archive is not built.
2. Help in the user's words: `lagless --version`, no internal name left unexplained, no option
   offered where it does nothing (tests/unit/test_cli_help.py checks every cross-reference).
3. A continuous import with its output in a file says how often it prints and where its log
   is, then a line per batch at most every 60 s (tests/unit/test_import_summary.py: the
   minute), the first one named as holding Spark's start; its log is a file of its own
   checkpoint's under $XDG_STATE_HOME/lagless/imports/, not one shared by every lagless.
4. The doctor reads a lagless import that has ended as ended, not as a stuck consumer, and says
   nothing about DescribeGroups, which the embedded broker does not answer.
5. `lag` says on a terminal that it samples, and for how long; in a pipe, only its answer.

The clone is `git clone` of this checkout, its `.venv` the installed one (as
tests/integration/test_setup.py: a real install takes minutes and ~2 GB); the broker is the
embedded one over TCP; the imports run Spark.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from lagless.broker import EmbeddedBroker
from tests.harness.setup_stamp import skip_unless_installed_by_setup

pytestmark = pytest.mark.spark  # the import starts Spark

ROOT = Path(__file__).resolve().parents[2]
GROUP = "orders-import"
RECORDS = 400
INTERNAL = ("noida", "field report")


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    skip_unless_installed_by_setup()  # the setup would install into this venv, shared
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to clone")
    folder = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(folder)], check=True, timeout=120)
    (folder / ".venv").symlink_to(sys.prefix)
    return folder


def lagless(clone: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(clone / ".venv" / "bin" / "lagless"), *args],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def on_a_terminal(command: list[str], env: dict[str, str], timeout_s: float = 120) -> str:
    """What `command` prints with a terminal for its stdout and stderr (a pseudo-terminal)."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(command, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    printed = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the process closed the terminal
                break
            if not chunk:
                break
            printed += chunk
        elif process.poll() is not None:
            break
    os.close(leader)
    assert process.wait(timeout=30) == 0, printed
    return printed.decode(errors="replace")


def produce(bootstrap: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for n in range(RECORDS):
        producer.produce("orders", key=f"k{n}".encode(), value=b'{"n": %d}' % n, partition=n % 4)
    assert producer.flush(30) == 0


def rows(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db) as connection:
            return int(connection.execute("SELECT count(*) FROM orders").fetchone()[0])
    except sqlite3.OperationalError:  # not created yet
        return 0


def test_the_first_hours_edges_walked_through_in_a_fresh_clone(clone: Path, tmp_path: Path):
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "LAGLESS_CLASS_ARCHIVE": "off",
        "TERM": "xterm",
    }
    env.pop("LAGLESS_LOG_FILE", None)

    # 1. The setup, a line per phase.
    setup = subprocess.run(
        [str(clone / "scripts" / "setup")], env=env, capture_output=True, text=True, timeout=120
    )
    assert setup.returncode == 0, setup.stderr
    assert setup.stderr.splitlines() == [
        "setup: packages: installed already (pyproject.toml unchanged since)",
        "setup: class archive: turned off (LAGLESS_CLASS_ARCHIVE=off)",
    ]

    # 2. Help in the user's words.
    version = lagless(clone, env, "--version")
    assert version.returncode == 0 and re.fullmatch(r"lagless \S+\n", version.stdout)
    for command in ("gen", "demo"):
        helped = lagless(clone, env, command, "--help")
        assert helped.returncode == 0
        for word in INTERNAL:  # said, then explained: "(a Kafka ...)", "(a broker ...)"
            for line in [n for n in helped.stdout.splitlines() if word in n.lower()]:
                assert "(" in line, (command, line)
    assert "--target-file-size" not in lagless(clone, env, "lag", "--help").stdout

    with EmbeddedBroker(topics={"orders": 4}) as broker:
        produce(broker.bootstrap)
        # 3. A continuous import, its output in a file: progress lines as it runs.
        out = tmp_path / "import.out"
        with out.open("w") as printed:
            running = subprocess.Popen(
                [
                    str(clone / ".venv" / "bin" / "lagless"),
                    *("import", "--bootstrap", broker.bootstrap, "--topic", "orders"),
                    *("--sink", "sqlite:///orders.db", "--checkpoint", "ckpt/orders"),
                    *("--group", GROUP, "--mode", "continuous", "--trigger-seconds", "1"),
                ],
                cwd=clone,
                env=env,
                stdout=printed,
                stderr=subprocess.PIPE,
                text=True,
            )
        deadline = time.monotonic() + 240
        while rows(clone / "orders.db") < RECORDS or "batch of" not in out.read_text():
            assert running.poll() is None, running.communicate()[1]
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(1)
        running.send_signal(signal.SIGINT)
        _, stderr = running.communicate(timeout=120)
        assert running.returncode == 0, stderr
        # Said while it ran: how often it prints and where its log is, then the first batch,
        # named as the one that holds Spark's start (its rate is not the import's).
        opening, first, *_ = out.read_text().splitlines()
        logs = list((tmp_path / "state" / "lagless" / "imports").glob("orders-*.log"))
        assert len(logs) == 1, logs
        assert "following the topics" in opening and "a line per 60 s at most" in opening
        assert str(logs[0]) in opening
        assert f"batch of {RECORDS} records  (the first: Spark's start in it)" in first
        assert "stopping after the batch in flight" in logs[0].read_text()
        assert not (tmp_path / "state" / "lagless" / "lagless.log").exists()  # not shared

        # 4. The doctor on the import that ended, records having come since: lag, and commits
        # that no longer move, as a stuck consumer's would.
        produce(broker.bootstrap)
        doctor = lagless(
            clone,
            env,
            "doctor",
            "--bootstrap",
            broker.bootstrap,
            "--group",
            GROUP,
            "--seconds",
            "2",
        )
        assert doctor.returncode == 0, doctor.stderr
        assert f"no lagless import is committing group {GROUP}" in doctor.stdout, doctor.stdout
        assert "fix: run the same import again" in doctor.stdout
        assert "stuck" not in doctor.stdout and "DescribeGroups" not in doctor.stdout

        # 5. `lag` says it samples, on a terminal only.
        asked = ["lag", "--bootstrap", broker.bootstrap, "--group", GROUP, "--window", "1"]
        seen = on_a_terminal([str(clone / ".venv" / "bin" / "lagless"), *asked], env)
        assert f"sampling group {GROUP} for 1 s" in seen, seen
        piped = lagless(clone, env, *asked)
        assert piped.returncode == 0, piped.stderr
        assert "sampling" not in piped.stdout + piped.stderr
        assert GROUP in piped.stdout
