"""A Delta table's maintenance (sinks/maintenance.py): compaction, expiry, health.

Compaction reads the small files of the table's current version (`plan`), writes each group's
rows into one file beside them and commits a log entry that removes the group and adds the
file, both with `dataChange: false` (readers of changes skip it; the rows are the same). The
entry is written by lagless itself, only if its version is still free (a put-if-absent of
`_delta_log/<version>.json`, as delta-rs commits): delta-rs 1.6 rebases a compaction (its own
OPTIMIZE too) over a concurrent commit without checking that the files it removes are still
there, which doubled rows in a test. A version another writer took meanwhile is read: appends
are passed (the entry goes to the next version), a removal of one of the group's files or a
change of schema or protocol drops the written file, and the round plans again next time.
The table's application transactions, its ledger, are untouched.

Expiry is Delta's own: the history window is set as the table's
`delta.deletedFileRetentionDuration` and `delta.logRetentionDuration` (so that any Delta tool's
VACUUM honours it too), then VACUUM (files removed from the current version longer ago than
the window, and files no version lists that are older than it: a crashed commit's or
compaction's), a checkpoint when the log grew, and the log entries older than the window and
the checkpoint removed. Application transactions live on in the checkpoint.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lagless.exceptions import TerminalError
from lagless.failpoints import failpoint
from lagless.sinks.delta.log import LOG, data_files, footer_stats, remove, unwritable
from lagless.sinks.maintenance import (
    DataFile,
    Health,
    Policy,
    Round,
    StoreMaintenance,
    beside_others,
    plan,
)
from lagless.sinks.storage import merge_parquet

if TYPE_CHECKING:
    from deltalake import DeltaTable

    from lagless.sinks.delta import DeltaSink

log = logging.getLogger(__name__)

RETENTION = ("delta.deletedFileRetentionDuration", "delta.logRetentionDuration")
# Whether a writer's commits remove log entries past logRetentionDuration (Delta's default:
# true); lagless's expiry does it instead (_clean_log).
NO_LOG_CLEANUP = "delta.enableExpiredLogCleanup"
# Versions other writers took (appends) that a compaction's entry moves past before it gives up.
VERSIONS_PASSED = 50
# Log entries a reader replays past the last checkpoint, at most (a compaction round's): a
# round comes every 4 batches of a busy import (importer/maintenance.py), its own entry the
# fifth, so each such round writes one. Opening a live table with 7 entries past its checkpoint
# took 8.5 ms, 2.8 ms after a checkpoint (a copy of one version: 1.3 ms).
CHECKPOINT_EVERY = 5


@dataclass(frozen=True)
class Merged:
    """A compaction's file, beside the table's: its name, bytes, time and statistics."""

    name: str
    size: int
    modified: int
    stats: dict[str, Any]


class DeltaMaintenance(StoreMaintenance):
    def __init__(self, sink: DeltaSink) -> None:
        self.sink = sink
        self.storage = sink.storage

    def tables(self, table: str | None) -> list[str]:
        if table is None:
            names = self.storage.names(self.sink.location)
        else:
            names = [table, f"{table}_dlq", f"{table}_tombstones", f"{table}_moves"]
        return [name for name in names if self._has_log(name)]

    def compact(self, table: str, policy: Policy, deadline: float, done: Round) -> None:
        from deltalake.exceptions import CommitFailedError

        with beside_others(f"Delta table {self._path(table)}", CommitFailedError):
            self._compact(table, policy, deadline, done)

    def _compact(self, table: str, policy: Policy, deadline: float, done: Round) -> None:
        """Groups until the deadline, each planned on the table as its last commit left it;
        then a checkpoint once the log grew by CHECKPOINT_EVERY entries since the last (a
        reader replays at most that many; delta-rs checkpoints every 100 of its commits)."""
        delta = self._open(table)
        if delta is None:
            return
        refused = unwritable(delta)
        if refused:
            done.skipped = refused
            return
        first = True
        while first or time.monotonic() < deadline:
            first = False
            groups = plan(data_files(delta), policy.target_file_size, policy.thorough)
            if not groups:
                break
            if not self._rewrite(table, delta, groups[0], policy, done):
                done.skipped = "another writer took the version; planned again next round"
                break
            delta.update_incremental()
        delta.update_incremental()
        if delta.version() - _last_checkpoint(self.storage, self._path(table)) >= CHECKPOINT_EVERY:
            delta.create_checkpoint()

    def _rewrite(
        self, table: str, delta: DeltaTable, group: list[DataFile], policy: Policy, done: Round
    ) -> bool:
        """One group into one file, committed as the version after the one planned on; False
        when another writer took that version first (the file written is removed)."""
        folder = self._path(table)
        sources = [self.storage.join(folder, f.path) for f in group]
        expected = sum(
            f.records or self.storage.parquet_metadata(path).num_rows
            for f, path in zip(group, sources, strict=True)
        )
        name = f"part-00000-{uuid.uuid4()}-c000.compacted.parquet"
        path = self.storage.join(folder, name)
        merged_rows = merge_parquet(self.storage, sources, path)
        if merged_rows != expected:
            self.storage.remove(path)
            raise TerminalError(
                f"Delta table {folder}: its files hold {merged_rows} rows where the log counts "
                f"{expected}; compaction refused"
            )
        failpoint("mid-compaction")  # the merged file beside the table's, not in its log
        size, modified = self.storage.stat(path)
        merged = Merged(name, size, modified, footer_stats(self.storage.parquet_metadata(path)))
        if not self._commit(folder, delta.version(), group, merged, policy):
            self.storage.remove(path)
            return False
        done.compacted_files += len(group)
        done.written_files += 1
        done.rewritten_bytes += size
        return True

    def _commit(
        self, folder: str, read_version: int, group: list[DataFile], merged: Merged, policy: Policy
    ) -> bool:
        """The log entry put as the first free version after `read_version`. A version another
        writer took meanwhile is read: one that removed a file of the group, or changed the
        table's schema or protocol, conflicts (False); appends do not, and the entry is tried
        at the next version (Delta's own rule for a rewrite beside blind appends)."""
        gone = {each.path for each in group}
        version = read_version + 1
        for _ in range(VERSIONS_PASSED):
            entry = _entry(version - 1, group, merged, policy)
            log_path = self.storage.join(folder, LOG, f"{version:020d}.json")
            if self.storage.create_new(log_path, entry.encode()):
                return True
            if _conflicts(self.storage.read_text(log_path) or "", gone):
                return False
            version += 1
        return False

    def expire(self, table: str, policy: Policy, done: Round) -> None:
        """VACUUM by the table's window (window_s), then the log cleaned (_clean_log) and a
        checkpoint when the log grew. Another writer's commit or cleanup meanwhile (a vacuum's
        commit refused, a log file gone under a read) is ConcurrentMaintenance: the files
        removed stay removed, and the next round or try goes on from the table as it is."""
        from deltalake.exceptions import CommitFailedError

        folder = self._path(table)
        with beside_others(f"Delta table {folder}", CommitFailedError):
            delta = self._open(table)
            if delta is None:
                return
            window = self._window(delta, policy, done)
            before = self.storage.files(folder)
            removed = delta.vacuum(dry_run=False, full=True)
            failpoint("mid-expiry")  # old files removed, the log not yet cleaned
            done.removed_files += len(removed)
            done.removed_bytes += sum(before.get(path, (0, 0))[0] for path in removed)
            done.live_bytes = sum(each.size for each in data_files(delta))
            done.expired_versions += _clean_log(self.storage, folder, window)
            delta.update_incremental()
            if delta.version() > _last_checkpoint(self.storage, folder):
                delta.create_checkpoint()

    def _window(self, delta: DeltaTable, policy: Policy, done: Round) -> float:
        """The table's history window, in seconds: one number it keeps, as Delta's retention
        properties (which any Delta tool's VACUUM honours), set by the import that maintains
        it (`policy.sets_window`); `lagless maintain` applies it, and sets its own only on a
        table that keeps none. Log cleanup by a writer's commit is turned off: expiry's own
        keeps what the window's versions need."""
        asked = f"interval {max(1, math.ceil(policy.keep_history_s))} seconds"
        configured = delta.metadata().configuration
        kept = configured.get(RETENTION[1])
        wanted = asked if policy.sets_window or kept is None else kept
        properties = dict.fromkeys(RETENTION, wanted) | {NO_LOG_CLEANUP: "false"}
        if any(configured.get(name) != value for name, value in properties.items()):
            delta.alter.set_table_properties(properties)
        window = _seconds(wanted, policy.keep_history_s)
        if window != max(1, math.ceil(policy.keep_history_s)):
            done.window_s = window
        return window

    def health(self, table: str, policy: Policy) -> Health | None:
        delta = self._open(table)
        if delta is None:
            return None
        files = data_files(delta)
        folder = self._path(table)
        on_disk = self.storage.files(folder)
        return Health(
            table=table,
            data_files=len(files),
            small_files=sum(f.size < policy.target_file_size for f in files),
            versions=len(_log_entries(self.storage.names(self.storage.join(folder, LOG)))),
            bytes_on_disk=sum(size for size, _ in on_disk.values()),
            live_bytes=sum(f.size for f in files),
            target_file_size=policy.target_file_size,
            extra={"commits": delta.version() + 1},
        )

    def _path(self, table: str) -> str:
        return self.storage.join(self.sink.location, table)

    def _has_log(self, table: str) -> bool:
        return bool(self.storage.names(self.storage.join(self._path(table), LOG)))

    def _open(self, table: str) -> DeltaTable | None:
        return self.sink._open_or_none(table) if self._has_log(table) else None


def _entry(read_version: int, group: list[DataFile], merged: Merged, policy: Policy) -> str:
    """The log entry: commit info, the merged file added, the group removed, no data change."""
    now = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [
        {
            "commitInfo": {
                "timestamp": now,
                "operation": "OPTIMIZE",
                "operationParameters": {"targetSize": str(policy.target_file_size)},
                "readVersion": read_version,
                "isBlindAppend": False,
                "operationMetrics": {"numFilesAdded": 1, "numFilesRemoved": len(group)},
                "clientVersion": "lagless",
            }
        },
        {
            "add": {
                "path": merged.name,
                "partitionValues": {},
                "size": merged.size,
                "modificationTime": merged.modified,
                "dataChange": False,
                "stats": json.dumps(merged.stats),
            }
        },
    ]
    actions += [remove(each, now, data_change=False) for each in group]
    return "".join(json.dumps(action) + "\n" for action in actions)


def _conflicts(entry: str, gone: set[str]) -> bool:
    """Another writer's log entry removed one of `gone`, or changed the table's metadata or
    protocol (an entry not yet readable counts as a conflict)."""
    if not entry:
        return True
    for line in entry.splitlines():
        action = json.loads(line) if line.strip() else {}
        if "metaData" in action or "protocol" in action:
            return True
        if "remove" in action and action["remove"]["path"] in gone:
            return True
    return False


def _clean_log(storage: Any, folder: str, window_s: float) -> int:
    """The log entries and checkpoints no version inside the window needs removed: those
    before the newest checkpoint at or below the oldest version younger than the window (or
    the current version, when none is), from which, and the entries after it, every version
    inside the window loads: one rule, whoever else writes the table (commits' own cleanup is
    turned off, _window). Returns the entries removed."""
    log_folder = storage.join(folder, LOG)
    files = storage.files(log_folder)
    named = _log_entries(list(files))
    entries = {int(n.removesuffix(".json")): t for n, (_, t) in files.items() if n in named}
    if not entries:
        return 0
    cutoff = (time.time() - window_s) * 1000
    inside = [version for version, modified in entries.items() if modified >= cutoff]
    oldest_needed = min(inside) if inside else max(entries)
    checkpoints = [v for v in _checkpoints(list(files)) if v <= oldest_needed]
    if not checkpoints:
        return 0
    base = max(checkpoints)
    removed = 0
    for name in sorted(files):
        version = _version_of(name)
        if version is not None and version < base:
            storage.remove(storage.join(log_folder, name))
            removed += name in _log_entries([name])
    return removed


def _version_of(name: str) -> int | None:
    """The version a log file (entry, checkpoint part, checksum) is of; None for others."""
    head = name.split(".", 1)[0]
    return int(head) if head.isdigit() and len(head) == 20 else None


def _checkpoints(names: list[str]) -> set[int]:
    """The versions with a complete single-part checkpoint (lagless's and delta-rs's)."""
    return {
        int(n.split(".", 1)[0])
        for n in names
        if n.endswith(".checkpoint.parquet") and _version_of(n) is not None
    }


def _seconds(interval: str, otherwise: float) -> float:
    """Delta's `interval N seconds` (or minutes, hours, days, weeks) in seconds; `otherwise`
    for a text that is none of these."""
    units = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800}
    parts = interval.lower().removeprefix("interval").split()
    if len(parts) != 2 or parts[1].rstrip("s") not in units:
        return otherwise
    try:
        return float(parts[0]) * units[parts[1].rstrip("s")]
    except ValueError:
        return otherwise


def _log_entries(names: list[str]) -> set[str]:
    return {n for n in names if n.endswith(".json") and n.removesuffix(".json").isdigit()}


def _last_checkpoint(storage: Any, folder: str) -> int:
    text = storage.read_text(storage.join(folder, LOG, "_last_checkpoint"))
    return int(json.loads(text)["version"]) if text else -1
