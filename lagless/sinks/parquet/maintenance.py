"""A Parquet folder table's maintenance (sinks/maintenance.py): batch folders merged, folders
merged away expired, health.

The unit is a batch folder (`batch=<digest>`, its files and `_ranges.json`). Under the table's
lock (the one every commit takes), the folders `plan` groups are read and their rows written
as one file of a new folder `batch=<digest of their names>`, whose `_ranges.json` lists every
range of the folders it replaces and their names (`merged`). Locally the folder is gathered
hidden and renamed into place, then the folders it replaced are renamed out of sight
(`_merged-<ms>.batch=...`, removed by expiry once older than the history window); on S3 its
`_ranges.json` is written last (the commit point, as for a batch) and the replaced folders are
then removed. A crash between the two leaves both visible: the next commit or round, under the
lock, clears the folders a merged folder names (`_held_ranges`). The ledger counts a range
wherever it is listed, so it holds the same offsets throughout.

A plain folder has no snapshots: a reader that lists the table in the instant between the
rename and the retirement (locally microseconds, on S3 the removal of the replaced folders)
sees those rows twice, and one that listed a folder before it was renamed away fails to open
its files. Readers that need isolation read Delta or Iceberg.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from typing import TYPE_CHECKING

import pyarrow as pa

from lagless.exceptions import TerminalError
from lagless.failpoints import failpoint
from lagless.sinks.maintenance import DataFile, Health, Policy, Round, StoreMaintenance, plan
from lagless.sinks.parquet import (
    LOCK,
    MERGED,
    RANGES,
    RETIRED,
    _held_ranges,
    batch_folders,
    retire,
)

if TYPE_CHECKING:
    from lagless.sinks.parquet import ParquetSink

# A compaction's folder while it is gathered (local): hidden, removed by the next round.
GATHERING = "_compacting-"


class ParquetMaintenance(StoreMaintenance):
    def __init__(self, sink: ParquetSink, run_id: str) -> None:
        self.sink = sink
        # Who holds the table's lock while compacting (storage.py: a rerun takes over its own).
        self.run_id = run_id
        self.storage = sink.storage
        # Where folders cannot be renamed (S3), a merged folder is published by its last put
        # and the folders it replaced are removed at once.
        self.by_put = not sink.storage.renames_folders

    def tables(self, table: str | None) -> list[str]:
        names = self.storage.names(self.sink.location) if table is None else [table, f"{table}_dlq"]
        return [
            name
            for name in names
            if not name.startswith(("_", "."))
            and any(True for _ in batch_folders(self.storage, self._path(name)))
        ]

    def compact(self, table: str, policy: Policy, deadline: float, done: Round) -> None:
        folder = self._path(table)
        lock = self.storage.join(folder, LOCK)
        with self._errors(folder), self.storage.locked(lock, self.run_id, self.sink.retry_s):
            _, left_over = _held_ranges(self.storage, folder)
            for each in left_over:
                retire(self.storage, each)
            self._clear_gathering(folder)
            first = True
            for group in plan(self._folders(folder), policy.target_file_size, policy.thorough):
                if not first and time.monotonic() >= deadline:
                    break
                first = False
                self._merge(folder, [each.path for each in group], done)

    def _merge(self, table: str, names: list[str], done: Round) -> None:
        """The folders' rows into one file of a new folder, which replaces them."""
        ranges = []
        parts = []
        for name in names:
            folder = self.storage.join(table, name)
            listed = self.storage.read_text(self.storage.join(folder, RANGES))
            if listed is None:
                raise TerminalError(f"{folder} lost its {RANGES} under the table's lock")
            doc = json.loads(listed)
            ranges += doc["ranges"]  # as listed: the records each skipped go along
            parts += [self.storage.read_parquet(path) for path in self._data_files(folder)]
        rows = pa.concat_tables(parts, promote_options="permissive")
        digest = hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:20]
        merged = f"batch={digest}"
        manifest = json.dumps({"ranges": ranges, MERGED: sorted(names)})
        if self.by_put:
            target = self.storage.join(table, merged)
            self.storage.write_parquet(self.storage.join(target, "part-00000.parquet"), rows)
            failpoint("mid-compaction")  # the merged file written, its ranges not yet
            self.storage.write_text(self.storage.join(target, RANGES), manifest)
        else:
            gathering = os.path.join(table, f"{GATHERING}{digest}.partial")
            shutil.rmtree(gathering, ignore_errors=True)
            os.makedirs(gathering)
            self.storage.write_parquet(os.path.join(gathering, "part-00000.parquet"), rows)
            self.storage.write_text(os.path.join(gathering, RANGES), manifest)
            failpoint("mid-compaction")  # the merged folder gathered, not yet visible
            os.replace(gathering, os.path.join(table, merged))
        for name in names:
            replaced = self.storage.join(table, name)
            if self.by_put:  # removed at once: counted as expiry's
                files = self.storage.files(replaced)
                done.removed_files += len(files)
                done.removed_bytes += sum(size for size, _ in files.values())
            retire(self.storage, replaced)
        done.compacted_files += len(names)
        done.written_files += 1
        done.rewritten_bytes += self.storage.stat(
            self.storage.join(table, merged, "part-00000.parquet")
        )[0]

    def expire(self, table: str, policy: Policy, done: Round) -> None:
        """Folders merged away (local), and gatherings a crashed compaction left, once older
        than the window (by the time in their name, or their files')."""
        if self.by_put:
            return  # replaced folders are removed at once
        folder = self._path(table)
        cutoff_ms = (time.time() - policy.keep_history_s) * 1000
        expired = [
            name
            for name in self.storage.names(folder)
            if name.startswith(RETIRED) and int(name[len(RETIRED) :].split(".", 1)[0]) < cutoff_ms
        ]
        for position, name in enumerate(expired):
            path = os.path.join(folder, name)
            files = self.storage.files(path)
            shutil.rmtree(path, ignore_errors=True)
            if position == 0:
                failpoint("mid-expiry")  # one folder merged away removed, the others not yet
            done.expired_versions += 1
            done.removed_files += len(files)
            done.removed_bytes += sum(size for size, _ in files.values())

    def health(self, table: str, policy: Policy) -> Health | None:
        folder = self._path(table)
        sizes = []
        for name, _ in batch_folders(self.storage, folder):
            sizes += [
                self.storage.stat(path)[0]
                for path in self._data_files(self.storage.join(folder, name))
            ]
        if not sizes and table not in self.tables(table):
            return None
        on_disk = self.storage.files(folder)
        return Health(
            table=table,
            data_files=len(sizes),
            small_files=sum(size < policy.target_file_size for size in sizes),
            versions=sum(1 for name in self.storage.names(folder) if name.startswith(RETIRED)),
            bytes_on_disk=sum(size for size, _ in on_disk.values()),
            live_bytes=sum(sizes),
            target_file_size=policy.target_file_size,
        )

    def _folders(self, table: str) -> list[DataFile]:
        """The visible batch folders with ranges, as units of compaction: their data bytes."""
        found = []
        for name, listed in batch_folders(self.storage, table):
            if listed is not None:
                folder = self.storage.join(table, name)
                size = sum(self.storage.stat(p)[0] for p in self._data_files(folder))
                found.append(DataFile(name, size))
        return found

    def _data_files(self, folder: str) -> list[str]:
        return [
            self.storage.join(folder, name)
            for name in self.storage.names(folder)
            if name.endswith(".parquet") and not name.startswith(("_", "."))
        ]

    def _clear_gathering(self, table: str) -> None:
        if not self.by_put:
            for name in self.storage.names(table):
                if name.startswith(GATHERING):
                    shutil.rmtree(os.path.join(table, name), ignore_errors=True)

    def _path(self, table: str) -> str:
        return self.storage.join(self.sink.location, table)

    def _errors(self, folder: str) -> contextlib.AbstractContextManager[None]:
        return self.storage.errors(f"Parquet table {folder}")
