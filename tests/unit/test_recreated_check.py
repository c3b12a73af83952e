"""What the recreated-topic check asks the log (importer/table_lag.history_of_another_topic):
only offsets the log still holds, so a partition retention emptied does not hold the import
up for the read's timeout. The store and the log are stand-ins here (the CLI cases on noida-db:
tests/integration/test_recreated_topic.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from lagless.importer.table_lag import history_of_another_topic
from lagless.kafka.records import RecordInfo, Records
from lagless.sinks import Sink, Target
from lagless.sinks.ledger import TP, HeldRecord

A, B, C = ("t", 0), ("t", 1), ("t", 2)
TARGET = Target("t", "append", "raw")


class Table:
    def newest_rows(self, target: Target, held: Mapping[TP, int]) -> dict[TP, HeldRecord]:
        return {tp: HeldRecord(top - 1, 1000 + top, b"k") for tp, top in held.items()}


class Log:
    def __init__(self) -> None:
        self.asked: dict[TP, int] = {}

    def at(self, starts: Mapping[TP, int]) -> dict[TP, list[RecordInfo]]:
        self.asked = dict(starts)
        return {
            tp: [RecordInfo(None, 1, offset=offset, timestamp_ms=5, key=b"k")]
            for tp, offset in starts.items()
        }


def test_only_offsets_the_log_holds_are_read() -> None:
    log = Log()
    held = {A: 10, B: 10, C: 10}
    low = {A: 0, B: 10, C: 0}  # B: retention removed everything the table holds
    high = {A: 20, B: 10, C: 9}  # C: the log ends below (the ledger's own check refuses it)

    found = history_of_another_topic(
        cast(Sink, Table()), TARGET, cast(Records, cast(Any, log)), held, low, high
    )

    assert log.asked == {A: 9}
    assert [each.tp for each in found] == [A]  # timestamp 1010 held, 5 in the log
