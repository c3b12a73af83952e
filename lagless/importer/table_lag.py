"""A table's own lag: what its ledger holds (sinks/ledger.py) against each partition's log,
whatever group or checkpoint wrote it (`lagless lag --sink URL`).

Per partition: the first offset the table does not hold, the log's start and end, the records
behind, and the time lag: now minus the timestamp of the oldest record not yet in the table.
For a Debezium mirror, also how far it is behind the database: now minus the `source.ts_ms`
(when the database committed it) of the oldest change not yet applied; 0 once caught up.
Per table of a folder store: its files (`table_health`, sinks/maintenance.py).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from lagless.cdc.envelope import source_ts_ms
from lagless.kafka import TP, Offsets
from lagless.kafka.config import KafkaConfig
from lagless.kafka.offset_reader import OffsetReader
from lagless.kafka.records import RecordInfo, Records
from lagless.sinks import Sink, Target, maintenance_of, sink_from_url
from lagless.sinks.ledger import HeldRecord, Recreated, recreated
from lagless.sinks.maintenance import Health, Policy


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
    # The table holds another topic's history: the topic was deleted and recreated since
    # (ledger.recreated); what it says, else None.
    another_topic: str | None = None
    # Records below what the table holds that it never took (Sink.skipped: deleted before they
    # were read, --skip-lost-offsets), and records above it the log no longer holds (deleted
    # before any import read them): either makes the table incomplete.
    skipped: int = 0
    deleted_unread: int = 0

    @property
    def incomplete(self) -> bool:
        return self.skipped > 0 or self.deleted_unread > 0

    def as_json(self) -> dict[str, object]:
        return {**asdict(self), "incomplete": self.incomplete}


def table_lag(
    kafka: KafkaConfig,
    sink_url: str,
    table: str,
    topics: list[str],
    now: float | None = None,
    check_recreated: bool = True,
) -> list[PartitionInTable]:
    """Each partition's lag in the table; `check_recreated=False` leaves out the recreated-topic
    check (its `another_topic` None), which reads the table's newest rows and the log at each:
    a cost for a caller sampling the lag every second (0.2 s of CPU a call on a 1M-row Iceberg
    mirror here), not part of the lag."""
    sink = sink_from_url(sink_url)
    target = Target(sink.table_name(table), "append", "raw")
    with sink, OffsetReader(kafka) as reader:
        seen = _look(sink, target, reader, topics, check_recreated)
    now = seen.looked_at if now is None else now
    mirror = any(
        _committed_ms(seen.missing.get(tp) or seen.newest.get(tp) or []) for tp in seen.partitions
    )
    return [_row(seen, tp, now, mirror) for tp in seen.partitions]


@dataclass
class _Seen:
    """What table_lag read: the table's ledger and the log, at one moment."""

    partitions: list[TP]
    held: dict[TP, int]
    low: dict[TP, int]
    high: dict[TP, int]
    looked_at: float
    # The first records the table lacks (a few: a change's tombstone carries no source time).
    missing: dict[TP, list[RecordInfo]]
    newest: dict[TP, list[RecordInfo]]
    differs: dict[TP, str]
    skipped: dict[TP, int]

    def start(self, tp: TP) -> int:
        """The first offset the table lacks that the log still holds."""
        return max(self.held.get(tp, self.low[tp]), self.low[tp])


def _look(
    sink: Sink, target: Target, reader: OffsetReader, topics: list[str], check_recreated: bool
) -> _Seen:
    partitions: list[TP] = reader.cluster.partitions(topics)
    held = sink.ledger(target, partitions)
    skipped = sink.skipped(target, partitions)
    # The lag is of this moment: what follows (the records, the recreated-topic check, which
    # scans an Iceberg table) takes seconds on a big table, and is not lag.
    looked_at = time.time()
    low, high = reader.log.watermarks(partitions)
    seen = _Seen(partitions, held, low, high, looked_at, {}, {}, {}, skipped)
    behind = {tp: seen.start(tp) for tp in partitions if seen.start(tp) < high[tp]}
    seen.missing = reader.records.at(behind, dict.fromkeys(behind, 3))
    seen.newest = reader.records.at({tp: high[tp] - 1 for tp in partitions if high[tp] > 0})
    if check_recreated:
        found = history_of_another_topic(sink, target, reader.records, held, low, high)
        seen.differs = {each.tp: str(each) for each in found}
    return seen


def _row(seen: _Seen, tp: TP, now: float, mirror: bool) -> PartitionInTable:
    lag_s: float | None = 0.0
    source_lag_s: float | None = 0.0 if mirror else None
    start = seen.start(tp)
    if start < seen.high[tp]:
        records = seen.missing.get(tp) or []
        stamp = records[0].timestamp_s if records else None
        lag_s = None if stamp is None else max(0.0, now - stamp)
        committed_ms = _committed_ms(records)
        if mirror:
            source_lag_s = None if committed_ms is None else max(0.0, now - committed_ms / 1000)
    return PartitionInTable(
        tp[0],
        tp[1],
        seen.held.get(tp),
        seen.low[tp],
        seen.high[tp],
        max(0, seen.high[tp] - start),
        lag_s,
        source_lag_s,
        seen.differs.get(tp),
        seen.skipped.get(tp, 0),
        max(0, seen.low[tp] - seen.held[tp]) if tp in seen.held else 0,
    )


def _committed_ms(records: list[RecordInfo]) -> int | None:
    """When the database committed the first change event among records; None: none is one."""
    for record in records:
        found = source_ts_ms(record.value)
        if found is not None:
            return found
    return None


def history_of_another_topic(
    sink: Sink, target: Target, records: Records, held: Offsets, low: Offsets, high: Offsets
) -> list[Recreated]:
    """The partitions whose newest row in the table is not the log's record at its offset
    now (ledger.recreated): the topic was deleted and recreated since. Only offsets the log
    still holds (`low`, `high`: its watermarks) are read: a record retention removed tells
    nothing, and waiting for it would only hold the import up."""
    newest = {
        tp: row
        for tp, row in sink.newest_rows(target, held).items()
        if low.get(tp, 0) <= row.offset < high.get(tp, 0)
    }
    if not newest:
        return []
    found = records.at({tp: row.offset for tp, row in newest.items()})
    now = {
        tp: HeldRecord(seen[0].offset, seen[0].timestamp_ms, seen[0].key)
        for tp, seen in found.items()
        if seen
    }
    return recreated(newest, now)


def unknown_rows(sink_url: str, table: str) -> int | None:
    """A mirror's rows whose values it cannot know (Sink.unknown_rows); None: the table marks
    none (not a mirror, or one without a column Debezium may send as its placeholder)."""
    sink = sink_from_url(sink_url)
    with sink:
        return sink.unknown_rows(sink.table_name(table))


def table_health(sink_url: str, table: str, policy: Policy) -> list[Health]:
    """The files of the table and of those beside it (`_dlq`, `_tombstones`): data files,
    small ones, versions kept, bytes on disk against live bytes. None for a store that keeps
    its own files (SQL)."""
    sink = sink_from_url(sink_url)
    with sink:
        maintenance = maintenance_of(sink)
        if maintenance is None:
            return []
        found = (maintenance.health(each, policy) for each in maintenance.tables(table))
        return [each for each in found if each is not None]
