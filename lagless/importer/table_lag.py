"""A table's own lag: what its ledger holds (sinks/ledger.py) against each partition's log,
whatever group or checkpoint wrote it (`lagless lag --sink URL`).

Per partition: the first offset the table does not hold, the log's start and end, the records
behind, and the time lag: now minus the timestamp of the oldest record not yet in the table.
For a Debezium mirror, also how far it is behind the database: now minus the `source.ts_ms`
(when the database committed it) of the oldest change not yet applied; 0 once caught up.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from lagless.cdc.envelope import source_ts_ms
from lagless.kafka import TP
from lagless.kafka.config import KafkaConfig
from lagless.kafka.offset_reader import OffsetReader
from lagless.kafka.records import RecordInfo
from lagless.sinks import Target, sink_from_url


@dataclass(frozen=True)
class PartitionInTable:
    topic: str
    partition: int
    # The first offset above what the table holds; None: it holds nothing of the partition.
    held: int | None
    log_start: int
    log_end: int
    # Records in the log the table does not hold (from the log start when it holds nothing).
    behind: int
    # Seconds since the oldest record the table does not hold was written; 0 when caught up,
    # None when that record could not be read (deleted meanwhile, or the read timed out).
    time_lag_s: float | None
    # A mirror's: seconds since the database committed the oldest change not yet applied; 0
    # when caught up; None when the records are not Debezium change events.
    source_lag_s: float | None = None

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def table_lag(
    kafka: KafkaConfig,
    sink_url: str,
    table: str,
    topics: list[str],
    now: float | None = None,
) -> list[PartitionInTable]:
    sink = sink_from_url(sink_url)
    target = Target(sink.table_name(table), "append", "raw")
    with sink, OffsetReader(kafka) as reader:
        partitions: list[TP] = reader.cluster.partitions(topics)
        held = sink.ledger(target, partitions)
        low, high = reader.log.watermarks(partitions)
        oldest_missing = {
            tp: max(held.get(tp, low[tp]), low[tp])
            for tp in partitions
            if max(held.get(tp, low[tp]), low[tp]) < high[tp]
        }
        # A few: a change's tombstone carries no source time.
        found = reader.records.at(oldest_missing, dict.fromkeys(oldest_missing, 3))
        newest = reader.records.at({tp: high[tp] - 1 for tp in partitions if high[tp] > 0})
    now = time.time() if now is None else now
    mirror = any(_committed_ms(found.get(tp) or newest.get(tp) or []) for tp in partitions)
    rows = []
    for tp in partitions:
        lag_s: float | None = 0.0
        source_lag_s: float | None = 0.0 if mirror else None
        if tp in oldest_missing:
            records = found.get(tp) or []
            stamp = records[0].timestamp_s if records else None
            lag_s = None if stamp is None else max(0.0, now - stamp)
            committed_ms = _committed_ms(records)
            if mirror:
                source_lag_s = None if committed_ms is None else max(0.0, now - committed_ms / 1000)
        start = max(held.get(tp, low[tp]), low[tp])
        rows.append(
            PartitionInTable(
                tp[0],
                tp[1],
                held.get(tp),
                low[tp],
                high[tp],
                max(0, high[tp] - start),
                lag_s,
                source_lag_s,
            )
        )
    return rows


def _committed_ms(records: list[RecordInfo]) -> int | None:
    """When the database committed the first change event among records; None: none is one."""
    for record in records:
        found = source_ts_ms(record.value)
        if found is not None:
            return found
    return None
