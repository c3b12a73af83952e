"""Delta compaction beside other writers, on real delta-rs tables without Spark: its log entry
moves past versions that only appended, and is dropped when another writer removed a file it
merged (delta-rs 1.6's own rebase does not check that, and doubled rows)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from lagless.exceptions import ConcurrentMaintenance
from lagless.sinks import sink_from_url, storage
from lagless.sinks.delta import DeltaSink
from lagless.sinks.delta.log import data_files
from lagless.sinks.delta.maintenance import DeltaMaintenance
from lagless.sinks.maintenance import Policy, Round, plan

POLICY = Policy(target_file_size=1024 * 1024, keep_history_s=3600, thorough=True)


def fill(path: Path, batches: int) -> None:
    for n in range(batches):
        rows = pa.table({"k": pa.array(range(n * 10, n * 10 + 10), pa.int64())})
        write_deltalake(str(path), rows, mode="append")


def keys(path: Path) -> list[int]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table().column("k").to_pylist())


def stale_rewrite(lake: Path) -> tuple[DeltaMaintenance, DeltaTable, Round, list]:
    """A compaction that planned on the table as it is now, its commit not yet made."""
    sink = sink_from_url(f"delta:///{lake}")
    assert isinstance(sink, DeltaSink)
    maintenance = DeltaMaintenance(sink)
    delta = DeltaTable(str(lake / "t"))
    return maintenance, delta, Round("t"), plan(data_files(delta), 1024 * 1024, True)[0]


def test_a_compaction_passes_appends_committed_meanwhile(tmp_path: Path) -> None:
    fill(tmp_path / "t", 6)
    maintenance, delta, done, group = stale_rewrite(tmp_path)
    fill(tmp_path / "t", 2)  # another writer appends: versions 6 and 7

    assert maintenance._rewrite("t", delta, group, POLICY, done)

    assert keys(tmp_path / "t") == sorted([*range(60), *range(20)])
    assert done.compacted_files == 6
    assert len(DeltaTable(str(tmp_path / "t")).file_uris()) == 3


def test_a_compaction_whose_files_another_removed_meanwhile_is_dropped(tmp_path: Path) -> None:
    fill(tmp_path / "t", 6)
    maintenance, delta, done, group = stale_rewrite(tmp_path)
    other = Round("t")
    maintenance.compact("t", POLICY, time.monotonic() + 60, other)  # merges the same files
    assert other.compacted_files == 6
    files = set((tmp_path / "t").iterdir())

    assert not maintenance._rewrite("t", delta, group, POLICY, done)

    assert keys(tmp_path / "t") == list(range(60))  # not doubled
    assert set((tmp_path / "t").iterdir()) == files  # its merged file removed
    assert done.compacted_files == 0


def test_every_version_younger_than_the_window_loads_while_expiry_cleans_the_log(
    tmp_path: Path,
) -> None:
    """Issue 61: time travel at the window's edge. Versions are committed every ~0.1 s and
    expiry runs every ~0.4 s with a 2 s window (a checkpoint each time the log grew, the log
    cleaned), while a reader loads, again and again, each version committed less than the
    window ago: every load succeeds, and the versions long out of the window are gone."""
    path = tmp_path / "t"
    sink = sink_from_url(f"delta:///{tmp_path}")
    assert isinstance(sink, DeltaSink)
    maintenance = DeltaMaintenance(sink)
    window = Policy(keep_history_s=2.0)
    committed: dict[int, float] = {}  # version -> when its commit returned
    failures: list[tuple[int, float, str]] = []
    writing = threading.Event()
    writing.set()

    def read_again_and_again() -> None:
        while writing.is_set():
            for version, at in sorted(committed.items()):
                if time.time() - at < window.keep_history_s - 0.05:
                    try:
                        DeltaTable(str(path), version=version)
                    except Exception as exc:  # what a reader of the version would meet
                        failures.append((version, round(time.time() - at, 2), repr(exc)))

    fill(path, 1)
    committed[0] = time.time()
    reader = threading.Thread(target=read_again_and_again, daemon=True)
    reader.start()
    expired = 0
    deadline = time.monotonic() + 7
    while time.monotonic() < deadline:
        for _ in range(4):
            fill(path, 1)
            committed[DeltaTable(str(path)).version()] = time.time()
            time.sleep(0.1)
        done = Round("t")
        maintenance.expire("t", window, done)
        expired += done.expired_versions
    writing.clear()
    reader.join(timeout=30)
    assert not failures, failures[:5]
    assert expired > 0
    assert not (path / "_delta_log" / f"{0:020d}.json").exists()
    configured = DeltaTable(str(path)).metadata().configuration
    assert configured["delta.enableExpiredLogCleanup"] == "false"


def test_a_vacuum_another_writer_beat_is_a_conflict_tried_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """delta-rs's VACUUM commits, and another writer's commit may refuse it (seen beside an
    import: `a concurrent transaction deleted data this operation read`). The race itself
    runs in tests/integration/test_shared_tables.py; here the refusal is delta-rs's own error,
    raised on demand: a ConcurrentMaintenance, which `lagless maintain` tries again."""
    from deltalake.exceptions import CommitFailedError

    fill(tmp_path / "t", 2)
    sink = sink_from_url(f"delta:///{tmp_path}")
    assert isinstance(sink, DeltaSink)

    def refused(*_: object, **__: object) -> list[str]:
        raise CommitFailedError("a concurrent transaction deleted data this operation read")

    monkeypatch.setattr(DeltaTable, "vacuum", refused)
    with pytest.raises(ConcurrentMaintenance, match="another writer changed it"):
        DeltaMaintenance(sink).expire("t", Policy(keep_history_s=1), Round("t"))


def test_a_table_whose_properties_lagless_set_stays_writable(tmp_path: Path) -> None:
    """delta-rs lists variantType (and more) on a protocol 7 table (a timestamp without zone
    makes one) when it sets a table property, as expiry does: lagless must still write it
    (a restarted mirror of a table with a `timestamp` column refused its own table)."""
    import datetime

    from lagless.sinks.delta.log import unwritable

    rows = pa.table({"at": pa.array([datetime.datetime(2020, 1, 1)], pa.timestamp("us")), "n": [1]})
    write_deltalake(str(tmp_path / "t"), rows)
    table = DeltaTable(str(tmp_path / "t"))
    table.alter.set_table_properties({"delta.logRetentionDuration": "interval 60 seconds"})
    table = DeltaTable(str(tmp_path / "t"))
    assert "variantType" in (table.protocol().writer_features or [])
    assert unwritable(table, "upsert") is None


def test_a_compaction_holds_a_row_group_of_its_files_not_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by bench/soak.py: a compaction read its group of files whole, so the driver of a
    plain import grew with its table until the files reached the target size (a 94 MB group:
    0.64 GiB of Arrow, the driver at 975 MiB). It now holds one row group at a time."""
    monkeypatch.setattr(storage, "ROW_GROUP_BYTES", 1024 * 1024)
    value = pa.array([b"v" * 200] * 20_000)
    for n in range(8):  # 8 files, ~4 MiB of Arrow each, a few KB on disk
        rows = pa.table(
            {"k": pa.array(range(n * 20_000, (n + 1) * 20_000), pa.int64()), "v": value}
        )
        write_deltalake(str(tmp_path / "t"), rows, mode="append")
    sink = sink_from_url(f"delta:///{tmp_path}")
    assert isinstance(sink, DeltaSink)
    done = Round("t")
    counted = pa.proxy_memory_pool(pa.default_memory_pool())
    default = pa.default_memory_pool()
    pa.set_memory_pool(counted)
    try:
        DeltaMaintenance(sink).compact("t", POLICY, time.monotonic() + 60, done)
    finally:
        pa.set_memory_pool(default)

    assert done.compacted_files == 8 and done.written_files == 1
    assert keys(tmp_path / "t") == list(range(160_000))
    # A file's row group (read whole) is 4 MiB of Arrow, the group 33 MiB (the old peak: 34).
    assert counted.max_memory() < 12 * 1024 * 1024, counted.max_memory()


def test_a_compaction_fills_a_column_older_files_lack_with_nulls(tmp_path: Path) -> None:
    fill(tmp_path / "t", 2)
    later = pa.table({"k": pa.array([20, 21], pa.int64()), "added": pa.array(["a", None])})
    write_deltalake(str(tmp_path / "t"), later, mode="append", schema_mode="merge")
    sink = sink_from_url(f"delta:///{tmp_path}")
    assert isinstance(sink, DeltaSink)
    done = Round("t")

    DeltaMaintenance(sink).compact("t", POLICY, time.monotonic() + 60, done)

    assert done.compacted_files == 3
    found = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().sort_by("k")
    assert found.column("added").to_pylist() == [None] * 20 + ["a", None]
