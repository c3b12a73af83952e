"""A Delta table's log as lagless writes it: the actions of the entries it puts itself (an
upsert's, upsert.py; a compaction's, maintenance.py) and the ledger it keeps there.

The ledger is an application transaction per topic partition (app id `lagless:<topic>:
<partition>`, version = the first offset above the batches the table holds) and, for upserts,
one per partition whose version is its log time (upsert_order.py). delta-rs commits them with
an append (`CommitProperties.app_transactions`); lagless's own entries carry them as `txn`
actions, the same thing in the log.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from lagless.sinks.base import RowRule
from lagless.sinks.ledger import TP, Batch, Verdict, verdict
from lagless.sinks.maintenance import DataFile

if TYPE_CHECKING:
    import pyarrow.parquet as pq
    from deltalake import DeltaTable

    from lagless.sinks.storage import LocalStorage, S3Storage

LOG = "_delta_log"
# Writer features whose tables lagless's entries keep valid; any other (row tracking, deletion
# vectors, in-commit timestamps...) asks more of a writer than an add and a remove.
KNOWN_FEATURES = {
    "appendOnly",
    "changeDataFeed",
    "invariants",
    "checkConstraints",
    "generatedColumns",
    "timestampNtz",
}
# The types of partition columns an append splits its files by (DeltaSink._partitioned): their
# values name folders as they are (text would need escaping, which readers differ on).
PARTITION_TYPES = {"byte", "short", "integer", "long"}
# Reader features lagless's readers (delta-rs, polars) take.
READ_FEATURES = {"timestampNtz"}
# What a log entry of lagless's does to the table's rows: keeps them, adds some, or replaces
# some (unwritable).
Writes = Literal["compaction", "append", "upsert"]
# More entries than this after the version read: asking delta-rs again is cheaper than reading
# them one by one (on S3, a request each).
ENTRIES_TO_CATCH_UP = 32
# The commit information's key that holds a batch's ranges (for people reading the log).
RANGES = "lagless.ranges"


def app_id(tp: TP) -> str:
    """The application transaction that holds a partition's place in the table's log."""
    return f"lagless:{tp[0]}:{tp[1]}"


def log_time_id(tp: TP) -> str:
    """The application transaction whose version is an upsert partition's log time."""
    return f"lagless-log-time:{tp[0]}:{tp[1]}"


def skipped_id(tp: TP) -> str:
    """The application transaction whose version is the records a partition's batches skipped
    (Batch.skipped), all told."""
    return f"lagless-skipped:{tp[0]}:{tp[1]}"


def transactions(batch: Batch, skipped: Mapping[TP, int]) -> list[tuple[str, int]]:
    """The application transactions a commit of the batch records: its ranges' ends, its
    partitions' log times, and the offsets skipped all told where it skips some
    (AppTransactions.skipped_after)."""
    ranges = batch.covered
    ends = [(app_id(tp), end) for tp, (_, end) in ranges.items()]
    times = [(log_time_id(tp), ms) for tp, ms in sorted(batch.log_times.items()) if tp in ranges]
    return ends + times + [(skipped_id(tp), n) for tp, n in sorted(skipped.items())]


class AppTransactions:
    """The application transactions of the tables a sink writes (the ledger), kept current.

    delta-rs answers one app id a call, each replaying the log's transactions (0.5-1.4 ms): a
    mirror of 128 partitions spent 0.35 s of each batch asking twice. Here a table's versions
    are read once through delta-rs, then brought to each later version by the `txn` actions of
    the entries in between (a commit is one JSON file of actions, one a line; the latest `txn`
    of an app id is its version). A table made again under the same name (another table id),
    an entry gone from the log, an older version than the one known, or one far ahead is read in
    full again."""

    def __init__(self, storage: LocalStorage | S3Storage) -> None:
        self.storage = storage
        # Per table folder: the table's id, the version read, each app id's version there.
        self._known: dict[str, tuple[str, int, dict[str, int | None]]] = {}

    def held(self, delta: DeltaTable, folder: str, partitions: Iterable[TP]) -> dict[TP, int]:
        """The first offset above what the table holds, per partition it holds any of."""
        wanted = {tp: app_id(tp) for tp in partitions}
        versions = self.versions(delta, folder, list(wanted.values()))
        return {tp: v for tp, name in wanted.items() if (v := versions[name]) is not None}

    def versions(self, delta: DeltaTable, folder: str, names: list[str]) -> dict[str, int | None]:
        # str(): delta-rs types the id as an int, and it is the table UUID, a str.
        table_id, version = str(delta.metadata().id), delta.version()
        known = self._caught_up(folder, table_id, version)
        for name in names:
            if name not in known:
                known[name] = delta.transaction_version(name)
        self._known[folder] = (table_id, version, known)
        return {name: known[name] for name in names}

    def skipped(self, delta: DeltaTable, folder: str, partitions: Iterable[TP]) -> dict[TP, int]:
        """The offsets each partition's ledger skipped, all told (none: left out)."""
        wanted = {tp: skipped_id(tp) for tp in partitions}
        versions = self.versions(delta, folder, list(wanted.values()))
        return {tp: v for tp, name in wanted.items() if (v := versions[name])}

    def skipped_after(self, delta: DeltaTable, folder: str, batch: Batch) -> dict[TP, int]:
        """What `transactions` records for a batch that skipped records (Batch.skipped): each
        such partition's skipped records all told once the batch is in."""
        gaps = {tp: n for tp, n in batch.skipped.items() if n and tp in batch.covered}
        before = self.skipped(delta, folder, gaps) if gaps else {}
        return {tp: before.get(tp, 0) + n for tp, n in gaps.items()}

    def is_replay(self, delta: DeltaTable, folder: str, batch: Batch) -> bool:
        """The log holds the batch's offsets already (ledger.verdict; raises ConcurrentImport
        when it holds part of them)."""
        return verdict(batch, self.held(delta, folder, batch.covered)) is Verdict.REPLAY

    def _caught_up(self, folder: str, table_id: str, version: int) -> dict[str, int | None]:
        """What is known of the table's app ids at `version` without asking delta-rs: the
        entries after the version read, applied; nothing when they cannot be."""
        if folder not in self._known:
            return {}
        known_id, read_at, versions = self._known[folder]
        if known_id != table_id or not 0 <= version - read_at <= ENTRIES_TO_CATCH_UP:
            return {}
        versions = dict(versions)
        for entry in range(read_at + 1, version + 1):
            text = self.storage.read_text(self.storage.join(folder, LOG, f"{entry:020d}.json"))
            if text is None:
                return {}
            for line in text.splitlines():
                action = json.loads(line).get("txn") if '"txn"' in line else None
                if action is not None:
                    versions[action["appId"]] = int(action["version"])
        return versions


def unwritable(delta: DeltaTable, writes: Writes = "compaction") -> str | None:
    """Why lagless's entries would not be valid in this table; None: they are. A compaction
    keeps the rows; an append adds rows, which must keep the table's rules on rows (CHECK
    constraints and invariants, which lagless evaluates: row_rules; generated columns, which it
    does not compute); an upsert also removes rows, which a table may forbid or expect told
    apart (a change data feed)."""
    protocol = delta.protocol()
    metadata = delta.metadata()
    partitioned = _unwritten_partitions(delta, writes)
    if partitioned:
        return partitioned
    mapping = metadata.configuration.get("delta.columnMapping.mode", "none")
    if mapping != "none":
        return f"it maps column names (delta.columnMapping.mode={mapping})"
    idle = _idle_features(delta)
    features = set(protocol.writer_features or ()) - idle
    if protocol.min_writer_version > 4 and not (
        protocol.min_writer_version == 7 and features <= KNOWN_FEATURES
    ):
        named = ", ".join(sorted(features - KNOWN_FEATURES)) or "its legacy features"
        return f"writer protocol {protocol.min_writer_version} ({named})"
    readers = set(protocol.reader_features or ()) - idle
    if protocol.min_reader_version > 1 and not (
        protocol.min_reader_version == 3 and readers <= READ_FEATURES
    ):
        named = ", ".join(sorted(readers - READ_FEATURES)) or "column mapping"
        return f"reader protocol {protocol.min_reader_version} ({named})"
    if writes == "compaction":
        return None
    return _rules_for_rows(delta) or (_rules_for_removals(delta) if writes == "upsert" else None)


def _unwritten_partitions(delta: DeltaTable, writes: Writes) -> str | None:
    """Why lagless would not write the table's partitions: an append splits its files by
    partition columns of integers (DeltaSink._partitioned); an upsert's and a compaction's
    entries write none."""
    columns = delta.metadata().partition_columns
    if not columns:
        return None
    named = ", ".join(columns)
    if writes != "append":
        return f"it is partitioned by {named}, and lagless's {writes}s write no partitions"
    types = {f["name"]: f["type"] for f in json.loads(delta.schema().to_json())["fields"]}
    others = [c for c in columns if types.get(c) not in PARTITION_TYPES]
    if others:
        return f"it is partitioned by {', '.join(others)}, of a type lagless does not split by"
    return None


def _idle_features(delta: DeltaTable) -> set[str]:
    """Features the table lists that ask nothing of lagless's entries: variantType without a
    variant column (delta-rs 1.6 lists it on a protocol 7 table whenever it sets a table
    property, as lagless's expiry does: `alter.set_table_properties`)."""
    return set() if '"variant"' in delta.schema().to_json() else {"variantType"}


def row_rules(delta: DeltaTable) -> tuple[RowRule, ...]:
    """The table's rules on each row a writer adds: its CHECK constraints (by name) and the
    invariants of its top-level columns (by column), each a Spark SQL condition. lagless
    evaluates them on the shaped rows (importer/rows.py) and dead-letters a row that breaks one."""
    configured = delta.metadata().configuration
    rules = [
        RowRule(name.removeprefix("delta.constraints."), rule)
        for name, rule in sorted(configured.items())
        if name.startswith("delta.constraints.")
    ]
    for field in json.loads(delta.schema().to_json())["fields"]:
        invariant = field["metadata"].get("delta.invariants")
        if invariant is not None:
            condition = json.loads(invariant)["expression"]["expression"]
            rules.append(RowRule(f"invariant of {field['name']}", condition))
    return tuple(rules)


def _rules_for_rows(delta: DeltaTable) -> str | None:
    """The table's rules on the rows a writer adds that lagless does not keep (row_rules it
    evaluates)."""
    fields = json.loads(delta.schema().to_json())["fields"]
    generated = [f["name"] for f in fields if "delta.generationExpression" in f["metadata"]]
    if generated:
        return f"it has generated columns ({', '.join(generated)}), which lagless does not compute"
    nested = [f["name"] for f in fields if '"delta.invariants"' in json.dumps(f["type"])]
    if nested:
        return f"it has invariants inside {', '.join(nested)}, which lagless does not evaluate"
    identity = [f["name"] for f in fields if "delta.identity.start" in f["metadata"]]
    if identity:
        return f"it has identity columns ({', '.join(identity)}), which lagless does not fill"
    return None


def _rules_for_removals(delta: DeltaTable) -> str | None:
    configured = delta.metadata().configuration
    if configured.get("delta.appendOnly") == "true":
        return "it is append-only"
    if configured.get("delta.enableChangeDataFeed") == "true":
        return "it keeps a change data feed"
    return None


def commit_info(
    operation: str, read_version: int, now: int, metrics: dict[str, int], **extra: str
) -> dict[str, Any]:
    return {
        "commitInfo": {
            "timestamp": now,
            "operation": operation,
            "operationParameters": {},
            "readVersion": read_version,
            "isBlindAppend": False,
            "operationMetrics": metrics,
            "clientVersion": "lagless",
            **extra,
        }
    }


def txn(application: str, version: int, now: int) -> dict[str, Any]:
    return {"txn": {"appId": application, "version": version, "lastUpdated": now}}


def add(
    storage: LocalStorage | S3Storage, folder: str, path: str, data_change: bool
) -> dict[str, Any]:
    """An add action for a file in the table's folder, statistics from its Parquet footer."""
    size, modified = storage.stat(path)
    return {
        "add": {
            "path": path[len(folder) + 1 :],
            "partitionValues": {},
            "size": size,
            "modificationTime": modified,
            "dataChange": data_change,
            "stats": json.dumps(footer_stats(storage.parquet_metadata(path))),
        }
    }


def remove(each: DataFile, now: int, data_change: bool) -> dict[str, Any]:
    return {
        "remove": {
            "path": each.path,
            "deletionTimestamp": now,
            "dataChange": data_change,
            "extendedFileMetadata": True,
            "partitionValues": {},
            "size": each.size,
        }
    }


def data_files(delta: DeltaTable, keys: pa.Table | None = None) -> list[DataFile]:
    """The version's data files, each with the rows its log entry counts; with `keys`, those
    whose statistics do not put a key column outside the keys' range."""
    actions = pa.table(delta.get_add_actions(flatten=True))
    keep = pa.repeat(pa.scalar(True), actions.num_rows)
    for name, column in zip(keys.column_names, keys.columns, strict=True) if keys else []:
        if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
            continue
        if column.null_count or f"min.{name}" not in actions.column_names:
            continue
        low, high = pc.min_max(column).values()
        low_of, high_of = actions.column(f"min.{name}"), actions.column(f"max.{name}")
        outside = pc.or_(pc.less(high_of, low.as_py()), pc.greater(low_of, high.as_py()))
        keep = pc.and_(keep, pc.invert(pc.fill_null(outside, False)))
    kept = actions.filter(keep)
    return [
        DataFile(path, size, records)
        for path, size, records in zip(
            kept.column("path").to_pylist(),
            kept.column("size_bytes").to_pylist(),
            kept.column("num_records").to_pylist(),
            strict=True,
        )
    ]


def footer_stats(metadata: pq.FileMetaData) -> dict[str, Any]:
    """Delta file statistics (numRecords, nullCount; minValues and maxValues for plain numbers,
    whose bounds are exact: not decimals, dates or times, which Parquet may store as numbers)
    from the row groups' statistics in a Parquet footer. A column with an infinite bound has
    none: JSON cannot hold it, and the log's readers refuse "Infinity"."""
    nulls: dict[str, int] = {}
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    unbounded = set()
    for column, stats in _column_stats(metadata):
        nulls[column] = nulls.get(column, 0) + stats.null_count
        if stats.has_min_max and _plain_number(stats.min) and _plain_number(stats.max):
            if not (math.isfinite(stats.min) and math.isfinite(stats.max)):
                unbounded.add(column)
            low[column] = min(low.get(column, stats.min), stats.min)
            high[column] = max(high.get(column, stats.max), stats.max)
    for column in unbounded:
        del low[column], high[column]
    return {
        "numRecords": metadata.num_rows,
        "minValues": low,
        "maxValues": high,
        "nullCount": nulls,
    }


def _plain_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _column_stats(metadata: pq.FileMetaData) -> Iterator[tuple[str, Any]]:
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for index in range(row_group.num_columns):
            chunk = row_group.column(index)
            if chunk.statistics is not None and "." not in chunk.path_in_schema:
                yield chunk.path_in_schema, chunk.statistics
