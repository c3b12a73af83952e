"""A Delta upsert, written by lagless: copy-on-write, one log entry per batch.

The batch (one row per key, TOMBSTONE marking a deletion) is planned against the rows the
table holds for its keys (sinks/newer_wins.py: the rank every store shares): the keys whose
row goes and the rows to add. Each data file holding a replaced key is written again without
those rows; the added rows join the last such file (or go into a file of their own). One log
entry removes the files written again and adds the new ones, with the batch's application
transactions (its ranges and log times: the ledger), put only if its version is still free (a
put-if-absent of `_delta_log/<version>.json`, as delta-rs and compaction commit). A version
another writer took meanwhile is not rebased over: the batch is planned again on the table
that writer left, which may hold the batch already (a replay: nothing is written).

Why not delta-rs's MERGE: into a 1M-row table, 3,000 keys took it 0.57-0.62 s and 0.84-0.91 s
of CPU, the same rewrite here 0.30-0.36 s and 0.54-0.63 s; a mirror's batch spent most of its
driver's time in the MERGE (bench/mirror.py).
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from lagless.cdc.key_change import AWAITS
from lagless.retry import COMMIT_ATTEMPTS, commit_attempts
from lagless.sinks.base import Target, in_schema
from lagless.sinks.delta.log import (
    LOG,
    RANGES,
    AppTransactions,
    add,
    commit_info,
    data_files,
    remove,
    transactions,
    txn,
)
from lagless.sinks.ledger import Batch, ConcurrentImport
from lagless.sinks.newer_wins import (
    COORDINATES,
    Plan,
    keyed_positions,
    mirrored,
    needs_held_values,
    plan,
    with_fills,
)

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from lagless.sinks.storage import LocalStorage, S3Storage

# Versions other writers take (compaction, another import) before a batch gives up.
FILE = "_lagless_file"
POS = "_lagless_pos"
# The driver's memory kept for the files it wrote (WrittenFiles): a 1M-row mirror table of
# bench/mirror.py's is ~150 MB in polars.
WRITTEN_FILES_BYTES = 512 * 2**20


class WrittenFiles:
    """The data files this driver wrote, kept in memory (the newest used, up to
    WRITTEN_FILES_BYTES), so that the next batch reads none of them. Why: a copy-on-write
    upsert of keys spread over the table writes each of its files again each batch, and read
    them first: the keys and coordinates of a 1M-row table (~100 ms), then the files whole
    (~160 ms), in a continuous mirror's batch of ~1.2 s here. A data file never changes once
    written, and its name is new (a uuid): a path the table lists holds what was kept."""

    def __init__(self, limit: int = WRITTEN_FILES_BYTES) -> None:
        self._limit = limit
        self._frames: OrderedDict[str, tuple[pl.DataFrame, int]] = OrderedDict()
        self._bytes = 0

    def get(self, path: str) -> pl.DataFrame | None:
        found = self._frames.get(path)
        if found is None:
            return None
        self._frames.move_to_end(path)
        return found[0]

    def put(self, path: str, rows: pl.DataFrame) -> None:
        size = int(rows.estimated_size())
        if size > self._limit:
            return
        self.forget([path])
        self._frames[path] = (rows, size)
        self._bytes += size
        while self._bytes > self._limit:
            _, (_, dropped) = self._frames.popitem(last=False)
            self._bytes -= dropped

    def keep_only(self, folder: str, live: set[str]) -> None:
        """Of the files under `folder` (one table's), only those of `live` (its version's): a
        file another writer removed (a compaction, this import's own between batches) is
        never read again, and was kept until the limit pushed it out: a mirror's driver held
        up to the whole limit of such files (bench/soak.py)."""
        prefix = folder.rstrip("/") + "/"
        self.forget([p for p in self._frames if p.startswith(prefix) and p not in live])

    def forget(self, paths: Iterable[str]) -> None:
        """Files the table no longer holds (a batch wrote them again), or never will (its
        commit lost)."""
        for path in paths:
            found = self._frames.pop(path, None)
            if found is not None:
                self._bytes -= found[1]


@dataclass(frozen=True)
class Table:
    """A Delta table at one version: where it is, its log as read then, and its ledger."""

    folder: str
    storage: LocalStorage | S3Storage
    delta: DeltaTable
    transactions: AppTransactions
    written: WrittenFiles

    @functools.cached_property
    def schema(self) -> pa.Schema:
        """Read once a version: every file of the batch is read in it."""
        return pa.schema(self.delta.schema().to_arrow())

    def frame(self, path: str) -> pl.DataFrame:
        """A data file's rows whole, in polars, in the table's types (a column added since the
        file was written, as nulls). The files a batch writes again are read and written
        by polars, whose reader and writer work column by column in parallel: a 1M-row file
        (23 MB) took pyarrow 0.34 s to write, polars 0.15 s (snappy both, as delta-rs writes;
        the same Parquet types but time, which Delta has not). Reading in polars keeps text in
        polars' own layout: one converted from Arrow's costs a copy, 0.05 s a million rows."""
        schema = _frame(self.schema.empty_table()).schema
        full = self.storage.join(self.folder, path)
        found = self.written.get(full)
        if found is None:
            found = pl.read_parquet(full, storage_options=self.storage.client_options())
        missing = [
            pl.lit(None, kind).alias(name)
            for name, kind in schema.items()
            if name not in found.columns
        ]
        return found.with_columns(missing).select(schema.names()).cast(schema)

    def keyed(self, path: str, keys: pa.Table, columns: list[str] | None) -> pa.Table:
        """A data file's rows whose key is a row of `keys`, in `columns` (None: all) of the
        table's types (a column added since the file was written, as nulls), with POS: where
        each is in the file."""
        schema = self.schema
        wanted = schema if columns is None else pa.schema([schema.field(c) for c in columns])
        full = self.storage.join(self.folder, path)
        kept = self.written.get(full)
        if kept is not None:  # found in polars, only the rows found converted
            places = kept.select(keys.column_names).with_row_index(POS)
            found = places.join(_frame(keys), on=keys.column_names, how="semi").get_column(POS)
            rows = kept[found].select([n for n in wanted.names if n in kept.columns])
            positions = found.cast(pl.Int64).to_arrow()
            return in_schema(rows.to_arrow(), wanted).append_column(POS, positions)
        present = set(self.storage.parquet_metadata(full).schema.names)
        rows = in_schema(
            self.storage.read_parquet(full, [n for n in wanted.names if n in present]), wanted
        )
        positions = keyed_positions(rows, keys)
        return rows.take(positions).append_column(POS, positions)


def upsert(
    open_table: Callable[[], Table],
    rows: pa.Table,
    keys: tuple[str, ...],
    batch: Batch,
    target: Target | None = None,
    graves: Table | None = None,
    moves: pa.Table | None = None,
    planner: Callable[[Table], tuple[Plan, pa.Table]] | None = None,
) -> int | None:
    """The batch's `rows` (one per key, TOMBSTONE last) upserted on `keys`: the rows added, or
    None when the table holds the batch already (ledger.verdict; ConcurrentImport when it
    holds part of it). `target`: a mirror's, whose batch may take values from the rows it
    replaces (newer_wins.mirrored). `graves`: the tombstones' table, whose newer tombstone of a
    key drops an older record of it. `moves`: a marked mirror's key changes, when the batch
    begins or takes one (its rows that await one are filled). `planner`: what the batch does
    to the table, and the held rows it replaces (FILE, POS), in place of the upsert's rule.
    `open_table` reads the table's current version."""
    for _ in commit_attempts():
        table = open_table()
        if table.transactions.is_replay(table.delta, table.folder, batch):
            return None
        if planner is not None:
            planned, held = planner(table)
        else:
            planned, held = _plan(table, rows, keys, target, graves, moves)
        entry, written, replaced = _rewrite(table, planned, held, keys, batch)
        version = table.delta.version() + 1
        log_path = table.storage.join(table.folder, LOG, f"{version:020d}.json")
        if table.storage.create_new(log_path, entry.encode()):
            table.written.forget(replaced)
            return planned.added.num_rows
        table.written.forget(written)
        for path in written:  # another writer took the version: plan again on what it left
            table.storage.remove(path)
    raise ConcurrentImport(
        f"Delta table {open_table().folder}: {COMMIT_ATTEMPTS} commits lost to other writers in "
        "a row; rerun to resume after what the table holds"
    )


def _plan(
    table: Table,
    rows: pa.Table,
    keys: tuple[str, ...],
    target: Target | None,
    graves: Table | None,
    moves: pa.Table | None = None,
) -> tuple[Plan, pa.Table]:
    """What the batch does (newer_wins.plan), and the held rows of its keys (with FILE and POS:
    where each is), whole where a mirror's batch takes values from the rows it replaces; with
    `moves`, also the rows that await a key change, which it fills (newer_wins.with_fills)."""
    whole = target is not None and (moves is not None or needs_held_values(rows, target))
    wanted = rows.select(list(keys))
    if moves is not None:
        wanted = pa.concat_tables([wanted, awaiting_keys(table, keys).cast(wanted.schema)])
    held = held_rows(table, wanted, keys, None if whole else [*keys, *COORDINATES])
    buried = held_rows(graves, rows, keys, [*keys, *COORDINATES]) if graves else None
    kept = held.drop_columns([FILE, POS])
    planned = plan(rows, kept, keys, buried)
    if whole and target is not None:  # a placeholder is the held value, or NULL
        planned = mirrored(planned, rows, kept, target, moves)
    if moves is not None and target is not None:
        planned = with_fills(planned, kept, moves, target)
    return planned, held


def awaiting_keys(table: Table, keys: tuple[str, ...]) -> pa.Table:
    """The keys of the rows that await a key change (key_change.AWAITS); a file whose
    statistics say it holds none is not read."""
    actions = pa.table(table.delta.get_add_actions(flatten=True))
    counted = f"null_count.{AWAITS}"
    found = []
    for at, path in enumerate(actions.column("path").to_pylist()):
        nulls = actions.column(counted)[at].as_py() if counted in actions.column_names else None
        if nulls is not None and nulls == actions.column("num_records")[at].as_py():
            continue
        rows = table.frame(path).filter(pl.col(AWAITS).is_not_null()).select(list(keys))
        found.append(rows.to_arrow())
    if not found:
        return pa.schema([table.schema.field(k) for k in keys]).empty_table()
    return pa.concat_tables(found)


def every_row(table: Table) -> pa.Table:
    """All the table's rows, with FILE and POS (a small table: a mirror's key changes)."""
    parts = []
    for each in data_files(table.delta):
        rows = table.frame(each.path).to_arrow()
        rows = rows.append_column(FILE, pa.repeat(each.path, rows.num_rows))
        parts.append(rows.append_column(POS, pa.array(np.arange(rows.num_rows, dtype=np.int64))))
    if parts:
        return pa.concat_tables(parts)
    return (
        table.schema.append(pa.field(FILE, pa.string()))
        .append(pa.field(POS, pa.int64()))
        .empty_table()
    )


def held_rows(
    table: Table, rows: pa.Table, keys: tuple[str, ...], columns: list[str] | None
) -> pa.Table:
    """The table's rows whose key is one of those of `rows`, in `columns` (None: all), with
    FILE and POS. Files whose statistics put a key column outside the batch's range of it are
    not read."""
    schema = table.schema
    wanted = rows.select(list(keys)).group_by(list(keys)).aggregate([])
    wanted = in_schema(wanted, pa.schema([schema.field(k) for k in keys]))
    parts = []
    for each in data_files(table.delta, wanted):
        found = table.keyed(each.path, wanted, columns)
        if found.num_rows:
            parts.append(
                found.add_column(found.num_columns - 1, FILE, pa.repeat(each.path, found.num_rows))
            )
    if parts:
        return pa.concat_tables(parts)
    stored = schema if columns is None else pa.schema([schema.field(c) for c in columns])
    return (
        stored.append(pa.field(FILE, pa.string())).append(pa.field(POS, pa.int64())).empty_table()
    )


def _rewrite(
    table: Table, planned: Plan, held: pa.Table, keys: tuple[str, ...], batch: Batch
) -> tuple[str, list[str], list[str]]:
    """The log entry that commits the batch, the files it writes (each file holding a replaced
    key, without those rows; the added rows with the last of them, or alone) and those it
    removes (full paths both)."""
    schema = table.schema
    gone = held.select([*keys, FILE, POS]).join(
        in_schema(planned.replaced, held.select(list(keys)).schema),
        list(keys),
        join_type="left semi",
    )
    files = data_files(table.delta)
    by_path = {each.path: each for each in files}
    table.written.keep_only(
        table.folder, {table.storage.join(table.folder, each.path) for each in files}
    )
    touched = sorted(pc.unique(gone.column(FILE)).to_pylist()) if gone.num_rows else []
    added = _frame(in_schema(planned.added, schema)) if planned.added.num_rows else None
    written: list[str] = []
    for index, path in enumerate(touched):
        rows = table.frame(path)
        dropped = gone.filter(pc.equal(gone.column(FILE), path)).column(POS).to_numpy()
        kept = np.ones(rows.height, dtype=bool)
        kept[dropped] = False
        rows = rows.filter(pl.Series(kept))
        if index == len(touched) - 1 and added is not None:
            rows, added = pl.concat([rows, added.cast(rows.schema)]), None
        if rows.height:
            written.append(_write(table, rows))
    if added is not None:
        written.append(_write(table, added))
    now = int(time.time() * 1000)
    skipped = table.transactions.skipped_after(table.delta, table.folder, batch)
    actions = [
        commit_info(
            "MERGE",
            table.delta.version(),
            now,
            {"numTargetFilesRemoved": len(touched), "numTargetFilesAdded": len(written)},
            **{RANGES: batch.to_json()},
        ),
        *(txn(name, version, now) for name, version in transactions(batch, skipped)),
        *(add(table.storage, table.folder, path, data_change=True) for path in written),
        *(remove(by_path[path], now, data_change=True) for path in touched),
    ]
    replaced = [table.storage.join(table.folder, path) for path in touched]
    return "".join(json.dumps(action) + "\n" for action in actions), written, replaced


def _write(table: Table, rows: pl.DataFrame) -> str:
    """A new data file beside the table's, its rows kept (WrittenFiles) as one chunk: the next
    batch's rewrite of the file starts from them and adds its rows, so a file rewritten every
    batch (a continuous mirror's) would otherwise keep one chunk per batch it ever took."""
    rows = rows.rechunk()
    path = table.storage.join(table.folder, f"part-00000-{uuid.uuid4()}-c000.snappy.parquet")
    rows.write_parquet(path, compression="snappy", storage_options=table.storage.client_options())
    table.written.put(path, rows)
    return path


def _frame(rows: pa.Table) -> pl.DataFrame:
    frame = pl.from_arrow(rows)
    assert isinstance(frame, pl.DataFrame)
    return frame
