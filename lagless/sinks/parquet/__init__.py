"""Parquet files, written on the executors, one folder per batch, named by its offsets.

Each micro-batch goes to its own folder `<dir>/<table>/batch=<digest>`, the digest of the
offset ranges it holds, listed in the folder's `_ranges.json` (dead letters to
`<dir>/<table>_dlq/batch=<digest>`). Raw values are written by the Kafka source's tasks
themselves (sinks/staged_parquet.py): the files wait under `<table>/_staging/<run>`. Other rows
are written by Spark into `<table>/_batch=<digest>.partial`. Either way the driver makes the
batch visible by renaming one folder, files and ranges together, into place, so a reader
listing the folder never sees part of a batch (names starting with `_` are hidden from pyarrow
and Spark).

The folders' `_ranges.json` are the table's ledger (sinks/ledger.py): a batch whose offsets the
table holds already (a replay, or the same offsets imported again from another checkpoint) is
not added; one that overlaps them (another import wrote meanwhile) is refused. A commit holds
the table's `_lagless.lock` while it decides and renames. No import replaces another's folder.
Folders an earlier lagless named by Spark's batch id (`batch=<n>`, no `_ranges.json`) count by
the offsets their files hold.

On S3 (`parquet+s3://bucket/prefix`, sinks/s3.py) there is no rename: Spark's own writer
needs Hadoop's S3 jars, so every batch is written by the tasks into `_staging` (raw values by
the source's tasks, other rows through mapInArrow), and the commit, under the lock object
(storage.py), copies the files into `batch=<digest>` and writes its `_ranges.json` last. Only a
folder with `_ranges.json` counts; one without is a crashed commit's, removed by the next
commit under the lock before it decides. A reader listing the table during a commit (or after
a crash, until the rerun's commit) may see part of a batch; the table as the ledger holds it
never doubles nor skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lagless.exceptions import BadInput
from lagless.failpoints import failpoint
from lagless.sinks.base import (
    ALREADY_HELD,
    DEAD_LETTER_COLUMNS,
    Target,
    Written,
    check_writable_path,
)
from lagless.sinks.folder_table import HELD_RECORD_COLUMNS, FolderTableSink, newest_rows_in
from lagless.sinks.ledger import (
    TP,
    Batch,
    HeldRecord,
    Range,
    Verdict,
    held_until,
    skipped_listed,
    verdict,
)
from lagless.sinks.storage import LocalStorage, Storage
from lagless.sinks.task_files import stage_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


# Offsets, timestamps and values are nearly all distinct: trying a dictionary for them cost a
# tenth of the write (measured on 2.4M records of 100 B) and made no file smaller.
WRITE_OPTIONS = {
    f"parquet.enable.dictionary#{column}": "false" for column in ("offset", "timestamp", "value")
}
RANGES = "_ranges.json"
# In a merged folder's `_ranges.json` (parquet/maintenance.py): the folders it replaced.
MERGED = "merged"
# A replaced folder, hidden until expiry: `_merged-<ms>.batch=<digest>`.
RETIRED = "_merged-"


def _no_op() -> None:
    pass


LOCK = "_lagless.lock"


class ParquetSink(FolderTableSink):
    scheme = "parquet"

    def check(self, target: Target) -> None:
        if target.mode != "append" and target.value_format == "debezium":
            raise BadInput(
                "plain Parquet folders are append only: a Debezium mirror needs sqlite, "
                "postgresql, delta or iceberg; --write append keeps the change log itself"
            )
        if target.mode != "append":
            raise BadInput(
                "the parquet sink supports --write append only; use sqlite or postgresql to upsert"
            )
        if self.s3:
            self.storage.check_writable(self.location, "Parquet folder")
            return
        tables = [os.path.join(self.location, t) for t in (target.table, target.dead_letter_table)]
        for folder in (self.location, *tables, self._staging(target)):
            check_writable_path(folder, "directory", folder=True)

    def prepare(self, target: Target) -> None:
        for table in (target.table, target.dead_letter_table):
            self.storage.makedirs(self.storage.join(self.location, table))

    def ledger(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        table = self.storage.join(self.location, target.table)
        with self.storage.errors(f"Parquet table {table}"):
            return held_until(_held_ranges(self.storage, table)[0])

    def skipped(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        """From the `_ranges.json` of the batch folders (a merged folder's lists those of the
        batches it replaced, which are not counted again)."""
        table = self.storage.join(self.location, target.table)
        found: dict[TP, int] = {}
        with self.storage.errors(f"Parquet table {table}"):
            docs = {
                name: json.loads(text)
                for name, text in batch_folders(self.storage, table)
                if text is not None
            }
        replaced = {name for doc in docs.values() for name in doc.get(MERGED, ())}
        for name, doc in docs.items():
            if name not in replaced:
                for tp, n in skipped_listed(doc).items():
                    found[tp] = found.get(tp, 0) + n
        return found

    def newest_rows(self, target: Target, held: Mapping[TP, int]) -> dict[TP, HeldRecord]:
        """Read in the batch folder that holds each partition's newest range only."""
        import polars as pl

        table = self.storage.join(self.location, target.table)
        newest: dict[TP, tuple[int, str]] = {}
        # A folder a merged one replaced (a crashed compaction left both): the merged one's.
        in_folders, left_over = _held_in_folders(self.storage, table)
        for folder, tp, (_, end) in in_folders:
            if tp in held and folder not in left_over and end > newest.get(tp, (-1, ""))[0]:
                newest[tp] = (end, folder)
        found: dict[TP, HeldRecord] = {}
        for folder in sorted({folder for _, folder in newest.values()}):
            files = [
                self.storage.read_parquet(self.storage.join(folder, name), HELD_RECORD_COLUMNS)
                for name in self.storage.names(folder)
                if name.endswith(".parquet") and not name.startswith(("_", "."))
            ]
            if files:
                rows = pl.from_arrow(pa.concat_tables(files, promote_options="default"))
                assert isinstance(rows, pl.DataFrame)
                wanted = {tp: held[tp] for tp, (_, where) in newest.items() if where == folder}
                found |= newest_rows_in(rows.lazy(), wanted)
        return found

    def write(
        self, rows: DataFrame, target: Target, batch: Batch, before_commit: Callable[[], None]
    ) -> Written | None:
        """A batch's rows, written by Spark's tasks, then made visible in one rename (on S3:
        written by the tasks through pyarrow, committed by the lock's copy). Typed values
        keep their nested types; a field the schema added is a column of the files written
        since (readers merge the files' schemas)."""
        rows = rows.select(*target.schema().fieldNames())
        return self._write(rows, target, target.table, batch, before_commit)

    def write_dead_letters(self, rows: DataFrame, target: Target, batch: Batch) -> None:
        """Its rejected records, as the rows are, before the batch's rows are visible."""
        rows = rows.select(*DEAD_LETTER_COLUMNS)
        self._write(rows, target, target.dead_letter_table, batch)

    def commit_staged(self, files: list[str], target: Target, batch: Batch) -> Written | None:
        """Make the batch's staged files visible as `batch=<digest>` in one rename."""
        files = sorted(set(files))
        table = self.storage.join(self.location, target.table)
        if not self.storage.renames_folders:
            return _said(
                _commit_by_put(self.storage, table, files, batch, target.run_id, self.retry_s)
            )
        gathering = _gathering(table, batch)
        shutil.rmtree(gathering, ignore_errors=True)
        os.makedirs(gathering)
        for path in files:
            os.replace(path, os.path.join(gathering, os.path.basename(path)))
        said = _said(_make_visible(table, batch))
        self.tidy_staging(target)
        return said

    def _write(
        self,
        rows: DataFrame,
        target: Target,
        table: str,
        batch: Batch,
        before_commit: Callable[[], None] = _no_op,
    ) -> Written | None:
        folder = self.storage.join(self.location, table)
        if not self.storage.renames_folders:
            staging = self._staging(target, table)
            clear = self.storage.remove_tree
            files = stage_rows(rows, staging, clear=clear, s3=self.storage.task_access)
            before_commit()
            return _said(
                _commit_by_put(self.storage, folder, files, batch, target.run_id, self.retry_s)
            )
        rows.write.options(**WRITE_OPTIONS).mode("overwrite").parquet(_gathering(folder, batch))
        before_commit()
        return _said(_make_visible(folder, batch))


def _said(visible: bool) -> Written | None:
    """A batch made visible gains a row per record (None); one the table held, nothing."""
    return None if visible else ALREADY_HELD


def folder_name(batch: Batch) -> str:
    return f"batch={batch.digest()}"


def _gathering(table: str, batch: Batch) -> str:
    """Where a batch's files wait, hidden, until they are all there."""
    return os.path.join(table, f"_{folder_name(batch)}.partial")


def _make_visible(table: str, batch: Batch) -> bool:
    """The gathered batch, with its ranges, becomes `batch=<digest>` in one rename, unless the
    table holds its offsets already (ledger.verdict; then the gathered files are dropped and
    False is returned)."""
    gathering = _gathering(table, batch)
    with open(os.path.join(gathering, RANGES), "w", encoding="utf-8") as handle:
        handle.write(batch.to_json())
    storage = LocalStorage()
    # Any run may wait for the flock: the kernel drops it with a crashed holder.
    with storage.locked(os.path.join(table, LOCK), "", 0):
        held, superseded = _held_ranges(storage, table)
        for folder in superseded:
            retire(storage, folder)
        if verdict(batch, held_until(held)) is Verdict.REPLAY:
            shutil.rmtree(gathering)
            return False
        failpoint("mid-write")  # files written, the batch not yet visible nor committed
        os.replace(gathering, os.path.join(table, folder_name(batch)))
    return True


def _commit_by_put(
    storage: Storage, table: str, files: list[str], batch: Batch, run_id: str, wait_s: float
) -> bool:
    """Where folders cannot be renamed (S3), under the table's lock object: unless the table
    holds the batch (then its staged files are dropped), the files copied into
    `batch=<digest>` and its `_ranges.json` written last, the commit point. Folders a
    crashed commit left without `_ranges.json` go first."""
    with (
        storage.errors(f"Parquet table {table}"),
        storage.locked(storage.join(table, LOCK), run_id, wait_s),
    ):
        held, left_over = _held_ranges(storage, table)
        for folder in left_over:
            storage.remove_tree(folder)
        if verdict(batch, held_until(held)) is Verdict.REPLAY:
            for path in files:
                storage.remove(path)
            return False
        folder = storage.join(table, folder_name(batch))
        for path in files:
            storage.move(path, storage.join(folder, path.rsplit("/", 1)[-1]))
        failpoint("mid-write")  # files in the batch's folder, its ranges not yet written
        storage.write_text(storage.join(folder, RANGES), batch.to_json())
    return True


def _held_ranges(storage: Storage, table: str) -> tuple[list[tuple[TP, Range]], list[str]]:
    """Every range the visible batches of the table hold; and the folders the next commit
    clears (`left over`): where folders are published by a put (S3), the batch folders a
    crashed commit left without ranges, and folders a merged folder replaced that a crashed
    compaction left visible."""
    held, left_over = _held_in_folders(storage, table)
    return [(tp, held_range) for _, tp, held_range in held], left_over


def _held_in_folders(storage: Storage, table: str) -> tuple[list[tuple[str, TP, Range]], list[str]]:
    """_held_ranges, each range with the batch folder that holds it."""
    held: list[tuple[str, TP, Range]] = []
    left_over = []
    replaced: set[str] = set()
    names = set()
    for name, listed in batch_folders(storage, table):
        names.add(name)
        folder = storage.join(table, name)
        if listed is not None:
            doc = json.loads(listed)
            ranges = ranges_listed(doc)
            replaced.update(doc.get(MERGED, ()))
        elif not storage.renames_folders:
            left_over.append(folder)
            continue
        else:
            ranges = list(_ranges_in_files(folder))
        held.extend((folder, tp, held_range) for tp, held_range in ranges)
    left_over += [storage.join(table, name) for name in sorted(replaced & names)]
    return held, left_over


def batch_folders(storage: Storage, table: str) -> Iterator[tuple[str, str | None]]:
    """The visible batch folders (`batch=...`), each with its `_ranges.json`'s text (None: an
    earlier lagless's folder, or on S3 a crashed commit's)."""
    for name in storage.names(table):
        folder = storage.join(table, name)
        if name.startswith("batch=") and (not storage.renames_folders or os.path.isdir(folder)):
            yield name, storage.read_text(storage.join(folder, RANGES))


def ranges_listed(doc: dict[str, Any]) -> list[tuple[TP, Range]]:
    """The ranges a `_ranges.json` lists: a batch's, one per partition; a merged folder's,
    every range of the batches it replaced."""
    return [
        ((r["topic"], int(r["partition"])), (int(r["start"]), int(r["end"]))) for r in doc["ranges"]
    ]


def retire(storage: Storage, folder: str) -> None:
    """A batch folder a merged folder replaced: hidden (`_merged-<ms>.batch=...`, removed by
    expiry once out of the history window); where folders cannot be renamed (S3), removed."""
    if not storage.renames_folders:
        storage.remove_tree(folder)
        return
    parent, name = os.path.split(folder)
    with contextlib.suppress(FileNotFoundError):  # retired already
        os.replace(folder, os.path.join(parent, f"{RETIRED}{int(time.time() * 1000)}.{name}"))


def _ranges_in_files(folder: str) -> Iterator[tuple[TP, Range]]:
    """A batch folder an earlier lagless wrote without `_ranges.json`: the offsets its files
    hold, per partition (from the first to the last, as its batch covered them)."""
    import pyarrow.dataset as ds

    files = ds.dataset(folder, format="parquet", partitioning=None)
    rows = files.to_table(columns=["topic", "partition", "offset"])
    if rows.num_rows == 0:
        return
    grouped = rows.group_by(["topic", "partition"]).aggregate(
        [("offset", "min"), ("offset", "max")]
    )
    for topic, partition, low, high in zip(
        *(
            grouped.column(c).to_pylist()
            for c in ("topic", "partition", "offset_min", "offset_max")
        ),
        strict=True,
    ):
        yield (topic, int(partition)), (int(low), int(high) + 1)
