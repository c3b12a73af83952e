"""Delta Lake tables through delta-rs: executors write the Parquet files, the driver commits a
batch's files in one Delta transaction.

`delta:///dir` holds the tables `<dir>/<table>`, `<table>_dlq` (dead letters) and, in upsert
mode, `<table>_tombstones`. Tasks write into `<table>/_staging/<run>` (raw appends through the
source's executorWriter, other rows through mapInArrow: task_files.py); the driver moves the
files beside the table's and commits them. The table's log is its ledger (sinks/ledger.py):
every commit carries an application transaction per topic partition (app id
`lagless:<topic>:<partition>`, version = the first offset above the batch), so a batch whose
offsets the table holds already (a replay, or an import from a fresh checkpoint) is skipped,
and two imports committing the same partitions at once cannot both win (Delta's conflict
check on application transactions): exactly once without unique keys. Tables an earlier
lagless wrote without these count by the offsets their rows hold.

Upsert is a MERGE on the key (the Kafka key, or --key-field's fields) whose source holds one row
per key (rows.accepted coalesces): a newer record replaces the row, a tombstone (a row flagged
TOMBSTONE: its value was null) deletes it and is kept, newer-only, in
`<table>_tombstones`, so a record older than a key's tombstone does not bring the key back.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from lagless.cdc.connect_types import UNAVAILABLE, UNAVAILABLE_BYTES, kept_columns
from lagless.cdc.envelope import DELETED
from lagless.exceptions import BadInput, TerminalError
from lagless.failpoints import failpoint
from lagless.sinks import staged_parquet as staged
from lagless.sinks.base import (
    ALREADY_HELD,
    TOMBSTONE,
    Target,
    WriteMode,
    Written,
    check_writable_path,
)
from lagless.sinks.folder_table import FolderTableSink, newest_rows_in
from lagless.sinks.ledger import TP, Batch, ConcurrentImport, HeldRecord, Verdict, verdict
from lagless.sinks.sql import newer, soft_deleted_columns
from lagless.sinks.task_files import stage_rows
from lagless.sinks.upsert_order import LOG_TIME

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

    from lagless.sinks.maintenance import StoreMaintenance

# Columns every lagless table has, whatever the shaping makes of values.
IDENTITY = ("partition", "offset", "timestamp")
# What a tombstone is kept with: its rank (upsert_order.py); the last two were added later.
RANKED = ("partition", "offset", "timestamp", "topic", LOG_TIME)
# In upsert mode a record without a value deletes its key (Kafka's compaction convention).
IS_TOMBSTONE = f's."{TOMBSTONE}"'


def _mode_description(mode: WriteMode) -> str:
    """Kept as the table's description: Delta has no unique key to tell an upsert table by."""
    return f"lagless --write {mode}"


class DeltaSink(FolderTableSink):
    scheme = "delta"

    def check(self, target: Target) -> None:
        """Before anything is written: the folder can be written and each table that exists is
        a lagless Delta table of this write mode."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        if self.s3:
            self.storage.check_writable(self.location, "Delta folder")
        else:
            check_writable_path(self.location, "directory", folder=True)
        for table, mode in self._tables(target):
            path = self.storage.join(self.location, table)
            if not self.s3:
                for folder in (path, self._staging(target, table)):
                    check_writable_path(folder, "directory", folder=True)
            if not set(self.storage.names(path)) - {staged.STAGING}:
                continue  # none yet, or only what a crashed first batch staged
            try:
                found = DeltaTable(path, storage_options=self.storage.client_options())
            except TableNotFoundError:
                raise BadInput(f"{path!r} exists and is not a Delta table") from None
            description = found.metadata().description
            columns = set(found.schema().to_arrow().names)
            if description != _mode_description(mode) or not set(IDENTITY) <= columns:
                raise BadInput(
                    f"Delta table {path!r} has another layout ({description or 'not lagless'}); "
                    "pick another --table or --write mode"
                )

    def maintenance(self, run_id: str | None = None) -> StoreMaintenance:
        from lagless.sinks.delta.maintenance import DeltaMaintenance

        return DeltaMaintenance(self)

    def prepare(self, target: Target) -> None:
        """Before the first batch: the folder. A table is created by its first batch, in the
        columns of the rows it receives."""
        self.storage.makedirs(self.location)

    def ledger(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        path = self.storage.join(self.location, target.table)
        try:
            delta = DeltaTable(path, storage_options=self.storage.client_options())
        except TableNotFoundError:
            return {}
        held = {tp: v for tp in partitions if (v := delta.transaction_version(_app_id(tp)))}
        unlisted = [tp for tp in partitions if tp not in held]
        return held | (_held_in_rows(delta, unlisted) if unlisted else {})

    def log_times(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        """Kept as an application transaction per partition (its version the log time)."""
        delta = self._open_or_none(target.table) if target.mode == "upsert" else None
        if delta is None:
            return {}
        found = {tp: delta.transaction_version(_log_time_id(tp)) for tp in partitions}
        return {tp: ms for tp, ms in found.items() if ms is not None}

    def newest_rows(self, target: Target, held: Mapping[TP, int]) -> dict[TP, HeldRecord]:
        import polars as pl

        delta = self._open_or_none(target.table)
        if delta is None or not held:
            return {}
        return newest_rows_in(pl.scan_delta(delta), held)

    def commit_staged(self, files: list[str], target: Target, batch: Batch) -> Written | None:
        """After the tasks wrote the batch (executorWriter): commit its files in one transaction."""
        return None if self._append(target.table, sorted(set(files)), batch) else ALREADY_HELD

    def write(
        self, rows: DataFrame, target: Target, batch: Batch, before_commit: Callable[[], None]
    ) -> Written | None:
        """A batch of rows: tasks write the files, the driver appends them or merges them."""
        files = self._stage(rows, target, target.table)
        before_commit()
        if target.mode == "append":
            return None if self._append(target.table, files, batch) else ALREADY_HELD
        return self._merge(files, target, batch)

    def takes_upsert_rows(self, target: Target) -> bool:
        return target.mode == "upsert"

    def upsert_rows(self, rows: pa.Table, target: Target, batch: Batch) -> Written:
        """A batch of rows one per key, from the driver: staged as one file, then merged."""
        staging = self._staging(target, target.table)
        self.storage.makedirs(staging)
        path = self.storage.join(staging, f"rows-{batch.id}.parquet")
        self.storage.write_parquet(path, rows)
        try:
            return self._merge([path], target, batch)
        finally:
            with contextlib.suppress(FileNotFoundError):
                self.storage.remove(path)

    def write_dead_letters(self, rows: DataFrame, target: Target, batch: Batch) -> None:
        """Its rejected records, appended to `<table>_dlq` before the batch's rows commit."""
        table = target.dead_letter_table
        self._append(table, self._stage(rows, target, table), batch)

    def _stage(self, rows: DataFrame, target: Target, table: str) -> list[str]:
        staging = self._staging(target, table)
        clear = self.storage.remove_tree
        return stage_rows(rows, staging, clear=clear, s3=self.storage.task_access)

    def _tables(self, target: Target) -> list[tuple[str, WriteMode]]:
        tables: list[tuple[str, WriteMode]] = [
            (target.table, target.mode),
            (target.dead_letter_table, "append"),
        ]
        if target.mode == "upsert":
            tables.append((target.tombstone_table, "upsert"))
        return tables

    def _append(self, table: str, files: list[str], batch: Batch) -> bool:
        """Move the batch's files beside the table's and add them, with the batch's ranges, in
        one commit, unless the log holds these offsets already (a replay: False). A batch
        without files still records its ranges in a table that exists."""
        delta = self._open_or_none(table) if not files else None
        if delta is None:
            if not files:
                return True
            delta = self._open(table, "append", self._schema(files[0]))
        if _is_replay(delta, batch):
            self._drop(files)
            return False
        folder = self.storage.join(self.location, table)
        actions = [self._add_action(folder, self._move(path, folder)) for path in files]
        failpoint("mid-write")  # files beside the table's, not yet in its log
        return (
            _commit(
                delta,
                batch,
                lambda props: delta.create_write_transaction(
                    actions, "append", delta.schema(), commit_properties=props
                ),
            )
            is not _LOST_TO_A_REPLAY
        )

    def _open_or_none(self, table: str) -> DeltaTable | None:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            path = self.storage.join(self.location, table)
            return DeltaTable(path, storage_options=self.storage.client_options())
        except TableNotFoundError:
            return None

    def _merge(self, files: list[str], target: Target, batch: Batch) -> Written:
        """Tombstones into `<table>_tombstones`, then one MERGE into the target: a record only
        replaces an older row and only when newer than its key's tombstone; a tombstone deletes
        an older row. Both commits are newer-only, so a replay between them changes nothing."""
        import polars as pl

        if not files:  # every record rejected or skipped: the ranges are recorded still
            return Written(0) if self._append(target.table, [], batch) else ALREADY_HELD
        rows_schema = self._schema(files[0])
        stored = rows_schema.remove(rows_schema.get_field_index(TOMBSTONE))
        delta = self._open(target.table, "upsert", stored, grows=target.value_format == "debezium")
        if _is_replay(delta, batch):
            self._drop(files)
            return ALREADY_HELD
        keys = target.unique

        def same_key(a: str, b: str) -> str:
            return " AND ".join(f'{a}."{k}" = {b}."{k}"' for k in keys)

        source = pl.scan_parquet(files, storage_options=self.storage.client_options())
        tombstones = source.filter(pl.col(TOMBSTONE)).select(*keys, *RANKED).collect()
        graves = self._open(target.tombstone_table, "upsert", tombstones.to_arrow().schema)
        if tombstones.height and not _is_replay(graves, batch):
            _commit(
                graves,
                batch,
                lambda props: (
                    graves.merge(
                        tombstones,
                        same_key("t", "s"),
                        source_alias="s",
                        target_alias="t",
                        commit_properties=props,
                    )
                    .when_matched_update_all(newer("s", "t"))
                    .when_not_matched_insert_all()
                    .execute()
                ),
            )  # _commit leaves `graves` at the version it committed
        failpoint("mid-write")  # tombstones kept, the target not yet merged
        alive = pl.SQLContext(source=source, graves=pl.scan_delta(graves)).execute(
            f"SELECT s.* FROM source AS s LEFT JOIN graves AS d ON {same_key('s', 'd')} "
            f'WHERE {IS_TOMBSTONE} OR d."partition" IS NULL OR {newer("s", "d")}'
        )
        merge_source = alive.collect(engine="streaming")
        whole = f"({newer('s', 't')})"
        # Every stored column from the source row: the tombstone flag itself is not stored.
        columns = {name: f's."{name}"' for name in stored.names}
        updated = columns | {
            name: f'CASE WHEN s."{name}" = {marker} THEN t."{name}" ELSE s."{name}" END'
            for name, marker in _kept(target)
        }

        def merged(props: Any) -> Any:
            merger = delta.merge(
                merge_source,
                same_key("t", "s"),
                source_alias="s",
                target_alias="t",
                commit_properties=props,
            )
            deleted = f"{IS_TOMBSTONE} AND {whole}"
            if target.deletes == "soft":
                flagged = {name: f's."{name}"' for name in soft_deleted_columns(target)}
                merger = merger.when_matched_update(flagged | {DELETED: "true"}, deleted)
            else:
                merger = merger.when_matched_delete(deleted)
            return (
                merger.when_matched_update(updated, f"NOT {IS_TOMBSTONE} AND {whole}")
                .when_not_matched_insert(columns, f"NOT {IS_TOMBSTONE}")
                .execute()
            )

        metrics = _commit(delta, batch, merged)
        if metrics is _LOST_TO_A_REPLAY:
            return ALREADY_HELD
        if not _is_replay(delta, batch):
            # A MERGE that changed nothing (tombstones of keys the table lacks, records that
            # lost) commits nothing, so its ranges and log times would be missing: a rerun
            # would read the batch again and find the tombstones' table holding it already.
            _commit(
                delta,
                batch,
                lambda props: delta.create_write_transaction(
                    [], "append", delta.schema(), commit_properties=props
                ),
            )
        # Rows gained or replaced, as every store counts them (not the tombstones' deletes).
        return Written(metrics["num_target_rows_inserted"] + metrics["num_target_rows_updated"])

    def _schema(self, path: str) -> pa.Schema:
        """A staged file's columns as Delta takes them: an instant's zone is UTC (Spark's
        files name the session's, such as Etc/UTC, which Delta refuses)."""
        schema = self.storage.parquet_metadata(path).schema.to_arrow_schema()
        for index, column in enumerate(schema):
            if pa.types.is_timestamp(column.type) and column.type.tz is not None:
                utc = pa.timestamp(column.type.unit, tz="UTC")
                schema = schema.set(index, column.with_type(utc))
        return schema

    def _drop(self, files: list[str]) -> None:
        for path in files:
            self.storage.remove(path)

    def _move(self, path: str, folder: str) -> str:
        moved = self.storage.join(folder, path.rsplit("/", 1)[-1])
        self.storage.move(path, moved)
        return moved

    def _add_action(self, folder: str, path: str) -> Any:
        """An add action for a file in the table's folder, statistics from its Parquet
        footer."""
        from deltalake.transaction import AddAction

        size, modified = self.storage.stat(path)
        stats = footer_stats(self.storage.parquet_metadata(path))
        return AddAction(path[len(folder) + 1 :], size, {}, modified, True, json.dumps(stats))

    def _open(
        self, table: str, mode: WriteMode, schema: pa.Schema, grows: bool = False
    ) -> DeltaTable:
        """The table, created in `schema` if missing; refuses files of other columns, unless
        it `grows` (a Debezium mirror): then a column the files add is added to the table
        (nullable), and one they lack stays (NULL in new rows)."""
        from deltalake import DeltaTable, Field, Schema

        path = self.storage.join(self.location, table)
        description = _mode_description(mode)
        delta = DeltaTable.create(
            path,
            schema=schema,
            mode="ignore",
            description=description,
            storage_options=self.storage.client_options(),
        )
        delta.update_incremental()
        wanted = _columns(Schema.from_arrow(schema))
        added = _added_for_ranks(_columns(delta.schema()), wanted)
        if added:  # a table an earlier lagless made: the columns the rank needs, added
            delta.alter.add_columns(
                [f for f in Schema.from_arrow(schema).fields if f.name in added]
            )
            delta.update_incremental()
        if grows:
            held = dict(_columns(delta.schema()))
            grown = [c for c in Schema.from_arrow(schema).fields if c.name not in held]
            if grown:
                delta.alter.add_columns([Field(c.name, c.type, nullable=True) for c in grown])
                delta.update_incremental()
            held = dict(_columns(delta.schema()))
            if all(held.get(name) == kind for name, kind in wanted):
                return delta
        if _columns(delta.schema()) != wanted:
            raise TerminalError(
                f"the batch's columns ({', '.join(schema.names)}) differ from those of Delta "
                f"table {path!r}; pick another --table"
            )
        return delta


def _kept(target: Target) -> list[tuple[str, str]]:
    """Debezium: the columns whose UNAVAILABLE value keeps the stored one, each with that
    value as a literal of DataFusion's SQL."""
    if target.value_format != "debezium" or target.mode != "upsert" or target.fields is None:
        return []
    raw, text = f"X'{UNAVAILABLE_BYTES.hex()}'", f"'{UNAVAILABLE}'"
    return [
        (name, raw if binary else text)
        for name, binary in kept_columns(target.fields, target.unique)
    ]


def _added_for_ranks(found: list[tuple[str, str]], wanted: list[tuple[str, str]]) -> list[str]:
    """The columns of an upsert's rank (upsert_order.py) an earlier lagless's table lacks, when
    they are all it lacks (they come last, where a column added goes)."""
    missing = wanted[len(found) :]
    names = [name for name, _ in missing]
    if wanted[: len(found)] != found or not missing or not set(names) <= {"topic", LOG_TIME}:
        return []
    return names


def _columns(schema: Any) -> list[tuple[str, str]]:
    """Names and Delta types; not nullability, which differs between Spark's rows and files."""
    return [(f["name"], json.dumps(f["type"])) for f in json.loads(schema.to_json())["fields"]]


def _app_id(tp: TP) -> str:
    """The application transaction that holds a partition's place in the table's log."""
    return f"lagless:{tp[0]}:{tp[1]}"


def _log_time_id(tp: TP) -> str:
    """The application transaction whose version is an upsert partition's log time."""
    return f"lagless-log-time:{tp[0]}:{tp[1]}"


def _is_replay(delta: DeltaTable, batch: Batch) -> bool:
    """The log holds the batch's offsets already (ledger.verdict; raises ConcurrentImport when
    it holds part of them)."""
    held = {
        tp: v for tp in batch.covered if (v := delta.transaction_version(_app_id(tp))) is not None
    }
    return verdict(batch, held) is Verdict.REPLAY


def _held_in_rows(delta: DeltaTable, partitions: list[TP]) -> dict[TP, int]:
    """A table an earlier lagless wrote without application transactions per partition: the
    first offset above those its rows hold."""
    import polars as pl

    wanted = pl.DataFrame(
        {"topic": [t for t, _ in partitions], "partition": [p for _, p in partitions]},
        schema={"topic": pl.String, "partition": pl.Int32},
    )
    found = (
        pl.scan_delta(delta)
        .select("topic", pl.col("partition").cast(pl.Int32), "offset")
        .join(wanted.lazy(), on=["topic", "partition"])
        .group_by("topic", "partition")
        .agg(pl.col("offset").max())
        .collect()
    )
    return {(t, int(p)): int(o) + 1 for t, p, o in found.iter_rows()}


# What _commit returns when its commit lost to another writer of the same batch.
_LOST_TO_A_REPLAY = object()


def _commit(delta: DeltaTable, batch: Batch, action: Any) -> Any:
    """One Delta transaction that records the batch's ranges (an application transaction per
    partition); what `action` returned (a MERGE's metrics). A commit that lost a race to
    another writer of these partitions finds them held (a stale driver of the same batch:
    _LOST_TO_A_REPLAY) or raises ConcurrentImport."""
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties, Transaction

    ranges = batch.covered
    log_times = [
        Transaction(_log_time_id(tp), ms)
        for tp, ms in sorted(batch.log_times.items())
        if tp in ranges
    ]
    props = CommitProperties(
        app_transactions=[Transaction(_app_id(tp), end) for tp, (_, end) in ranges.items()]
        + log_times,
        custom_metadata={"lagless.ranges": batch.to_json()},
    )
    try:
        done = action(props)
    except CommitFailedError:
        delta.update_incremental()
        if not _is_replay(delta, batch):
            raise ConcurrentImport(
                f"a commit to {delta.table_uri} lost to another import of the same partitions; "
                "rerun to resume after what the table holds"
            ) from None
        done = _LOST_TO_A_REPLAY
    delta.update_incremental()
    return done


def footer_stats(metadata: pq.FileMetaData) -> dict[str, Any]:
    """Delta file statistics (numRecords, nullCount; minValues and maxValues for numbers, whose
    bounds are exact) from the row groups' statistics in a Parquet footer. A column with an
    infinite bound has none: JSON cannot hold it, and the log's readers refuse "Infinity"."""
    nulls: dict[str, int] = {}
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    unbounded = set()
    for column, stats in _column_stats(metadata):
        nulls[column] = nulls.get(column, 0) + stats.null_count
        if stats.has_min_max and stats.physical_type in ("INT32", "INT64", "FLOAT", "DOUBLE"):
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


def _column_stats(metadata: pq.FileMetaData) -> Iterator[tuple[str, Any]]:
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for index in range(row_group.num_columns):
            chunk = row_group.column(index)
            if chunk.statistics is not None and "." not in chunk.path_in_schema:
                yield chunk.path_in_schema, chunk.statistics
