"""Delta upserts as lagless commits them (sinks/delta/upsert.py), beside other writers, on real
delta-rs tables without Spark: another writer's commit between a batch's plan and its log
entry makes the batch plan again on the table that writer left (a compaction that merged the
file the batch rewrote is not undone, another import's rows are kept); only the files holding
a replaced key are written again; a table whose protocol asks more of a writer is refused;
what lagless writes, delta-rs, polars and Spark's readers read (the last in the integration
tests)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, TableFeatures
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lagless.exceptions import BadInput
from lagless.importer.maintenance import maintain_once
from lagless.sinks import sink_from_url
from lagless.sinks.base import TOMBSTONE, Target
from lagless.sinks.delta import DeltaSink
from lagless.sinks.ledger import Batch
from lagless.sinks.maintenance import Policy
from lagless.sinks.task_files import FILE_SCHEMA
from lagless.sinks.upsert_order import LOG_TIME

TARGET = Target("events", "upsert", "raw", run_id="import-a")
SCHEMA = FILE_SCHEMA.append(pa.field(LOG_TIME, pa.int64())).append(pa.field(TOMBSTONE, pa.bool_()))
POLICY = Policy(target_file_size=64 * 1024 * 1024, keep_history_s=3600, thorough=True)


def rows(partition: int, keys: list[int], first_offset: int, dead: bool = False) -> pa.Table:
    n = len(keys)
    offsets = list(range(first_offset, first_offset + n))
    return pa.table(
        {
            "topic": ["t"] * n,
            "partition": [partition] * n,
            "offset": offsets,
            "key": [b"k%05d" % k for k in keys],
            "value": [None if dead else b"v%d-%d" % (partition, o) for o in offsets],
            "timestamp": offsets,
            LOG_TIME: offsets,
            TOMBSTONE: [dead] * n,
        },
        schema=SCHEMA,
    )


def batch(partition: int, start: int, end: int, number: int = 0) -> Batch:
    return Batch(number, {("t", partition): (start, end)})


def opened(lake: Path) -> DeltaSink:
    sink = sink_from_url(f"delta:///{lake}")
    assert isinstance(sink, DeltaSink)
    sink.prepare(TARGET)
    return sink


def table(lake: Path) -> dict[bytes, bytes | None]:
    found = pl.read_delta(str(lake / "events"), columns=["key", "value"])
    assert found["key"].n_unique() == found.height, "a key held twice"
    return dict(found.iter_rows())


def before_the_next_entry(sink: DeltaSink, other: Callable[[], None]) -> list[int]:
    """Runs `other` (another writer) once, just before the next log entry lagless puts; the
    versions lagless tried to put entries at."""
    tried: list[int] = []
    put = sink.storage.create_new

    def racing(path: str, data: bytes) -> bool:
        if "_delta_log" in path:
            tried.append(int(Path(path).stem))
            if len(tried) == 1:
                other()
        return put(path, data)

    sink.storage.create_new = racing  # type: ignore[method-assign]
    return tried


def test_an_upsert_keeps_the_rows_another_import_committed_meanwhile(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    sink.upsert_rows(rows(0, list(range(100)), 0), TARGET, batch(0, 0, 100))
    other = opened(tmp_path)  # another import, of partition 1, into the same table
    tried = before_the_next_entry(
        sink,
        lambda: other.upsert_rows(rows(1, [5, 200], 0), TARGET, batch(1, 0, 2)),
    )

    written = sink.upsert_rows(rows(0, [5, 6, 300], 100), TARGET, batch(0, 100, 103, 1))

    assert written.rows == 3
    assert tried[1] == tried[0] + 1  # the first entry's version went to the other import
    held = table(tmp_path)
    assert len(held) == 102
    assert held[b"k00200"] == b"v1-1"
    assert held[b"k00005"] == b"v0-100"  # log time 100 outranks the other import's 0
    assert held[b"k00006"] == b"v0-101" and held[b"k00300"] == b"v0-102"
    delta = DeltaTable(str(tmp_path / "events"))
    assert delta.transaction_version("lagless:t:0") == 103
    assert delta.transaction_version("lagless:t:1") == 2


def test_an_upsert_does_not_undo_a_compaction_committed_meanwhile(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    for n in range(4):  # four files, each a batch of new keys
        keys = list(range(n * 10, n * 10 + 10))
        sink.upsert_rows(rows(0, keys, n * 10), TARGET, batch(0, n * 10, n * 10 + 10, n))
    assert len(DeltaTable(str(tmp_path / "events")).file_uris()) == 4
    before_the_next_entry(sink, lambda: maintain_once(f"delta:///{tmp_path}", "events", POLICY))

    sink.upsert_rows(rows(0, [3, 13], 40), TARGET, batch(0, 40, 42, 4))

    held = table(tmp_path)
    assert len(held) == 40  # the compacted rows once, not again beside the upsert's rewrite
    assert held[b"k00003"] == b"v0-40" and held[b"k00013"] == b"v0-41"
    assert held[b"k00004"] == b"v0-4"


def test_only_the_files_holding_a_replaced_key_are_written_again(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    sink.upsert_rows(rows(0, list(range(10)), 0), TARGET, batch(0, 0, 10))
    sink.upsert_rows(rows(0, list(range(10, 20)), 10), TARGET, batch(0, 10, 20, 1))
    first = set(DeltaTable(str(tmp_path / "events")).file_uris())

    sink.upsert_rows(rows(0, [12, 25], 20), TARGET, batch(0, 20, 22, 2))

    delta = DeltaTable(str(tmp_path / "events"))
    entry = (tmp_path / "events" / "_delta_log" / f"{delta.version():020d}.json").read_text()
    actions = [json.loads(line) for line in entry.splitlines()]
    removed = [a["remove"]["path"] for a in actions if "remove" in a]
    added = [a["add"] for a in actions if "add" in a]
    assert len(removed) == 1 and len(added) == 1
    assert json.loads(added[0]["stats"])["numRecords"] == 11  # 9 kept, the new 12, the new 25
    assert len(first & set(delta.file_uris())) == 1  # the other file is untouched
    assert len(table(tmp_path)) == 21


def test_a_tombstone_deletes_and_a_replayed_batch_changes_nothing(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    sink.upsert_rows(rows(0, [1, 2, 3], 0), TARGET, batch(0, 0, 3))
    sink.upsert_rows(rows(0, [2], 3, dead=True), TARGET, batch(0, 3, 4, 1))
    version = DeltaTable(str(tmp_path / "events")).version()

    again = sink.upsert_rows(rows(0, [2], 3, dead=True), TARGET, batch(0, 3, 4, 1))
    sink.upsert_rows(rows(0, [2], 2), TARGET, batch(0, 2, 3, 2))  # older than its tombstone

    assert again.replay
    assert table(tmp_path) == {b"k00001": b"v0-0", b"k00003": b"v0-2"}
    assert DeltaTable(str(tmp_path / "events")).version() == version
    graves = pl.read_delta(str(tmp_path / "events_tombstones"), columns=["key", "offset"])
    assert graves.rows() == [(b"k00002", 3)]


def test_an_upsert_table_lagless_cannot_write_is_refused(tmp_path: Path) -> None:
    sink = opened(tmp_path)
    sink.upsert_rows(rows(0, [1], 0), TARGET, batch(0, 0, 1))
    # Its owner turns deletion vectors on (delta-rs reads them; lagless's entries would not
    # keep them valid).
    DeltaTable(str(tmp_path / "events")).alter.add_feature(
        TableFeatures.DeletionVectors, allow_protocol_versions_increase=True
    )

    with pytest.raises(BadInput, match="deletionVectors"):
        sink.check(TARGET)


def test_an_upsert_table_with_a_change_data_feed_is_refused(tmp_path: Path) -> None:
    """Its readers expect each update's change files, which lagless does not write."""
    sink = opened(tmp_path)
    sink.upsert_rows(rows(0, [1], 0), TARGET, batch(0, 0, 1))
    delta = DeltaTable(str(tmp_path / "events"))
    delta.alter.set_table_properties({"delta.enableChangeDataFeed": "true"})

    with pytest.raises(BadInput, match="change data feed"):
        sink.check(TARGET)


def reads_of(sink: DeltaSink, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The table's data files the sink reads from now on (whole, or some columns)."""
    import lagless.sinks.delta.upsert as upsert

    read: list[str] = []
    whole, some = upsert.pl.read_parquet, sink.storage.read_parquet

    def read_whole(path: str, **options: object) -> pl.DataFrame:
        read.append(path)
        return whole(path, **options)  # type: ignore[arg-type]

    def read_some(path: str, columns: list[str] | None = None) -> pa.Table:
        if "_staging" not in path:
            read.append(path)
        return some(path, columns)

    monkeypatch.setattr(upsert.pl, "read_parquet", read_whole)
    monkeypatch.setattr(sink.storage, "read_parquet", read_some)
    return read


def test_the_next_batch_reads_none_of_the_files_an_upsert_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sink = opened(tmp_path)
    sink.upsert_rows(rows(0, list(range(100)), 0), TARGET, batch(0, 0, 100))
    read = reads_of(sink, monkeypatch)

    sink.upsert_rows(rows(0, [5, 50, 200], 100), TARGET, batch(0, 100, 103, 1))
    sink.upsert_rows(rows(0, [50], 103, dead=True), TARGET, batch(0, 103, 104, 2))

    assert read == []
    held = table(tmp_path)
    assert len(held) == 100 and b"k00050" not in held
    assert held[b"k00005"] == b"v0-100" and held[b"k00200"] == b"v0-102"
    other = opened(tmp_path)  # another driver holds none of them: it reads the table's
    read_by_other = reads_of(other, monkeypatch)
    other.upsert_rows(rows(0, [6], 104), TARGET, batch(0, 104, 105, 3))
    assert read_by_other and table(tmp_path)[b"k00006"] == b"v0-104"


def test_the_files_kept_are_only_those_the_table_still_lists(tmp_path: Path) -> None:
    """A compaction (here `maintain`; in a mirror, its own between batches) removes files the
    upserts wrote and kept: the next upsert lets them go. Found by bench/soak.py: a Delta
    mirror's driver grew by ~500 MiB an hour, holding files long compacted away."""
    sink = opened(tmp_path)
    for n in range(4):  # four files, each a batch of new keys, each kept
        keys = list(range(n * 10, n * 10 + 10))
        sink.upsert_rows(rows(0, keys, n * 10), TARGET, batch(0, n * 10, n * 10 + 10, n))
    kept_before = set(sink._written._frames)
    assert len(kept_before) == 4
    maintain_once(f"delta:///{tmp_path}", "events", POLICY)  # the four merged into one

    sink.upsert_rows(rows(0, [100], 40), TARGET, batch(0, 40, 41, 4))

    listed = {str(tmp_path / "events" / uri.rsplit("/", 1)[-1])
              for uri in DeltaTable(str(tmp_path / "events")).file_uris()}  # fmt: skip
    kept = set(sink._written._frames)
    assert kept and kept <= listed, (kept, listed)
    assert not kept & kept_before


def test_a_file_rewritten_every_batch_is_kept_in_one_chunk(tmp_path: Path) -> None:
    """A continuous mirror rewrites the file holding its keys every batch, from the frame it
    kept: each rewrite added the batch's rows as a chunk of their own, and the frame kept every
    chunk since. Found by bench/soak.py: a Delta mirror's driver grew by ~100 MiB an hour."""
    sink = opened(tmp_path)
    sink.upsert_rows(rows(0, list(range(100)), 0), TARGET, batch(0, 0, 100))
    for n in range(1, 31):  # each batch replaces a key of the file and adds one
        offset = 100 + 2 * n
        keys = [n, 1000 + n]
        sink.upsert_rows(rows(0, keys, offset), TARGET, batch(0, offset, offset + 2, n))

    chunks = [frame.n_chunks() for frame, _ in sink._written._frames.values()]
    assert chunks == [1], chunks  # before: [31], one a batch
    held = table(tmp_path)
    assert len(held) == 130 and held[b"k00030"] == b"v0-160" and held[b"k01030"] == b"v0-161"


def test_written_files_keep_the_newest_used_within_their_limit() -> None:
    from lagless.sinks.delta.upsert import WrittenFiles

    frame = pl.DataFrame({"n": list(range(1000))})  # 8,000 bytes
    kept = WrittenFiles(limit=20_000)
    kept.put("a", frame)
    kept.put("b", frame)
    assert kept.get("a") is frame  # now the newest used
    kept.put("c", frame)
    assert kept.get("b") is None and kept.get("a") is frame and kept.get("c") is frame
    kept.forget(["a"])
    kept.put("d", frame)
    assert kept.get("a") is None and kept.get("c") is frame and kept.get("d") is frame
    kept.put("e", pl.DataFrame({"n": list(range(3000))}))  # above the limit alone
    assert kept.get("e") is None and kept.get("d") is frame


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.just("upsert"),
                st.lists(st.integers(0, 15), min_size=1, max_size=8),
                st.booleans(),
            ),
            st.just(("compact", [], False)),
        ),
        min_size=2,
        max_size=8,
    ),
    st.sampled_from([0, 3000, 10**9]),
)
def test_an_upsert_gives_the_same_table_whatever_it_kept_of_the_files_it_wrote(
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[tuple[str, list[int], bool]],
    limit: int,
) -> None:
    """Against a driver that keeps none (limit 0): another compaction between batches, keys
    deleted and written again, files dropped from memory as others are kept."""
    from lagless.sinks.delta.upsert import WrittenFiles

    kept, none = tmp_path_factory.mktemp("kept"), tmp_path_factory.mktemp("none")
    sinks = {kept: opened(kept), none: opened(none)}
    sinks[kept]._written = WrittenFiles(limit)
    sinks[none]._written = WrittenFiles(0)
    offset = 0
    for number, (step, keys, dead) in enumerate(steps):
        for lake, sink in sinks.items():
            if step == "compact" and offset:
                maintain_once(f"delta:///{lake}", "events", POLICY)
            elif step == "upsert":
                unique = sorted(set(keys))
                given_rows = rows(0, unique, offset, dead)
                sink.upsert_rows(given_rows, TARGET, batch(0, offset, offset + len(unique), number))
        offset += len(set(keys))
    if offset:
        assert table(kept) == table(none)
