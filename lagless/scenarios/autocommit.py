"""Report 004, auto-commit before processing: the consumer commits what it was handed, not
what it wrote. One crash after writing repeats records at the restart; one crash before
writing loses records for good. The broker shows only the second: committed offsets ahead of
what the table holds (`lagless lag --sink`); the repeats are invisible from outside."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

from lagless.exceptions import TerminalError
from lagless.importer.table_lag import table_lag
from lagless.kafka.config import KafkaConfig
from lagless.kafka.offset_reader import OffsetReader
from lagless.lag.doctor import Finding
from lagless.scenarios import autocommit_app
from lagless.scenarios.base import Scenario, create_topic, produce

RECORDS = 200


class AutoCommit(Scenario):
    name = "004"
    title = (
        "a consumer with enable.auto.commit writes records into SQLite; it crashes after "
        "writing (the restart repeats them), then crashes after an auto-commit, before writing"
    )
    cure = (
        "lagless import resumes from what the table's ledger holds, not from the group's "
        "commits: it fills the gap, and a repeat is never stored twice"
    )
    partitions = autocommit_app.PARTITIONS

    def __init__(self) -> None:
        self.runs: list[dict[str, int]] = []

    def produce(self, config: KafkaConfig) -> int:
        create_topic(config, self.topic, self.partitions)
        records = {
            p: [(f"order-{p}-{n}".encode(), f"order {n}".encode()) for n in range(RECORDS)]
            for p in range(self.partitions)
        }
        return produce(config, self.topic, records)

    def misbehave(
        self, config: KafkaConfig, sink_url: str, ready: threading.Event, stop: threading.Event
    ) -> None:
        for mode in ("repeat", "lose"):
            done = subprocess.run(
                [sys.executable, "-m", autocommit_app.__name__, config.bootstrap, sink_url, mode],
                capture_output=True,
                text=True,
                timeout=60,
            )
            lines = done.stdout.strip().splitlines()
            if done.returncode != 1 or not lines:
                raise TerminalError(
                    f"004's consumer did not crash as planned: {done.stderr[-500:]}"
                )
            self.runs.append(json.loads(lines[-1]))
        ready.set()
        stop.wait()

    def broker_findings(self, config: KafkaConfig, sink_url: str) -> list[Finding]:
        rows = table_lag(config, sink_url, self.topic, [self.topic])
        with OffsetReader(config) as reader:
            committed = reader.groups.committed(self.group, [(r.topic, r.partition) for r in rows])
        ahead = {}
        for row in rows:
            commit = committed.get((row.topic, row.partition))
            holds = row.log_start if row.held is None else row.held
            if commit is not None and commit > holds:
                ahead[f"{row.topic}:{row.partition}"] = (commit, holds)
        if not ahead:
            return []
        skipped = sum(c - h for c, h in ahead.values())
        shown = ", ".join(
            f"{k} committed {c}, table holds below {h}" for k, (c, h) in ahead.items()
        )
        repeated = sum(run["repeated"] for run in self.runs)
        return [
            Finding(
                "commits-ahead-of-sink",
                f"{shown}: the group committed {skipped} records its table never got — "
                "offsets committed before processing (auto-commit), then a crash; the group "
                "will not read them again. (Repeats are invisible to the broker: here the "
                f"restart read {repeated} records the table already held.)",
                "commit after writing (enable.auto.commit=false, or "
                "enable.auto.offset.store=false and store offsets once written); refill the "
                "table from its own ledger: lagless import into it reads from what it holds",
            )
        ]
