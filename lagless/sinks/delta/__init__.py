"""Delta Lake tables through delta-rs: executors write the Parquet files, the driver commits a
batch's files in one Delta transaction.

`delta:///dir` holds the tables `<dir>/<table>`, `<table>_dlq` (dead letters) and, in upsert
mode, `<table>_tombstones`. Tasks write into `<table>/_staging` (raw appends through the
source's executorWriter, other rows through mapInArrow: task_files.py); the driver moves the
files beside the table's and commits them. Every commit carries an application transaction
(app id from the checkpoint's query id, version = batch id), so a replayed batch whose commit
is already in the log is recognised and skipped: exactly once without unique keys.

Upsert is a MERGE on the key (the Kafka key, or --key-field's fields) whose source holds one row
per key (rows.accepted coalesces): a newer record replaces the row, a tombstone (a row flagged
TOMBSTONE: its value was null) deletes it and is kept, newer-only, in
`<table>_tombstones`, so a record older than a key's tombstone does not bring the key back.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from lagless.exceptions import BadInput, TerminalError
from lagless.failpoints import failpoint
from lagless.sinks import local_path
from lagless.sinks.base import TOMBSTONE, Sink, Target, TaskWriter, WriteMode, check_writable_path
from lagless.sinks.parquet import staged
from lagless.sinks.sql import newer
from lagless.sinks.task_files import stage_rows

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame

# Columns every lagless table has, whatever the shaping makes of values.
IDENTITY = ("partition", "offset", "timestamp")
# In upsert mode a record without a value deletes its key (Kafka's compaction convention).
IS_TOMBSTONE = f's."{TOMBSTONE}"'


def _mode_description(mode: WriteMode) -> str:
    """Kept as the table's description: Delta has no unique key to tell an upsert table by."""
    return f"lagless --write {mode}"


class DeltaSink(Sink):
    scheme = "delta"

    @classmethod
    def from_url(cls, url: str) -> DeltaSink:
        return cls(url, os.path.abspath(local_path(url, cls.scheme)))

    def check(self, target: Target) -> None:
        """Before anything is written: the folder can be written and each table that exists is
        a lagless Delta table of this write mode."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        check_writable_path(self.location, "directory", folder=True)
        for table, mode in self._tables(target):
            path = os.path.join(self.location, table)
            for folder in (path, self._staging(table)):
                check_writable_path(folder, "directory", folder=True)
            if not os.path.isdir(path) or not set(os.listdir(path)) - {staged.STAGING}:
                continue  # none yet, or only what a crashed first batch staged
            try:
                found = DeltaTable(path)
            except TableNotFoundError:
                raise BadInput(f"{path!r} exists and is not a Delta table") from None
            description = found.metadata().description
            columns = set(found.schema().to_arrow().names)
            if description != _mode_description(mode) or not set(IDENTITY) <= columns:
                raise BadInput(
                    f"Delta table {path!r} has another layout ({description or 'not lagless'}); "
                    "pick another --table or --write mode"
                )

    def prepare(self, target: Target) -> None:
        """Before the first batch: the folder. A table is created by its first batch, in the
        columns of the rows it receives."""
        os.makedirs(self.location, exist_ok=True)

    def executor_writer(self, target: Target) -> TaskWriter | None:
        """Raw appends: the source's tasks write the files into the target's staging folder."""
        config = {"folder": self._staging(target.table)}
        return TaskWriter(f"{staged.__name__}:{staged.writer.__name__}", json.dumps(config))

    def discard_staged(self, target: Target) -> None:
        """Before a batch's tasks run (executorWriter): drop what a crashed attempt staged."""
        shutil.rmtree(self._staging(target.table), ignore_errors=True)

    def commit_staged(self, receipts: pa.Table, target: Target, batch_id: int) -> None:
        """After the tasks wrote the batch (executorWriter): commit its files in one transaction."""
        files = sorted(set(receipts.column("file").to_pylist()))
        self._append(target.table, files, target, batch_id)

    def write(self, rows: DataFrame, target: Target, batch_id: int) -> None:
        """A batch of rows: tasks write the files, the driver appends them or merges them."""
        files = stage_rows(rows, self._staging(target.table))
        if target.mode == "append":
            self._append(target.table, files, target, batch_id)
        else:
            self._merge(files, target, batch_id)

    def write_dead_letters(self, rows: DataFrame, target: Target, batch_id: int) -> None:
        """After the batch's rows: its rejected records, appended to `<table>_dlq`."""
        table = target.dead_letter_table
        self._append(table, stage_rows(rows, self._staging(table)), target, batch_id)

    def _tables(self, target: Target) -> list[tuple[str, WriteMode]]:
        tables: list[tuple[str, WriteMode]] = [
            (target.table, target.mode),
            (target.dead_letter_table, "append"),
        ]
        if target.mode == "upsert":
            tables.append((target.tombstone_table, "upsert"))
        return tables

    def _staging(self, table: str) -> str:
        # Absolute: a task on a standalone worker runs in a folder of its own.
        return os.path.join(os.path.abspath(self.location), table, staged.STAGING)

    def _append(self, table: str, files: list[str], target: Target, batch_id: int) -> None:
        """Move the batch's files beside the table's and add them in one commit, unless the
        log already holds this batch (a replay)."""
        if not files:
            return
        delta = self._open(table, "append", pq.read_schema(files[0]))
        if _committed(delta, target, batch_id):
            return
        folder = os.path.join(self.location, table)
        actions = [_add_action(folder, _move(path, folder)) for path in files]
        failpoint("mid-write")  # files beside the table's, not yet in its log
        _commit(
            delta,
            target,
            batch_id,
            lambda props: delta.create_write_transaction(
                actions, "append", delta.schema(), commit_properties=props
            ),
        )

    def _merge(self, files: list[str], target: Target, batch_id: int) -> None:
        """Tombstones into `<table>_tombstones`, then one MERGE into the target: a record only
        replaces an older row and only when newer than its key's tombstone; a tombstone deletes
        an older row. Both commits are newer-only, so a replay between them changes nothing."""
        import polars as pl

        if not files:
            return
        rows_schema = pq.read_schema(files[0])
        stored = rows_schema.remove(rows_schema.get_field_index(TOMBSTONE))
        delta = self._open(target.table, "upsert", stored)
        if _committed(delta, target, batch_id):
            return
        keys = target.unique

        def same_key(a: str, b: str) -> str:
            return " AND ".join(f'{a}."{k}" = {b}."{k}"' for k in keys)

        source = pl.scan_parquet(files)
        tombstones = (
            source.filter(pl.col(TOMBSTONE))
            .select(*keys, "partition", "offset", "timestamp")
            .collect()
        )
        graves = self._open(target.tombstone_table, "upsert", tombstones.to_arrow().schema)
        if tombstones.height and not _committed(graves, target, batch_id):
            _commit(
                graves,
                target,
                batch_id,
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
            )
            graves.update_incremental()
        failpoint("mid-write")  # tombstones kept, the target not yet merged
        alive = pl.SQLContext(source=source, graves=pl.scan_delta(graves)).execute(
            f"SELECT s.* FROM source AS s LEFT JOIN graves AS d ON {same_key('s', 'd')} "
            f'WHERE {IS_TOMBSTONE} OR d."partition" IS NULL OR {newer("s", "d")}'
        )
        merge_source = alive.collect(engine="streaming")
        whole = f"({newer('s', 't')})"
        # Every stored column from the source row: the tombstone flag itself is not stored.
        columns = {name: f's."{name}"' for name in stored.names}
        _commit(
            delta,
            target,
            batch_id,
            lambda props: (
                delta.merge(
                    merge_source,
                    same_key("t", "s"),
                    source_alias="s",
                    target_alias="t",
                    commit_properties=props,
                )
                .when_matched_delete(f"{IS_TOMBSTONE} AND {whole}")
                .when_matched_update(columns, f"NOT {IS_TOMBSTONE} AND {whole}")
                .when_not_matched_insert(columns, f"NOT {IS_TOMBSTONE}")
                .execute()
            ),
        )

    def _open(self, table: str, mode: WriteMode, schema: pa.Schema) -> DeltaTable:
        """The table, created in `schema` if missing; refuses files of other columns."""
        from deltalake import DeltaTable, Schema

        path = os.path.join(self.location, table)
        description = _mode_description(mode)
        delta = DeltaTable.create(path, schema=schema, mode="ignore", description=description)
        delta.update_incremental()
        if _columns(delta.schema()) != _columns(Schema.from_arrow(schema)):
            raise TerminalError(
                f"the batch's columns ({', '.join(schema.names)}) differ from those of Delta "
                f"table {path!r}; pick another --table"
            )
        return delta


def _columns(schema: Any) -> list[tuple[str, str]]:
    """Names and Delta types; not nullability, which differs between Spark's rows and files."""
    return [(f["name"], json.dumps(f["type"])) for f in json.loads(schema.to_json())["fields"]]


def _app_id(target: Target) -> str:
    if not target.run_id:
        raise TerminalError("a Delta commit needs the run id of the checkpoint")
    return f"lagless-{target.run_id}"


def _committed(delta: DeltaTable, target: Target, batch_id: int) -> bool:
    """The log holds this batch of this run already: batches commit in order."""
    done = delta.transaction_version(_app_id(target))
    return done is not None and done >= batch_id


def _commit(delta: DeltaTable, target: Target, batch_id: int, action: Any) -> None:
    """One Delta transaction that records (app id, batch id). A commit that lost a race to
    another writer of the same batch (a stale driver) finds the batch done and leaves it."""
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties, Transaction

    props = CommitProperties(app_transactions=[Transaction(_app_id(target), batch_id)])
    try:
        action(props)
    except CommitFailedError:
        delta.update_incremental()
        if not _committed(delta, target, batch_id):
            raise
    delta.update_incremental()


def _move(path: str, folder: str) -> str:
    moved = os.path.join(folder, os.path.basename(path))
    os.replace(path, moved)
    return moved


def _add_action(folder: str, path: str) -> Any:
    """An add action for a file in the table's folder, statistics from its Parquet footer."""
    from deltalake.transaction import AddAction

    stat = os.stat(path)
    return AddAction(
        os.path.relpath(path, folder),
        stat.st_size,
        {},
        int(stat.st_mtime * 1000),
        True,
        json.dumps(footer_stats(pq.read_metadata(path))),
    )


def footer_stats(metadata: pq.FileMetaData) -> dict[str, Any]:
    """Delta file statistics (numRecords, nullCount; minValues and maxValues for numbers, whose
    bounds are exact) from the row groups' statistics in a Parquet footer."""
    nulls: dict[str, int] = {}
    low: dict[str, Any] = {}
    high: dict[str, Any] = {}
    for column, stats in _column_stats(metadata):
        nulls[column] = nulls.get(column, 0) + stats.null_count
        if stats.has_min_max and stats.physical_type in ("INT32", "INT64", "FLOAT", "DOUBLE"):
            low[column] = min(low.get(column, stats.min), stats.min)
            high[column] = max(high.get(column, stats.max), stats.max)
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
