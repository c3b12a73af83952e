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

Upsert is on the key (the Kafka key, or --key-field's fields), from a batch of one row per key
(rows.accepted coalesces): a newer record replaces the row, a tombstone (a row flagged
TOMBSTONE: its value was null) deletes it and is kept, newer-only, in `<table>_tombstones`, so
a record older than a key's tombstone does not bring the key back. lagless writes these
commits itself, copy-on-write (upsert.py).
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from lagless.cdc.envelope import defaults
from lagless.cdc.key_change import BATCH_COLUMNS, MOVE_ID, MOVE_ONLY, MOVES, UNKNOWN
from lagless.exceptions import BadInput, TerminalError
from lagless.failpoints import failpoint
from lagless.sinks import staged_parquet as staged
from lagless.sinks.base import (
    ALREADY_HELD,
    DEAD_LETTER_COLUMNS,
    TOMBSTONE,
    RowRule,
    Target,
    WriteMode,
    Written,
    check_writable_path,
    spark_types,
)
from lagless.sinks.delta import widen
from lagless.sinks.delta.log import (
    RANGES,
    AppTransactions,
    footer_stats,
    log_time_id,
    row_rules,
    transactions,
    unwritable,
)
from lagless.sinks.folder_table import FolderTableSink, newest_rows_in
from lagless.sinks.ledger import TP, Batch, ConcurrentImport, HeldRecord
from lagless.sinks.task_files import stage_rows
from lagless.sinks.upsert_order import LOG_TIME

logger = logging.getLogger(__name__)  # not `log`: the package has a module of that name

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType

    from lagless.sinks.delta.upsert import Table, WrittenFiles
    from lagless.sinks.newer_wins import Plan

# Columns every lagless table has, whatever the shaping makes of values.
IDENTITY = ("partition", "offset", "timestamp")
# What a tombstone is kept with: its rank (upsert_order.py); the last two were added later.
RANKED = ("partition", "offset", "timestamp", "topic", LOG_TIME)
__all__ = ["DeltaSink", "footer_stats"]
# Where a partition column's value is NULL, its folder's name says this (Hive's, as Delta's).
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def _mode_description(mode: WriteMode) -> str:
    """Kept as the table's description: Delta has no unique key to tell an upsert table by."""
    return f"lagless --write {mode}"


class DeltaSink(FolderTableSink):
    scheme = "delta"

    @functools.cached_property
    def _transactions(self) -> AppTransactions:
        """The ledger of each table this sink writes, read once and kept current."""
        return AppTransactions(self.storage)

    @functools.cached_property
    def _written(self) -> WrittenFiles:
        """The data files an upsert wrote, kept for the next batch's (upsert.py)."""
        from lagless.sinks.delta.upsert import WrittenFiles

        return WrittenFiles()

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
            refused = unwritable(found, mode) or _unfilled(found, target, table, mode)
            if refused:
                raise BadInput(
                    f"Delta table {path!r}: lagless cannot write its {mode}s ({refused}); pick "
                    "another --table"
                )

    def row_rules(self, target: Target) -> tuple[RowRule, ...]:
        """The table's CHECK constraints and invariants, once it exists (log.row_rules)."""
        delta = self._open_or_none(target.table)
        return row_rules(delta) if delta is not None else ()

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
        held = {tp: v for tp, v in self._transactions.held(delta, path, partitions).items() if v}
        unlisted = [tp for tp in partitions if tp not in held]
        return held | (_held_in_rows(delta, unlisted) if unlisted else {})

    def log_times(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        """Kept as an application transaction per partition (its version the log time)."""
        delta = self._open_or_none(target.table) if target.mode == "upsert" else None
        if delta is None:
            return {}
        path = self.storage.join(self.location, target.table)
        names = {tp: log_time_id(tp) for tp in partitions}
        found = self._transactions.versions(delta, path, list(names.values()))
        return {tp: ms for tp, name in names.items() if (ms := found[name]) is not None}

    def skipped(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        """Kept as an application transaction per partition that skipped offsets."""
        delta = self._open_or_none(target.table)
        if delta is None:
            return {}
        path = self.storage.join(self.location, target.table)
        return self._transactions.skipped(delta, path, partitions)

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
        """A batch of rows: tasks write the files, the driver appends them or upserts their
        rows."""
        files = self._stage(rows, target, target.table)
        before_commit()
        if target.mode == "append":
            return None if self._append(target.table, files, batch) else ALREADY_HELD
        if not files:  # every record rejected or skipped: the ranges are recorded still
            return Written(0) if self._append(target.table, [], batch) else ALREADY_HELD
        batch_rows = pa.concat_tables([self.storage.read_parquet(path) for path in files])
        self._drop(files)
        return self._upsert(batch_rows, target, batch)

    def takes_upsert_rows(self, target: Target) -> bool:
        return target.mode == "upsert"

    def upsert_rows(self, rows: pa.Table, target: Target, batch: Batch) -> Written:
        """A batch of rows one per key, from the driver."""
        if not rows.num_rows:
            return Written(0) if self._append(target.table, [], batch) else ALREADY_HELD
        return self._upsert(rows, target, batch)

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
        if target.marks:
            tables.append((target.moves_table, "upsert"))
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
        folder = self.storage.join(self.location, table)
        if self._transactions.is_replay(delta, folder, batch):
            self._drop(files)
            return False
        columns = delta.metadata().partition_columns
        if columns:
            actions = self._partitioned(folder, files, columns)
        else:
            actions = [self._add_action(folder, self._move(path, folder)) for path in files]
        failpoint("mid-write")  # files beside the table's, not yet in its log
        return _commit(
            delta,
            lambda: self._open_or_none(table),
            batch,
            self._transactions.skipped_after(delta, folder, batch),
            actions,
            lambda delta: self._transactions.is_replay(delta, folder, batch),
        )

    def _partitioned(self, folder: str, files: list[str], columns: list[str]) -> list[Any]:
        """A partitioned table's add actions: each staged file's rows split by the partition
        columns' values (integers: log.PARTITION_TYPES), each part written without them under
        its partition's folder (`column=value/`, Delta's layout), its values in its add action,
        where readers take them from."""
        import polars as pl
        from deltalake.transaction import AddAction

        actions = []
        for path in files:
            rows = pl.from_arrow(self.storage.read_parquet(path))
            assert isinstance(rows, pl.DataFrame)
            for values, part in rows.partition_by(columns, as_dict=True).items():
                pairs = zip(columns, values, strict=True)
                named = {c: None if v is None else str(v) for c, v in pairs}
                place = "/".join(f"{c}={HIVE_NULL if v is None else v}" for c, v in named.items())
                self.storage.makedirs(self.storage.join(folder, place))
                written = self.storage.join(folder, place, f"part-{uuid.uuid4()}.c000.parquet")
                self.storage.write_parquet(written, part.drop(columns).to_arrow())
                size, modified = self.storage.stat(written)
                stats = json.dumps(footer_stats(self.storage.parquet_metadata(written)))
                relative = written[len(folder) + 1 :]
                actions.append(AddAction(relative, size, named, modified, True, stats))
            self.storage.remove(path)
        return actions

    def empty(self, target: Target) -> None:
        delta = self._open_or_none(target.table)
        if delta is not None:
            delta.delete()  # one commit; the application transactions (the ledger) stay

    def table_types(self, target: Target) -> dict[str, DataType | None]:
        delta = self._open_or_none(target.table)
        return {} if delta is None else spark_types(widen.held_schema(delta))

    def _open_or_none(self, table: str) -> DeltaTable | None:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            path = self.storage.join(self.location, table)
            return DeltaTable(path, storage_options=self.storage.client_options())
        except TableNotFoundError:
            return None

    def _upsert(self, rows: pa.Table, target: Target, batch: Batch) -> Written:
        """A marked mirror's key changes into `<table>_moves`, tombstones into
        `<table>_tombstones`, then the target (upsert.py): each newer-only (the moves kept
        once), each one commit with the batch's ranges, so a replay between them changes
        nothing."""
        from lagless.sinks.delta.upsert import upsert
        from lagless.sinks.newer_wins import key_changes

        keys = target.unique
        batch_columns = [c for c in BATCH_COLUMNS if c in rows.column_names]
        stored = _delta_types(rows.drop_columns([TOMBSTONE, *batch_columns]).schema)
        mirror = target.value_format == "debezium"
        fills = defaults(target.fields) if mirror and target.fields else {}
        delta = self._open(target.table, "upsert", stored, grows=mirror, fills=fills)
        if mirror:
            rows = widen.as_held(rows, delta)
        if self._transactions.is_replay(
            delta, self.storage.join(self.location, target.table), batch
        ):
            return ALREADY_HELD
        moves = self._moves(rows, target, batch) if key_changes(rows, target) else None
        if batch_columns:  # a delete kept for its move alone (MOVE_ONLY) is no row of the table's
            rows = rows.filter(pc.invert(pc.fill_null(rows.column(MOVE_ONLY), False)))
        tombstones = rows.filter(rows.column(TOMBSTONE)).select([*keys, *RANKED])
        graves_schema = _delta_types(tombstones.schema)
        graves_delta = self._open(target.tombstone_table, "upsert", graves_schema, grows=mirror)
        if mirror:
            tombstones = widen.as_held(tombstones, graves_delta)
        if tombstones.num_rows:
            flagged = tombstones.append_column(TOMBSTONE, pa.repeat(False, tombstones.num_rows))
            upsert(self._current(target.tombstone_table, graves_delta), flagged, keys, batch)
        failpoint("mid-write")  # tombstones kept, the target not yet upserted
        graves = self._current(target.tombstone_table, graves_delta)()
        opened = self._current(target.table, delta)
        added = upsert(opened, rows, keys, batch, target, graves, moves)
        return ALREADY_HELD if added is None else Written(added)

    def unknown_rows(self, table: str) -> int | None:
        """From the files' statistics (their null counts); a file without them is read."""
        from lagless.sinks.delta.upsert import Table

        delta = self._open_or_none(table)
        if delta is None or UNKNOWN not in delta.schema().to_arrow().names:
            return None
        actions = pa.table(delta.get_add_actions(flatten=True))
        counted = f"null_count.{UNKNOWN}"
        nulls = actions.column(counted).to_pylist() if counted in actions.column_names else None
        opened = Table(
            self.storage.join(self.location, table),
            self.storage,
            delta,
            self._transactions,
            self._written,
        )
        found = 0
        records = actions.column("num_records").to_pylist()
        for at, path in enumerate(actions.column("path").to_pylist()):
            if nulls is not None and nulls[at] is not None and records[at] is not None:
                found += records[at] - nulls[at]
            else:
                found += int(opened.frame(path).get_column(UNKNOWN).is_not_null().sum())
        return int(found)

    def _current(self, table: str, delta: DeltaTable) -> Callable[[], Table]:
        """The table's current version, each time it is called: `delta` brought up to date
        (its new log entries read, ~1 ms, where opening the table again read its log from the
        last checkpoint, ~15 ms here), or read again after a commit lost to another writer."""
        from lagless.sinks.delta.upsert import Table

        folder = self.storage.join(self.location, table)
        handles = [delta]

        def opened() -> Table:
            found = handles.pop() if handles else self._open_or_none(table)
            if found is None:
                raise TerminalError(f"Delta table {folder!r} was removed during a batch")
            found.update_incremental()
            return Table(folder, self.storage, found, self._transactions, self._written)

        return opened

    def _moves(self, rows: pa.Table, target: Target, batch: Batch) -> pa.Table:
        """A marked mirror's key changes the batch begins, kept in `<table>_moves` (with the
        batch's ranges: a replay keeps none again), and every one kept there after it."""
        from lagless.sinks.delta.upsert import FILE, POS, every_row, held_rows, upsert
        from lagless.sinks.newer_wins import moves_planned, moves_schema

        schema = moves_schema(target)
        moves = self._open(target.moves_table, "upsert", schema, grows=True)
        opened = self._current(target.moves_table, moves)
        begun = rows.filter(pc.is_valid(rows.column(MOVES)))
        main_table = self._open_or_none(target.table)
        if begun.num_rows and main_table is not None:
            main = self._current(target.table, main_table)()
            held = held_rows(main, begun, target.unique, None)

            def planned(table: Table) -> tuple[Plan, pa.Table]:
                whole = every_row(table)
                kept = whole.drop_columns([FILE, POS])
                return moves_planned(begun, held, kept, target), whole

            upsert(opened, begun, (MOVE_ID,), batch, planner=planned)
        return every_row(opened()).drop_columns([FILE, POS])

    def _schema(self, path: str) -> pa.Schema:
        """A staged file's columns as Delta takes them (_delta_types)."""
        return _delta_types(self.storage.parquet_metadata(path).schema.to_arrow_schema())

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
        self,
        table: str,
        mode: WriteMode,
        schema: pa.Schema,
        grows: bool = False,
        fills: dict[str, Any] | None = None,
    ) -> DeltaTable:
        """The table, created in `schema` if missing; refuses files of other columns, unless
        it `grows` (a Debezium mirror: _grow)."""
        from deltalake import DeltaTable, Schema

        path = self.storage.join(self.location, table)
        delta = self._open_or_none(table)  # ~15 ms here, create(mode="ignore") ~35 ms
        if delta is None:
            delta = DeltaTable.create(
                path,
                schema=schema,
                mode="ignore",  # another import may create it meanwhile
                description=_mode_description(mode),
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
            self._grow(delta, table, schema, fills or {})
            return delta
        if _columns(delta.schema()) != wanted and not (mode == "append" and _fills(delta, wanted)):
            raise TerminalError(
                f"the batch's columns ({', '.join(schema.names)}) differ from those of Delta "
                f"table {path!r}; pick another --table"
            )
        return delta

    def _grow(
        self, delta: DeltaTable, table: str, schema: pa.Schema, fills: dict[str, Any]
    ) -> None:
        """A mirror's table brought to its change events' columns: a column they add is
        added (nullable; the rows held take its default, `fills`), a column they widen is
        widened (widen.py: both rewrite the table, one commit), one they lack stays (NULL in
        new rows). SchemaChangeRefused for a type the table cannot follow."""
        from deltalake import Field, Schema

        held = widen.held_schema(delta)
        wider = widen.widened(delta, schema, table) or held
        grown = [f for f in schema if f.name not in held.names]
        if wider.equals(held) and not any(f.name in fills for f in grown):
            if grown:
                fields = Schema.from_arrow(pa.schema(grown)).fields
                delta.alter.add_columns([Field(c.name, c.type, nullable=True) for c in fields])
                delta.update_incremental()
            return
        logger.info("Delta table %r rewritten in its change events' columns", table)
        widen.rewrite(delta, pa.schema([*wider, *grown]), fills)


def _unfilled(delta: DeltaTable, target: Target, table: str, mode: WriteMode) -> str | None:
    """Why the rows lagless writes into `table` would not fill its columns: a column they lack
    that is not nullable (an append's files leave a nullable one NULL; an upsert's copies
    would not keep it), or one they have that the table lacks (added only to a Debezium
    mirror's table, and the rank's columns to an earlier lagless's)."""
    if target.value_format == "debezium" and table == target.table:
        return None  # its columns follow the events (_open)
    if table == target.dead_letter_table:
        rows = list(DEAD_LETTER_COLUMNS)
    elif table == target.tombstone_table:
        rows = [*target.unique, *RANKED]
    elif table == target.moves_table:
        from lagless.sinks.newer_wins import moves_schema

        rows = moves_schema(target).names
    else:
        rows = list(target.schema().fieldNames())
    fields = json.loads(delta.schema().to_json())["fields"]
    extra = [f["name"] for f in fields if f["name"] not in rows]
    unfilled = [f["name"] for f in fields if f["name"] in extra and not f.get("nullable", True)]
    if unfilled:
        return f"its columns {', '.join(unfilled)} are not nullable, and lagless's rows lack them"
    if extra and mode == "upsert":
        return f"it has columns lagless's rows lack ({', '.join(extra)}), which upserts would drop"
    missing = [name for name in rows if name not in {f["name"] for f in fields}]
    if missing and not set(missing) <= {"topic", LOG_TIME}:
        return f"it lacks the columns {', '.join(missing)} of lagless's rows"
    return None


def _fills(delta: DeltaTable, wanted: list[tuple[str, str]]) -> bool:
    """An append's files of the `wanted` columns fit the table: it holds each in that type,
    and its other columns are nullable (NULL in the rows added, as in files written before a
    column was added)."""
    held = dict(_columns(delta.schema()))
    fields = json.loads(delta.schema().to_json())["fields"]
    names = {name for name, _ in wanted}
    others_nullable = all(f.get("nullable", True) for f in fields if f["name"] not in names)
    return others_nullable and all(held.get(name) == kind for name, kind in wanted)


def _delta_types(schema: pa.Schema) -> pa.Schema:
    """Columns as Delta takes them: an instant's zone is UTC (Spark's files name the
    session's, such as Etc/UTC, which Delta refuses)."""
    for index, column in enumerate(schema):
        if pa.types.is_timestamp(column.type) and column.type.tz is not None:
            utc = pa.timestamp(column.type.unit, tz="UTC")
            schema = schema.set(index, column.with_type(utc))
    return schema


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


# Reads of the log a commit makes again when another writer's log cleanup removed a
# checkpoint or entry the read was built on.
LOG_READS = 5
# Commits leave log cleanup to expiry (maintenance.py), which keeps what the window's versions
# need; a checkpoint every 100 versions stays delta-rs's.
NO_CLEANUP = {"create_checkpoint": True, "cleanup_expired_logs": False}


def _commit(
    delta: DeltaTable,
    reopen: Callable[[], DeltaTable | None],
    batch: Batch,
    skipped: dict[TP, int],
    actions: list[Any],
    replayed: Callable[[DeltaTable], bool],
) -> bool:
    """One Delta transaction that adds `actions` and records the batch's ranges (an application
    transaction per partition); False when the batch was committed by another writer (a stale
    driver of the same batch). A commit that lost a race to another writer of these
    partitions finds them held (False), or raises ConcurrentImport. A log another writer's
    cleanup changed under the read (a checkpoint gone: FileNotFoundError) is read again and
    the commit tried again."""
    from deltalake.exceptions import CommitFailedError
    from deltalake.transaction import CommitProperties, PostCommitHookProperties, Transaction

    props = CommitProperties(
        app_transactions=[
            Transaction(name, version) for name, version in transactions(batch, skipped)
        ],
        custom_metadata={RANGES: batch.to_json()},
    )
    hooks = PostCommitHookProperties(**NO_CLEANUP)
    for _ in range(LOG_READS):
        try:
            delta.create_write_transaction(
                actions,
                "append",
                delta.schema(),
                partition_by=delta.metadata().partition_columns or None,
                commit_properties=props,
                post_commithook_properties=hooks,
            )
        except CommitFailedError:
            delta.update_incremental()
            if not replayed(delta):
                raise ConcurrentImport(
                    f"a commit to {delta.table_uri} lost to another import of the same "
                    "partitions; rerun to resume after what the table holds"
                ) from None
            return False
        except FileNotFoundError:
            found = reopen()
            if found is None:
                raise TerminalError(
                    f"Delta table {delta.table_uri} was removed during a batch"
                ) from None
            delta = found
            if replayed(delta):  # committed before the read failed (its checkpoint's)
                return True
            continue
        delta.update_incremental()
        return True
    raise ConcurrentImport(
        f"Delta table {delta.table_uri}: its log was cleaned under {LOG_READS} commits in a row; "
        "rerun to resume after what the table holds"
    )
