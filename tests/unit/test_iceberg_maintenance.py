"""Iceberg compaction beside other writers, on a real pyiceberg warehouse without Spark: files
merged while another import appended are swapped in on the snapshot it left; files another
compaction merged meanwhile are not merged twice (the written ones are removed); nor files an
upsert deleted rows of meanwhile. Merge-on-read upserts and compaction's folding of their
deletes."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lagless.importer.maintenance import run_round
from lagless.sinks import sink_from_url
from lagless.sinks.iceberg import IcebergSink
from lagless.sinks.iceberg import maintenance as iceberg_maintenance
from lagless.sinks.iceberg.fold import moved_positions
from lagless.sinks.iceberg.maintenance import (
    IcebergMaintenance,
    _data_files,
    _delete_files,
    _path,
)
from lagless.sinks.iceberg.row_delta import FileColumns, referenced_data_file
from lagless.sinks.ledger import Batch
from lagless.sinks.maintenance import Policy, Round
from tests.unit.test_ledger_stores import PARTITIONS, TARGET, TOPIC, commit, stored
from tests.unit.test_upsert_rank import TARGET as UPSERT
from tests.unit.test_upsert_rank import Record, rows_of, write


def filled(tmp_path: Path) -> tuple[IcebergSink, IcebergMaintenance]:
    sink = sink_from_url(f"iceberg:///{tmp_path}/lake")
    assert isinstance(sink, IcebergSink)
    sink.prepare(TARGET)
    for n in range(4):
        commit(sink, TARGET, Batch(n, {(TOPIC, 0): (n * 5, n * 5 + 5)}))
    return sink, IcebergMaintenance(sink)


def test_a_compaction_is_swapped_in_after_an_append_made_meanwhile(tmp_path: Path) -> None:
    sink, maintenance = filled(tmp_path)
    found = sink._table("t")
    merged = list(_data_files(found).values())
    written = maintenance._rewrite(found, merged, {})
    commit(sink, TARGET, Batch(4, {(TOPIC, 1): (0, 5)}))  # another import appends

    assert maintenance._commit("t", merged, [], written)

    assert stored(sink.url, sink.location) == sorted(
        [(TOPIC, 0, o) for o in range(20)] + [(TOPIC, 1, o) for o in range(5)]
    )
    assert len(_data_files(sink._table("t"))) == 2
    assert sink.ledger(TARGET, PARTITIONS) == {(TOPIC, 0): 20, (TOPIC, 1): 5}


def test_files_another_compaction_merged_meanwhile_are_not_merged_twice(tmp_path: Path) -> None:
    sink, maintenance = filled(tmp_path)
    found = sink._table("t")
    merged = list(_data_files(found).values())
    written = maintenance._rewrite(found, merged, {})
    other = Round("t")
    policy = Policy(1024 * 1024, 3600, thorough=True)
    maintenance.compact("t", policy, time.monotonic() + 60, other)
    assert other.compacted_files == 4

    assert not maintenance._commit("t", merged, [], written)

    assert stored(sink.url, sink.location) == [(TOPIC, 0, o) for o in range(20)]
    assert not any(os.path.exists(_path(each.file_path)) for each in written)
    assert sink.ledger(TARGET, PARTITIONS) == {(TOPIC, 0): 20}


def test_snapshots_past_the_most_kept_are_expired_whatever_the_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every commit rewrites the metadata file that lists each kept snapshot, so a table keeps
    at most MOST_SNAPSHOTS (here 4) even inside an hour's window: compaction trims them once
    they pass it by half, and expiry to it; the files only expired snapshots read stay until
    they are out of the window; the rows and the ledger stay."""
    monkeypatch.setattr(iceberg_maintenance, "MOST_SNAPSHOTS", 4)
    sink, maintenance = filled(tmp_path)  # 4 batches: within the most kept
    policy = Policy(target_file_size=1, keep_history_s=3600)  # nothing to merge
    maintenance.compact("t", policy, time.monotonic() + 10, Round("t"))
    assert len(sink._table("t").metadata.snapshots) == 4
    for n in range(4, 7):
        commit(sink, TARGET, Batch(n, {(TOPIC, 0): (n * 5, n * 5 + 5)}))
    done = Round("t")
    maintenance.compact("t", policy, time.monotonic() + 10, done)

    snapshots = sink._table("t").metadata.snapshots
    # The newest 4, and the one current when the window (their start) began.
    assert len(snapshots) == 5
    assert done.expired_versions == 7 - 5
    location = _path(sink._table("t").location())
    files_before = set(maintenance.storage.files(location))
    maintenance.expire("t", policy, Round("t"))
    # Files go by the window's time alone: one written within it may be another writer's,
    # staged for a commit still to come. (The table now keeps the window: a metadata file.)
    after = set(maintenance.storage.files(location))
    assert files_before <= after and all(
        name.endswith(".metadata.json") for name in after - files_before
    )
    assert sink._table("t").properties[iceberg_maintenance.MAX_SNAPSHOT_AGE] == "3600000"
    maintenance.expire("t", Policy(keep_history_s=0), Round("t"))
    assert files_before - set(maintenance.storage.files(location))  # out of the window: gone
    assert stored(sink.url, sink.location) == [(TOPIC, 0, o) for o in range(35)]
    assert sink.ledger(TARGET, PARTITIONS) == {(TOPIC, 0): 35}


def upserted(sink: IcebergSink, batch: int, keys: Iterable[int], tmp_path: Path) -> None:
    """Records of `keys`, one each, at offsets after the last batch's: newer than the rows
    they replace."""
    offset = batch * 100
    ranked = [
        (Record(0, offset + n, b"k%d" % key, offset + n, False), offset + n)
        for n, key in enumerate(keys)
    ]
    write(
        sink,
        "iceberg",
        rows_of(ranked),
        Batch(batch, {(TOPIC, 0): (offset, offset + 100)}),
        tmp_path,
    )


def values(sink: IcebergSink) -> dict[bytes, int]:
    rows = sink._table(UPSERT.table).scan(selected_fields=("key", "offset")).to_arrow()
    return dict(zip(rows.column("key").to_pylist(), rows.column("offset").to_pylist(), strict=True))


def upsert_table(tmp_path: Path) -> tuple[IcebergSink, IcebergMaintenance]:
    sink = sink_from_url(f"iceberg:///{tmp_path}/lake")
    assert isinstance(sink, IcebergSink)
    sink.prepare(UPSERT)
    upserted(sink, 0, range(10), tmp_path / "staging")
    return sink, IcebergMaintenance(sink)


def test_an_upsert_deletes_the_rows_it_replaces_by_position_and_compaction_folds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch rewrites no data file: the replaced rows go in a position delete file; a round
    folds the deletes into a file once they are FOLD_SHARE of its rows, and leaves none. The
    share is a tuning (bench/table_health.py): 0.3 here, so that 2 of 10 rows stay below it."""
    monkeypatch.setattr("lagless.sinks.iceberg.maintenance.FOLD_SHARE", 0.3)
    sink, maintenance = upsert_table(tmp_path)
    first = set(_data_files(sink._table(UPSERT.table)))
    upserted(sink, 1, range(2), tmp_path / "staging")  # 2 of 10 rows: below the share

    found = sink._table(UPSERT.table)
    assert first < set(_data_files(found))  # the first file kept, one added
    assert len(_delete_files(found)) == 1
    assert values(sink) == {b"k%d" % k: (100 + k if k < 2 else k) for k in range(10)}
    policy = Policy(1024 * 1024, 3600)
    maintenance.compact(UPSERT.table, policy, time.monotonic() + 60, Round(UPSERT.table))
    assert first <= set(_data_files(sink._table(UPSERT.table)))  # not folded yet

    health = maintenance.health(UPSERT.table, policy)
    assert health is not None
    data_bytes = sum(f.file_size_in_bytes for f in _data_files(found).values())
    # The 2 replaced rows of the first file's 10 are not live: 2 of the 12 rows in the files.
    assert health.live_bytes == round(data_bytes * 10 / 12)

    upserted(sink, 2, range(2, 4), tmp_path / "staging")  # 4 of 10: folded
    done = Round(UPSERT.table)
    maintenance.compact(UPSERT.table, policy, time.monotonic() + 60, done)

    found = sink._table(UPSERT.table)
    assert not first & set(_data_files(found))
    assert not _delete_files(found)
    assert values(sink) == {
        b"k%d" % k: (100 + k if k < 2 else 200 + k - 2 if k < 4 else k) for k in range(10)
    }
    assert sink.ledger(UPSERT, PARTITIONS) == {(TOPIC, 0): 300}


def referenced(sink: IcebergSink) -> list[str]:
    """The data file each delete file of the table names ('None': several)."""
    return sorted(
        str(referenced_data_file(f)) for f in _delete_files(sink._table(UPSERT.table)).values()
    )


def natively_read(sink: IcebergSink) -> dict[bytes, int]:
    """The table through polars' native reader: it reads delete files of one data file only."""
    rows = pl.scan_iceberg(sink._table(UPSERT.table), reader_override="native").collect()
    return dict(zip(rows["key"].to_list(), rows["offset"].to_list(), strict=True))


@pytest.mark.filterwarnings("ignore:Iceberg scan planning")  # polars plans through pyiceberg
def test_each_delete_file_names_one_data_file_and_a_round_merges_a_file_s_into_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch writes a delete file per data file it replaced rows of; a round merges the
    delete files of a data file that has several and leaves one that has one; a delete file of
    several data files (an earlier lagless merged a round's into one) is written again, one per
    data file. Readers see the same rows throughout, polars' native reader included. No file
    here loses FOLD_SHARE of its rows (0.3 here), so no round folds them instead."""
    monkeypatch.setattr("lagless.sinks.iceberg.maintenance.FOLD_SHARE", 0.3)
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record as Partition

    from lagless.sinks.iceberg.row_delta import commit_row_delta

    sink = sink_from_url(f"iceberg:///{tmp_path}/lake")
    assert isinstance(sink, IcebergSink)
    sink.prepare(UPSERT)
    upserted(sink, 0, range(40), tmp_path / "staging")
    (first,) = _data_files(sink._table(UPSERT.table))
    upserted(sink, 1, range(5), tmp_path / "staging")  # 5 of the first file's 40 rows
    (second,) = set(_data_files(sink._table(UPSERT.table))) - {first}
    upserted(sink, 2, range(4, 6), tmp_path / "staging")  # k4 of the second file, k5 of the first
    expected = {b"k%d" % k: (100 + k if k < 4 else 196 + k if k < 6 else k) for k in range(40)}

    assert referenced(sink) == sorted([first, first, second])
    assert values(sink) == natively_read(sink) == expected
    nothing_small = Policy(target_file_size=1, keep_history_s=3600)  # and no file folded
    done = Round(UPSERT.table)
    maintenance = IcebergMaintenance(sink)
    maintenance.compact(UPSERT.table, nothing_small, time.monotonic() + 60, done)
    assert done.merged_deletes == 2  # the first file's two; the second's one stays
    assert referenced(sink) == sorted([first, second])
    assert values(sink) == natively_read(sink) == expected
    assert maintenance_is_idle(maintenance, nothing_small)

    # An earlier lagless's delete file of both data files, in place of their own.
    found = sink._table(UPSERT.table)
    olds = list(_delete_files(found).values())
    places = pa.concat_tables(
        sink._read_data(f.file_path, ["file_path", "pos"]) for f in olds
    ).sort_by([("file_path", "ascending"), ("pos", "ascending")])
    path = f"{_path(found.location())}/data/both-deletes.parquet"
    pq.write_table(places, path)
    both = DataFile.from_args(
        content=DataFileContent.POSITION_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Partition(),
        record_count=places.num_rows,
        file_size_in_bytes=os.path.getsize(path),
    )
    tx = found.transaction()
    commit_row_delta(tx, {}, added=[both], removed=olds)
    tx.commit_transaction()
    assert referenced(sink) == ["None"]
    assert values(sink) == expected

    maintenance.compact(UPSERT.table, nothing_small, time.monotonic() + 60, Round(UPSERT.table))
    assert referenced(sink) == sorted([first, second])
    assert values(sink) == natively_read(sink) == expected


def maintenance_is_idle(maintenance: IcebergMaintenance, policy: Policy) -> bool:
    """A round with nothing to merge commits nothing."""
    snapshots = len(maintenance.sink._table(UPSERT.table).metadata.snapshots)
    maintenance.compact(UPSERT.table, policy, time.monotonic() + 60, Round(UPSERT.table))
    return len(maintenance.sink._table(UPSERT.table).metadata.snapshots) == snapshots


def test_a_compaction_is_not_swapped_in_after_an_upsert_deleted_rows_of_its_files(
    tmp_path: Path,
) -> None:
    """The rewritten file would bring back the rows the upsert deleted in the file it
    replaces: the compaction is dropped, its files removed."""
    sink, maintenance = upsert_table(tmp_path)
    found = sink._table(UPSERT.table)
    merged = list(_data_files(found).values())
    written = maintenance._rewrite(found, merged, {})
    upserted(sink, 1, range(3), tmp_path / "staging")  # deletes rows of the merged file

    assert not maintenance._commit(UPSERT.table, merged, [], written)

    assert values(sink) == {b"k%d" % k: (100 + k if k < 3 else k) for k in range(10)}
    assert not any(os.path.exists(_path(each.file_path)) for each in written)


def test_a_table_with_deletes_lagless_cannot_apply_is_neither_compacted_nor_upserted(
    tmp_path: Path,
) -> None:
    """Another writer's equality deletes: merging the files would bring the rows they delete
    back; the round says why it left the table, an upsert fails in one line."""
    import pyarrow.parquet as pq
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record as Partition

    from lagless.sinks.iceberg.row_delta import UnreadDeletes, commit_row_delta

    sink, maintenance = upsert_table(tmp_path)
    upserted(sink, 1, range(4, 8), tmp_path / "staging")  # two data files: one to merge
    found = sink._table(UPSERT.table)
    path = f"{_path(found.location())}/data/equality-deletes.parquet"
    pq.write_table(pa.table({"key": [b"k1"]}), path)
    key_id = found.schema().find_field("key").field_id
    equality = DataFile.from_args(
        content=DataFileContent.EQUALITY_DELETES,
        file_path=path,
        file_format=FileFormat.PARQUET,
        partition=Partition(),
        record_count=1,
        file_size_in_bytes=os.path.getsize(path),
        equality_ids=[key_id],
    )
    tx = found.transaction()
    commit_row_delta(tx, {}, added=[equality])
    tx.commit_transaction()
    files_before = set(_data_files(sink._table(UPSERT.table)))

    done = Round(UPSERT.table)
    maintenance.compact(
        UPSERT.table, Policy(1024 * 1024, 3600, thorough=True), time.monotonic() + 60, done
    )

    assert done.skipped is not None and "equality deletes" in done.skipped
    assert set(_data_files(sink._table(UPSERT.table))) == files_before
    with pytest.raises(UnreadDeletes, match="delete files lagless cannot apply"):
        upserted(sink, 2, range(2), tmp_path / "staging")


def test_file_columns_keeps_what_it_read_within_its_bound() -> None:
    """The key and rank columns of a data file are read once across batches; whole files are
    read each time; past the bound the least recently read go first."""
    reads: list[tuple[str, list[str] | None]] = []

    def read(path: str, columns: list[str] | None) -> pa.Table:
        reads.append((path, columns))
        return pa.table({"k": pa.array(range(1000), pa.int64())})

    one_file = read("x", None).nbytes
    reads.clear()
    kept = FileColumns(read, limit=2 * one_file)

    for _ in range(3):
        kept("a", ["k"])
        kept("a", None)
    assert reads == [("a", ["k"]), ("a", None), ("a", None), ("a", None)]

    reads.clear()
    kept("b", ["k"])  # a and b kept
    kept("a", ["k"])  # a read most recently
    kept("c", ["k"])  # b goes
    kept("a", ["k"])
    kept("b", ["k"])
    assert reads == [("b", ["k"]), ("c", ["k"]), ("b", ["k"])]


def test_rounds_read_each_manifest_once_and_a_manifest_written_since_when_it_is_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manifest is never changed once written: a round lists the current snapshot's files
    from the manifests earlier rounds and commit attempts read, and reads only those written
    since (a batch's, or one a commit wrote again with a file marked deleted). Each round sees
    the files as they are."""
    from pyiceberg.manifest import ManifestFile

    reads: list[str] = []
    fetch = ManifestFile.fetch_manifest_entry

    def counted(self: ManifestFile, io: object, discard_deleted: bool = True) -> object:
        reads.append(self.manifest_path)
        return fetch(self, io, discard_deleted)  # type: ignore[arg-type]

    monkeypatch.setattr("lagless.sinks.iceberg.maintenance.FOLD_SHARE", 0.3)
    sink, maintenance = upsert_table(tmp_path)
    policy = Policy(1024 * 1024, 3600)
    monkeypatch.setattr(ManifestFile, "fetch_manifest_entry", counted)

    def round_reads() -> list[str]:
        reads.clear()
        maintenance.compact(UPSERT.table, policy, time.monotonic() + 60, Round(UPSERT.table))
        return list(reads)

    first = round_reads()
    assert first and len(first) == len(set(first))
    assert round_reads() == []  # nothing new: every manifest known
    upserted(sink, 1, range(2), tmp_path / "staging")  # below the share: a data and a delete file
    written = round_reads()
    assert written and not set(written) & set(first)
    assert round_reads() == []
    upserted(sink, 2, range(2, 4), tmp_path / "staging")  # 4 of 10 rows: the round folds them
    round_reads()
    found = sink._table(UPSERT.table)
    assert not _delete_files(found)  # listed as they are, not as the first round read them
    assert maintenance.health(UPSERT.table, policy) is not None
    assert values(sink) == {
        b"k%d" % k: (100 + k if k < 2 else 200 + k - 2 if k < 4 else k) for k in range(10)
    }


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_rows_deleted_during_a_fold_move_to_their_places_in_the_file_it_wrote(
    data: st.DataObject,
) -> None:
    """A file of `count` rows, folded without the rows `folded` names; the rows deleted since,
    moved, name the same rows in the folded file (its kept rows in their order)."""
    count = data.draw(st.integers(1, 60))
    rows = np.arange(count) * 10  # each row's value: its place in the old file, times 10
    folded = data.draw(st.sets(st.integers(0, count - 1)))
    since = data.draw(st.sets(st.integers(0, count - 1).filter(lambda p: p not in folded)))
    kept = np.delete(rows, sorted(folded))
    now = np.array(sorted(folded | since) + sorted(since), dtype=np.int64)  # merged twice

    moved = moved_positions(np.array(sorted(folded), dtype=np.int64), now)

    assert moved is not None
    assert sorted(kept[moved].tolist()) == sorted(rows[sorted(since)].tolist())
    if folded:  # the fold's deletes gone from the file's: nothing is moved
        lost = np.array(sorted(folded)[1:] + sorted(since), dtype=np.int64)
        assert moved_positions(np.array(sorted(folded), dtype=np.int64), lost) is None


def rows_read(sink: IcebergSink) -> int:
    return sink._table(UPSERT.table).scan(selected_fields=("key",)).to_arrow().num_rows


def ended_aside(maintenance: IcebergMaintenance) -> list[str]:
    """The tables whose fold ended, once none is under way."""
    deadline = time.monotonic() + 30
    while maintenance.aside_under_way() and time.monotonic() < deadline:
        time.sleep(0.01)
    return maintenance.finished_aside()


def held_fold(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """A gate the fold's thread waits at before it writes: a round leaves it under way."""
    gate = threading.Event()
    rewrite = IcebergMaintenance._rewrite

    def gated(self: IcebergMaintenance, *args: object) -> object:
        if threading.current_thread().name.startswith("lagless-fold"):
            assert gate.wait(30)
        return rewrite(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(IcebergMaintenance, "_rewrite", gated)
    return gate


@pytest.mark.filterwarnings("ignore:Iceberg scan planning")  # polars plans through pyiceberg
def test_a_fold_beside_the_batches_moves_the_deletes_they_add_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An import's round starts the fold and returns; batches go on replacing rows of the file
    being folded; the round after it ended swaps the file and all its deletes for the folded
    file and the deletes made meanwhile at their new places: the same rows throughout, no
    delete file left naming the old file, the ledger kept."""
    monkeypatch.setattr("lagless.sinks.iceberg.maintenance.FOLD_SHARE", 0.3)
    gate = held_fold(monkeypatch)
    sink, maintenance = upsert_table(tmp_path)
    maintenance.aside = True
    (first,) = _data_files(sink._table(UPSERT.table))
    upserted(sink, 1, range(0, 8, 2), tmp_path / "staging")  # k0 k2 k4 k6: past the share
    policy = Policy(1024 * 1024, 3600)

    maintenance.compact(UPSERT.table, policy, time.monotonic() + 60, Round(UPSERT.table))
    assert first in _data_files(sink._table(UPSERT.table))  # under way
    assert maintenance.finished_aside() == []
    upserted(sink, 2, [3, 7, 9, 12], tmp_path / "staging")  # three rows of the file, a new key
    upserted(sink, 3, [5], tmp_path / "staging")
    expected = values(sink)
    gate.set()
    assert ended_aside(maintenance) == [UPSERT.table]
    # An expiry whose window is over: the fold's files, in no snapshot yet, are kept.
    maintenance.expire(UPSERT.table, Policy(keep_history_s=0), Round(UPSERT.table))

    done = Round(UPSERT.table)
    maintenance.settle(UPSERT.table, done)

    found = sink._table(UPSERT.table)
    assert first not in _data_files(found)
    assert first not in referenced(sink)
    assert done.compacted_files == 1 and done.merged_deletes == 3  # the first file's three
    assert values(sink) == natively_read(sink) == expected
    assert rows_read(sink) == len(expected)  # no replaced row back beside its newer one
    assert [expected[b"k%d" % k] for k in (3, 9, 5, 1)] == [200, 202, 300, 1]
    assert sink.ledger(UPSERT, PARTITIONS) == {(TOPIC, 0): 400}
    assert maintenance.finished_aside() == []


def test_a_fold_whose_file_another_compaction_rewrote_meanwhile_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The folded file would bring back the file another round rewrote: the fold's files are
    removed and the table left as that round made it."""
    monkeypatch.setattr("lagless.sinks.iceberg.maintenance.FOLD_SHARE", 0.3)
    gate = held_fold(monkeypatch)
    sink, maintenance = upsert_table(tmp_path)
    maintenance.aside = True
    upserted(sink, 1, range(4), tmp_path / "staging")
    policy = Policy(1024 * 1024, 3600)
    maintenance.compact(UPSERT.table, policy, time.monotonic() + 60, Round(UPSERT.table))
    IcebergMaintenance(sink).compact(  # `lagless maintain` meanwhile: folds in its round
        UPSERT.table, policy, time.monotonic() + 60, Round(UPSERT.table)
    )
    folded = set(_data_files(sink._table(UPSERT.table)))
    expected = values(sink)
    gate.set()
    ended_aside(maintenance)
    written = [f for each in maintenance._folds[UPSERT.table].done for f in each.written]

    done = Round(UPSERT.table)
    maintenance.settle(UPSERT.table, done)

    assert done.skipped and not done.compacted_files
    assert set(_data_files(sink._table(UPSERT.table))) == folded
    assert values(sink) == expected
    assert rows_read(sink) == len(expected)
    assert written and not any(os.path.exists(_path(f.file_path)) for f in written)


def test_a_fold_that_fails_in_its_thread_fails_the_round_that_commits_it_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store away as the fold reads: its error is raised by the round that would commit
    it (the import logs it, run_round), the table is as it was, and the next round folds."""
    monkeypatch.setattr("lagless.sinks.iceberg.maintenance.FOLD_SHARE", 0.3)
    sink, maintenance = upsert_table(tmp_path)
    maintenance.aside = True
    upserted(sink, 1, range(4), tmp_path / "staging")
    policy = Policy(1024 * 1024, 3600)
    rewrite = IcebergMaintenance._rewrite

    def away(self: IcebergMaintenance, *args: object) -> object:
        raise OSError("the store is away")

    monkeypatch.setattr(IcebergMaintenance, "_rewrite", away)
    maintenance.compact(UPSERT.table, policy, time.monotonic() + 60, Round(UPSERT.table))
    assert ended_aside(maintenance) == [UPSERT.table]
    files = set(_data_files(sink._table(UPSERT.table)))
    expected = values(sink)

    assert run_round(maintenance, UPSERT.table, policy, time.monotonic() + 60, False) is None

    assert set(_data_files(sink._table(UPSERT.table))) == files
    assert values(sink) == expected
    monkeypatch.setattr(IcebergMaintenance, "_rewrite", rewrite)
    maintenance.compact(UPSERT.table, policy, time.monotonic() + 60, Round(UPSERT.table))
    assert ended_aside(maintenance) == [UPSERT.table]
    done = Round(UPSERT.table)
    maintenance.settle(UPSERT.table, done)
    assert done.compacted_files == 1
    assert values(sink) == expected and rows_read(sink) == len(expected)


def test_a_compaction_that_fails_writing_removes_what_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 61: a full disk cuts a compaction's file short (here: half a file, then ENOSPC);
    the round fails, and no file of its writes is left beside the table's."""
    import pyiceberg.io.pyarrow as pyiceberg_arrow

    sink, maintenance = filled(tmp_path)
    location = _path(sink._table("t").location())
    before = set(maintenance.storage.files(location))

    def disk_full(metadata, rows, io, write_uuid):
        cut = os.path.join(location, "data", f"00000-0-{write_uuid}.parquet")
        with open(cut, "wb") as out:
            out.write(b"PAR1 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pyiceberg_arrow, "_dataframe_to_data_files", disk_full)
    policy = Policy(target_file_size=1024 * 1024, keep_history_s=3600, thorough=True)
    with pytest.raises(OSError, match="No space left"):
        maintenance.compact("t", policy, time.monotonic() + 10, Round("t"))

    assert set(maintenance.storage.files(location)) == before
    assert stored(sink.url, sink.location) == [(TOPIC, 0, o) for o in range(20)]
