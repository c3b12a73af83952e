"""`lagless lag --sink` measures the lag of the moment it read the table's ledger.

What it reads after (the records behind, the recreated-topic check, which scans an Iceberg
table with its deletes) took seconds on a big table, and was counted as lag: a mirror 1 s
behind showed 3-4 s in bench/mirror.py. Real embedded broker over TCP and a real SQLite table;
the slow check is made slow here by a sleep, the one thing faked.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from lagless.broker import EmbeddedBroker
from lagless.importer import table_lag as module
from lagless.importer.table_lag import table_lag
from lagless.kafka.config import KafkaConfig

BEHIND_S = 3.0
CHECK_S = 2.0


def test_the_time_the_checks_take_is_not_lag(
    broker: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker.create_topic("db.public.accounts", 1)
    committed_ms = int((time.time() - BEHIND_S) * 1000)
    event = {"op": "u", "after": {"id": 1}, "source": {"ts_ms": committed_ms, "lsn": 7}}
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce("db.public.accounts", json.dumps(event).encode(), b'{"id":1}')
    assert producer.flush(10) == 0
    checked = []

    def slow_check(*args: Any) -> list[Any]:
        time.sleep(CHECK_S)
        checked.append(True)
        return []

    monkeypatch.setattr(module, "history_of_another_topic", slow_check)
    rows = table_lag(
        KafkaConfig(broker.bootstrap),
        f"sqlite:///{tmp_path}/mirror.db",
        "accounts",
        ["db.public.accounts"],
    )
    assert checked
    [row] = rows
    assert row.behind == 1
    assert row.source_lag_s is not None
    assert BEHIND_S - 0.5 < row.source_lag_s < BEHIND_S + CHECK_S - 0.5


def test_a_sampler_may_leave_the_recreated_topic_check_out(
    broker: EmbeddedBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench/mirror.py samples the lag each second: the check read the table and the log
    (0.2 s of CPU a call on a 1M-row Iceberg mirror) and is not part of the lag."""
    broker.create_topic("db.public.orders", 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce("db.public.orders", b'{"op": "c", "after": {"id": 1}}', b'{"id":1}')
    assert producer.flush(10) == 0
    checked = []
    monkeypatch.setattr(module, "history_of_another_topic", lambda *a: checked.append(1) or [])
    lag = (
        KafkaConfig(broker.bootstrap),
        f"sqlite:///{tmp_path}/m.db",
        "orders",
        ["db.public.orders"],
    )
    [row] = table_lag(*lag, check_recreated=False)
    assert row.behind == 1 and not checked
    table_lag(*lag)
    assert checked
