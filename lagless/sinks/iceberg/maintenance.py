"""An Iceberg table's maintenance (sinks/maintenance.py): compaction, expiry, health.

Compaction reads the small data files of the current snapshot (`plan`), writes their rows again
through pyiceberg's writer (field ids, metrics, the table's target file size) and commits one
snapshot that deletes the group's files and adds the new ones (pyiceberg 0.12 has no rewrite
action: an `overwrite` snapshot whose rows are the same). The snapshot carries `lagless.held`
and an upsert table's `lagless.log-times` (summary.py), so the ledger survives the expiry of
every snapshot before it. A commit another writer beat (the catalog refuses a commit built on an
older snapshot; the table's commits are not retried by pyiceberg: NO_RETRIES) is built again on
the new snapshot while the group's files are all still in it (an append passes); else the
written files are removed and the next round plans again.

Expiry drops the snapshots older than the history window or past the newest MOST_SNAPSHOTS
(which compaction trims to as well), except the one current at their start (a reader may still
be reading it) and the snapshots from the current one back to the newest that carries the
ledger; then the files no kept snapshot reads (data files, manifests, manifest lists, and
metadata files of a SQL catalog) once they are older than the window: those of expired
snapshots, and those a crashed commit or compaction left.
Manifests are immutable: what each holds is read once and kept by this object.

An import's rounds fold beside its batches (`aside`, fold.py): a round starts the fold of the
files past FOLD_SHARE on a thread of its own and leaves them out of its groups; the first round
after it ended (the schedule asks after every batch) commits it, the deletes batches added
meanwhile moved to the new files. `lagless maintain` folds in the round.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import numpy as np
import pyarrow as pa

from lagless.exceptions import TerminalError
from lagless.failpoints import failpoint
from lagless.retry import commit_attempts
from lagless.sinks.base import in_schema
from lagless.sinks.iceberg.fold import Fold, Folded, moved_positions
from lagless.sinks.iceberg.row_delta import (
    FOLD_SHARE,
    Entries,
    ManifestEntries,
    UnreadDeletes,
    commit_row_delta,
    deleted_positions,
    read_entries,
    referenced_data_file,
    transaction,
    write_delete_files,
)
from lagless.sinks.iceberg.summary import HELD, carried, held_in, log_times_in, skipped_in
from lagless.sinks.maintenance import (
    DataFile,
    Health,
    Policy,
    Round,
    StoreMaintenance,
    beside_others,
    plan,
)

# Snapshots a table keeps at most, whatever the history window: every commit rewrites the
# table's metadata file, which lists each kept snapshot with its summary (the ledger's ranges
# of every partition). With 64 partitions, a batch's commit took 0.25 s with 200 snapshots kept
# and 0.67 s with 600 (5.2 MB of metadata); a one-hour window at a half-second trigger keeps
# ~7,200.
MOST_SNAPSHOTS = 100

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile as IcebergFile
    from pyiceberg.manifest import ManifestFile
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

    from lagless.sinks.iceberg import IcebergSink

METADATA = ("data", "metadata")
# The table property that keeps its history window (Iceberg's own name for it, which its
# expire_snapshots action honours).
MAX_SNAPSHOT_AGE = "history.expire.max-snapshot-age-ms"
# Commits other writers made first that a compaction is built again after before it gives up.
# How far a file's modification time (the storage's clock) may be before this machine's.
CLOCK_MARGIN_MS = 2000


class IcebergMaintenance(StoreMaintenance):
    def __init__(self, sink: IcebergSink) -> None:
        self.sink = sink
        self.storage = sink.storage
        # Each manifest's live entries, read once: by rounds, commit attempts and expiry.
        self.entries = ManifestEntries()
        # Manifest list -> its manifests.
        self._lists: dict[str, list[ManifestFile]] = {}
        # Per table, its fold beside the batches, under way or ended and not yet committed.
        self._folds: dict[str, Fold] = {}

    def tables(self, table: str | None) -> list[str]:
        with self.sink._catalog_errors():
            catalog = self.sink._catalog(create=False)
            if catalog is None:
                return []
            if table is not None:
                names = [table, f"{table}_dlq", f"{table}_tombstones", f"{table}_moves"]
                return [name for name in names if self.sink._load(catalog, name) is not None]
            found = []
            for namespace in catalog.list_namespaces():
                for ident in catalog.list_tables(namespace):
                    space, name = ".".join(ident[:-1]), ident[-1]
                    found.append(name if space == "default" else f"{space}.{name}")
            return sorted(found)

    def compact(self, table: str, policy: Policy, deadline: float, done: Round) -> None:
        from pyiceberg.exceptions import CommitFailedException

        with beside_others(f"Iceberg table {table!r}", CommitFailedException):
            self._compact(table, policy, deadline, done)

    def _compact(self, table: str, policy: Policy, deadline: float, done: Round) -> None:
        """The small files merged (group after group until the deadline), then the snapshots
        trimmed to MOST_SNAPSHOTS once they passed it by half: an import's frequent rounds
        keep every commit's cost bounded between its expiries."""
        seen = self._merge(table, policy, deadline, done)
        if seen + 1 <= MOST_SNAPSHOTS * 3 // 2:  # the merge's own commit is one more at most
            return
        with self.sink._catalog_errors():
            found = self.sink._table(table)  # as the merge left it
            if len(found.metadata.snapshots) > MOST_SNAPSHOTS * 3 // 2:
                _expire_snapshots(found, _cutoff_ms(found, _applied(found, policy)), done)

    def _merge(self, table: str, policy: Policy, deadline: float, done: Round) -> int:
        """The small files merged, and the deletes folded into the files that lost FOLD_SHARE
        of their rows to them (row_delta.py; beside the batches when `aside`, a fold ended
        committed first); the table's snapshots before (a round that trims none loads the table
        once)."""
        self.settle(table, done)
        with self.sink._catalog_errors():
            found = self.sink._table(table)
            seen = len(found.metadata.snapshots)
            current, deletes = _files(found, self.entries)
            try:
                deleted = deleted_positions(deletes.values(), self.sink._read_data)
            except UnreadDeletes as exc:
                done.skipped = str(exc)  # merging its files would bring deleted rows back
                return seen
            # A delete file of several data files (an earlier lagless's) is written again as
            # one per file first, the files being folded included: none is left aside.
            several = any(referenced_data_file(f) is None for f in deletes.values())
            folding = self._folds[table].paths if table in self._folds and not several else set()
            folded = {
                path
                for path, f in current.items()
                if len(deleted.get(path, ())) >= FOLD_SHARE * f.record_count and path not in folding
            }
            if self.aside and folded and not several:
                self._fold_aside(table, found, [current[path] for path in folded], deleted)
                folding, folded = folding | folded, set()
            # A file being folded is no group's, and its deletes are left to the fold.
            current = {path: f for path, f in current.items() if path not in folding}
            mergeable = {
                path: f for path, f in deletes.items() if referenced_data_file(f) not in folding
            }
            sized = [DataFile(path, f.file_size_in_bytes) for path, f in current.items()]
            # The folds first: a file they rewrite alone is no small-file group.
            groups = [[f] for f in sized if f.path in folded] + plan(
                [f for f in sized if f.path not in folded], policy.target_file_size, policy.thorough
            )
            chosen, written = self._rewrite_groups(found, current, groups, deleted, deadline)
            rewritten = {f.file_path for f in chosen}
            stale, restated = _stale_deletes(mergeable, rewritten, set(current))
            if not chosen and not stale:
                return seen
            merged = _kept_deletes(found, deleted, restated)
            failpoint("mid-compaction")  # the merged files written, not in any snapshot
            seen_deletes = list(deletes.values())
            if not self._commit(table, chosen, seen_deletes, [*written, *merged], stale):
                done.skipped = "another writer committed meanwhile; planned again next round"
                return seen
        done.compacted_files += len(chosen)
        done.written_files += len(written)
        done.rewritten_bytes += sum(f.file_size_in_bytes for f in written)
        done.merged_deletes += len(stale)
        return seen

    def _rewrite_groups(
        self,
        found: Table,
        current: dict[str, IcebergFile],
        groups: list[list[DataFile]],
        deleted: dict[str, pa.Array],
        deadline: float,
    ) -> tuple[list[IcebergFile], list[IcebergFile]]:
        """Each group's files written again as one, in order, until the deadline (the first
        group always): the files chosen, and those written. A write that fails removes what
        the round wrote."""
        chosen: list[IcebergFile] = []
        written: list[IcebergFile] = []
        writes: list[uuid.UUID] = []
        try:
            for group in groups:
                if chosen and time.monotonic() >= deadline:
                    break
                files = [current[each.path] for each in group]
                writes.append(uuid.uuid4())
                written += self._rewrite(found, files, deleted, writes[-1])
                chosen += files
        except Exception:
            self._remove_written(found, writes)
            raise
        return chosen, written

    def _remove_written(self, found: Table, writes: list[uuid.UUID]) -> None:
        """The files of the writes a failed round made (a full disk leaves one cut short; its
        name holds the write's id), which no snapshot reads."""
        data = self.storage.join(_path(found.location()), "data")
        ids = [str(each) for each in writes]
        for relative in self.storage.files(data):
            if any(each in relative for each in ids):
                self.storage.remove(self.storage.join(data, relative))

    def _rewrite(
        self,
        found: Table,
        files: list[IcebergFile],
        deleted: dict[str, pa.Array],
        write_uuid: uuid.UUID | None = None,
    ) -> list[IcebergFile]:
        """The files' rows but those deleted, written again as the table's data files; the
        row count checked against the manifests'."""
        from pyiceberg.io.pyarrow import _dataframe_to_data_files

        schema = found.schema().as_arrow()
        parts = []
        expected = 0
        for each in files:
            rows = in_schema(self.storage.read_parquet(_path(each.file_path)), schema)
            gone = deleted.get(each.file_path)
            if gone is not None:
                rows = rows.filter(_kept_rows(rows.num_rows, gone))
            parts.append(rows)
            expected += each.record_count - (len(gone) if gone is not None else 0)
        rows = pa.concat_tables(parts)
        if rows.num_rows != expected:
            raise TerminalError(
                f"Iceberg table {found.name()}: its files hold {rows.num_rows} rows where the "
                f"manifests and deletes count {expected}; compaction refused"
            )
        if not rows.num_rows:
            return []  # every row deleted (pyiceberg's writer divides by 0 rows)
        return list(
            _dataframe_to_data_files(
                found.metadata, rows, found.io, write_uuid=write_uuid or uuid.uuid4()
            )
        )

    def _commit(
        self,
        table: str,
        removed: list[IcebergFile],
        deletes: list[IcebergFile],
        added: list[IcebergFile],
        replaced_deletes: list[IcebergFile] | None = None,
    ) -> bool:
        """One snapshot that swaps `removed` and the delete files `replaced_deletes` (default:
        all of `deletes`, those the round saw) for `added`. A commit another writer beat is
        built again on the table it left while that writer removed none of `removed` and added
        or removed no delete file (appends pass); else the written files are removed and
        False."""
        from pyiceberg.exceptions import CommitFailedException

        for _ in commit_attempts():
            found = self.sink._table(table)
            current, deleting = _files(found, self.entries)
            if any(each.file_path not in current for each in removed):
                break
            if set(deleting) != {each.file_path for each in deletes}:
                break  # another writer's deletes may name rows of the files rewritten
            tx = transaction(found)
            properties = carried(held_in(found), log_times_in(found), skipped_in(found))
            replaced = deletes if replaced_deletes is None else replaced_deletes
            gone = [current[each.file_path] for each in removed] + replaced
            commit_row_delta(tx, properties, added=added, removed=gone, entries=self.entries)
            try:
                tx.commit_transaction()
                return True
            except CommitFailedException:
                continue
        for each in added:
            self.storage.remove(_path(each.file_path))
        return False

    def finished_aside(self) -> list[str]:
        return sorted(table for table, fold in self._folds.items() if fold.finished())

    def aside_under_way(self) -> bool:
        return any(not fold.finished() for fold in self._folds.values())

    def settle(self, table: str, done: Round) -> None:
        """The table's fold committed once it ended; the error that ended it early raised
        after the files it finished are committed."""
        fold = self._folds.get(table)
        if fold is None or not fold.finished():
            return
        del self._folds[table]
        if fold.done:
            with self.sink._catalog_errors():
                self._commit_fold(fold, done)
        if fold.error is not None:
            raise fold.error

    def _fold_aside(
        self, table: str, found: Table, files: list[IcebergFile], deleted: dict[str, pa.Array]
    ) -> None:
        fold = Fold(table, files)
        fold.start(deleted, lambda each, gone: self._rewrite(found, [each], {each.file_path: gone}))
        self._folds[table] = fold

    def _commit_fold(self, fold: Fold, done: Round) -> None:
        """One snapshot that swaps the folded files and all their delete files for the files
        the fold wrote and the deletes batches added meanwhile, moved to them; built again on
        the table another writer left, while it can be (`_swap`). Else the written files are
        removed, and the next round plans the fold again."""
        from pyiceberg.exceptions import CommitFailedException

        written = [f for each in fold.done for f in each.written]
        for _ in commit_attempts():
            found = self.sink._table(fold.table)
            swap = self._swap(found, fold.done)
            if swap is None:
                break
            removed, moved = swap
            failpoint("mid-fold")  # the folded and moved files written, in no snapshot
            tx = transaction(found)
            properties = carried(held_in(found), log_times_in(found), skipped_in(found))
            added = [*written, *moved]
            commit_row_delta(tx, properties, added=added, removed=removed, entries=self.entries)
            try:
                tx.commit_transaction()
            except CommitFailedException:
                for each in moved:
                    self.storage.remove(_path(each.file_path))
                continue
            done.compacted_files += len(fold.done)
            done.written_files += len(written)
            done.rewritten_bytes += sum(f.file_size_in_bytes for f in written)
            done.merged_deletes += len(removed) - len(fold.done)
            return
        for each in written:
            self.storage.remove(_path(each.file_path))
        done.skipped = "another writer changed the files folded meanwhile; folded again later"

    def _swap(
        self, found: Table, folded: list[Folded]
    ) -> tuple[list[IcebergFile], list[IcebergFile]] | None:
        """What a fold's commit removes (each folded file and every delete file naming it)
        and the delete files it adds (the rows of folded files deleted since the fold read
        them, at their places in the files it wrote); None when it cannot commit on `found`: a
        folded file is gone, a delete file names several data files, or one the fold read is
        gone with positions it named."""
        current, deletes = _files(found, self.entries)
        naming: dict[str, list[IcebergFile]] = {}
        for delete_file in deletes.values():
            data = referenced_data_file(delete_file)
            if data is None:
                return None
            naming.setdefault(data, []).append(delete_file)
        if any(each.source.file_path not in current for each in folded):
            return None
        named = [f for each in folded for f in naming.get(each.source.file_path, [])]
        deleted = deleted_positions(named, self.sink._read_data)
        removed: list[IcebergFile] = []
        places = []
        for each in folded:
            path = each.source.file_path
            now = deleted.get(path)
            held = now.to_numpy(zero_copy_only=False) if now is not None else np.array([], int)
            moved = moved_positions(each.positions, held)
            if moved is None or (len(moved) and len(each.written) != 1):
                return None  # the rows kept, in one file in their order, are where they move
            if len(moved):
                into = pa.repeat(pa.scalar(each.written[0].file_path), len(moved))
                places.append(pa.table({"file_path": into, "pos": pa.array(moved)}))
            removed += [current[path], *naming.get(path, [])]
        moved_files = write_delete_files(found, pa.concat_tables(places)) if places else []
        return removed, moved_files

    def expire(self, table: str, policy: Policy, done: Round) -> None:
        from pyiceberg.exceptions import CommitFailedException

        with (
            self.sink._catalog_errors(),
            beside_others(f"Iceberg table {table!r}", CommitFailedException),
        ):
            found = _keep_window(self.sink._table(table), policy)
            policy = _applied(found, policy, done)
            if _expire_snapshots(found, _cutoff_ms(found, policy), done):
                found = self.sink._table(table)
            failpoint("mid-expiry")  # snapshots expired, the files only they read not removed
            # Files by the window's time alone, the snapshot cap aside: a file written since
            # may be another writer's, staged for a commit still to come.
            # Nor those a fold under way writes (its files are in no snapshot till it commits).
            cutoff_ms = _window_start_ms(policy)
            if table in self._folds:
                cutoff_ms = min(cutoff_ms, self._folds[table].started_ms - CLOCK_MARGIN_MS)
            self._remove_unread(found, cutoff_ms, done)

    def _remove_unread(self, found: Table, cutoff_ms: int, done: Round) -> None:
        """Files under the table's data and metadata folders no kept snapshot reads, written
        before the window."""
        read = self._read_by(found)
        location = _path(found.location())
        for relative, (size, modified) in self.storage.files(location).items():
            path = self.storage.join(location, relative)
            if relative.split("/", 1)[0] not in METADATA or path in read or modified >= cutoff_ms:
                continue
            if self.sink.rest and relative.endswith(".metadata.json"):
                continue  # a REST catalog's own
            self.storage.remove(path)
            done.removed_files += 1
            done.removed_bytes += size

    def _read_by(self, found: Table) -> set[str]:
        read = {_path(found.metadata_location)}
        read.update(_path(s.statistics_path) for s in found.metadata.statistics)
        for snapshot in found.metadata.snapshots:
            read.add(_path(snapshot.manifest_list))
            for manifest in self._manifests_of(found, snapshot):
                read.add(_path(manifest.manifest_path))
                read.update(_path(e.data_file.file_path) for e in self.entries(manifest, found.io))
        return read

    def _manifests_of(self, found: Table, snapshot: Snapshot) -> list[ManifestFile]:
        key = snapshot.manifest_list
        if key not in self._lists:
            self._lists[key] = snapshot.manifests(found.io)
        return self._lists[key]

    def health(self, table: str, policy: Policy) -> Health | None:
        with self.sink._catalog_errors():
            catalog = self.sink._catalog(create=False)
            found = self.sink._load(catalog, table) if catalog is not None else None
            if found is None:
                return None
            data, deletes = _files(found, self.entries)
            files = [f.file_size_in_bytes for f in data.values()]
            on_disk = self.storage.files(_path(found.location()))
            return Health(
                table=table,
                data_files=len(files),
                small_files=sum(size < policy.target_file_size for size in files),
                versions=len(found.metadata.snapshots),
                bytes_on_disk=sum(size for size, _ in on_disk.values()),
                live_bytes=_live_bytes(list(data.values()), list(deletes.values())),
                target_file_size=policy.target_file_size,
                extra={
                    "commits": found.last_sequence_number,
                    "delete_files": len(deletes),
                },
            )


def _data_files(found: Table) -> dict[str, IcebergFile]:
    """The current snapshot's data files, by path."""
    return _files(found)[0]


def _delete_files(found: Table) -> dict[str, IcebergFile]:
    """The current snapshot's delete files, by path."""
    return _files(found)[1]


def _live_bytes(data: list[IcebergFile], deletes: list[IcebergFile]) -> int:
    """The data files' bytes less the share of their rows position deletes remove (each a
    row; an upsert's replaced rows stay in their file until a round folds them). Equality
    deletes (another writer's) say no count of rows: their rows are counted live."""
    from pyiceberg.manifest import DataFileContent

    size = sum(f.file_size_in_bytes for f in data)
    rows = sum(f.record_count for f in data)
    deleted = sum(f.record_count for f in deletes if f.content == DataFileContent.POSITION_DELETES)
    return round(size * (1 - min(deleted, rows) / rows)) if rows else size


def _files(
    found: Table, entries: Entries = read_entries
) -> tuple[dict[str, IcebergFile], dict[str, IcebergFile]]:
    """The current snapshot's data files and delete files, by path, its manifests read by
    `entries`."""
    from pyiceberg.manifest import DataFileContent

    live = _live_files(found, entries)
    data = {p: f for p, f in live.items() if f.content == DataFileContent.DATA}
    return data, {p: f for p, f in live.items() if f.content != DataFileContent.DATA}


def _live_files(found: Table, entries: Entries) -> dict[str, IcebergFile]:
    snapshot = found.current_snapshot()
    if snapshot is None:
        return {}
    return {
        entry.data_file.file_path: entry.data_file
        for manifest in snapshot.manifests(found.io)
        for entry in entries(manifest, found.io)
    }


def _stale_deletes(
    deletes: dict[str, IcebergFile], rewritten: set[str], current: set[str]
) -> tuple[list[IcebergFile], set[str]]:
    """The delete files a round replaces, and the data files it keeps whose deletes it writes
    again, one delete file each. All of them when a delete file names several data files (an
    earlier lagless's); else those of data files the round rewrites (their deletes applied) or
    that are gone, and those of a data file that has more than one (merged into one: a batch
    adds one to each file it replaced rows of)."""
    kept = current - rewritten
    named = {path: referenced_data_file(f) for path, f in deletes.items()}
    if None in named.values():
        return list(deletes.values()), kept
    per_file = Counter(named.values())
    stale = {
        path: data
        for path, data in named.items()
        if data in rewritten or data not in current or per_file[data] > 1
    }
    return [deletes[path] for path in stale], kept & set(stale.values())


def _kept_rows(count: int, deleted: pa.Array) -> pa.Array:
    """A mask of a file's `count` rows, False where `deleted` (distinct positions) names one:
    set by position (a hash lookup of each row number cost a sixth of a fold's time). A
    position past the file's rows masks none: the count check refuses the file."""
    import numpy as np

    places = deleted.to_numpy(zero_copy_only=False)
    kept = np.ones(count, dtype=bool)
    kept[places[(places >= 0) & (places < count)]] = False
    return pa.array(kept)


def _kept_deletes(found: Table, deleted: dict[str, pa.Array], kept: set[str]) -> list[IcebergFile]:
    """Position delete files of what `deleted` deletes in the data files `kept`, one each."""
    named = [(path, places) for path, places in deleted.items() if path in kept]
    if not named:
        return []
    paths = pa.concat_arrays([pa.repeat(pa.scalar(path), len(places)) for path, places in named])
    positions = pa.concat_arrays([places for _, places in named])
    return write_delete_files(found, pa.table({"file_path": paths, "pos": positions}))


def _keep_window(found: Table, policy: Policy) -> Table:
    """The table as it keeps the history window (MAX_SNAPSHOT_AGE, in ms; one number it keeps,
    Policy.sets_window): set by the import that maintains it, and by `lagless maintain` only
    where it keeps none."""
    asked = str(int(policy.keep_history_s * 1000))
    kept = found.properties.get(MAX_SNAPSHOT_AGE)
    if kept == asked or not (policy.sets_window or kept is None):
        return found
    with found.transaction() as tx:
        tx.set_properties({MAX_SNAPSHOT_AGE: asked})
    return found.refresh()


def _applied(found: Table, policy: Policy, done: Round | None = None) -> Policy:
    """The policy with the history window the table keeps (the asked one where it keeps
    none, or one that is no number of ms); noted in `done` where it is not the one asked."""
    try:
        kept_s = int(found.properties[MAX_SNAPSHOT_AGE]) / 1000
    except (KeyError, ValueError):
        return policy
    if kept_s != policy.keep_history_s and done is not None:
        done.window_s = kept_s
    return replace(policy, keep_history_s=kept_s)


def _window_start_ms(policy: Policy) -> int:
    return int((time.time() - policy.keep_history_s) * 1000)


def _cutoff_ms(found: Table, policy: Policy) -> int:
    """Where the snapshots kept start: at the history window's start, or later, at the
    MOST_SNAPSHOTS-th newest snapshot, when the table holds more than that since."""
    cutoff_ms = _window_start_ms(policy)
    stamps = sorted((s.timestamp_ms for s in found.metadata.snapshots), reverse=True)
    if len(stamps) > MOST_SNAPSHOTS:
        cutoff_ms = max(cutoff_ms, stamps[MOST_SNAPSHOTS - 1])
    return cutoff_ms


def _expire_snapshots(found: Table, cutoff_ms: int, done: Round) -> bool:
    """The snapshots before the window expired (those `_kept` keeps aside); True when any
    was. Their files stay until expiry removes what no kept snapshot reads. Another writer
    that committed or expired first (the catalog refuses the commit; pyiceberg finds a
    snapshot gone) is a conflict: the table is read again and expiry decided again on it, up
    to COMMIT_ATTEMPTS times, then left to the next round."""
    from pyiceberg.exceptions import CommitFailedException

    for _ in commit_attempts():
        kept = _kept(found, cutoff_ms)
        expired = [s.snapshot_id for s in found.metadata.snapshots if s.snapshot_id not in kept]
        if not expired:
            return False
        try:
            found.maintenance.expire_snapshots().by_ids(expired).commit()
        except (CommitFailedException, ValueError):  # ValueError: a snapshot already gone
            found = found.refresh()
            continue
        done.expired_versions += len(expired)
        return True
    done.skipped = "other writers changed the snapshots meanwhile; expired next round"
    return False


def _kept(found: Table, cutoff_ms: int) -> set[int]:
    """The snapshots expiry keeps: inside the window, the one current at its start, and the
    current lineage back to the newest snapshot carrying the ledger."""
    from pyiceberg.table.snapshots import ancestors_of

    kept = {s.snapshot_id for s in found.metadata.snapshots if s.timestamp_ms >= cutoff_ms}
    at_start_seen = False
    ledger_seen = False
    for snapshot in ancestors_of(found.current_snapshot(), found.metadata):
        if not ledger_seen:
            kept.add(snapshot.snapshot_id)
            ledger_seen = snapshot.summary is not None and HELD in snapshot.summary
        if snapshot.timestamp_ms < cutoff_ms and not at_start_seen:
            kept.add(snapshot.snapshot_id)
            at_start_seen = True
        if ledger_seen and at_start_seen:
            break
    return kept


def _path(location: str) -> str:
    """A path as the storage names it: local without `file://`, S3 as `s3://bucket/key`."""
    parts = urlsplit(location)
    return parts.path if parts.scheme == "file" else location
