"""The ledger's one rule (sinks/ledger.py), as pure functions."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lagless.exceptions import BadInput
from lagless.sinks.ledger import (
    Batch,
    ConcurrentImport,
    HeldRecord,
    Lacking,
    Verdict,
    batch_ranges,
    lacking,
    lacks_only,
    reconcile,
    recreated,
    verdict,
)

A, B = ("a", 0), ("a", 1)


def test_a_batch_above_what_is_held_is_new_and_one_within_it_a_replay() -> None:
    assert verdict(Batch(0, {A: (10, 20)}), {A: 10}) is Verdict.NEW
    assert verdict(Batch(0, {A: (30, 40)}), {A: 10}) is Verdict.NEW  # a gap (retention)
    assert verdict(Batch(0, {A: (0, 10)}), {}) is Verdict.NEW
    assert verdict(Batch(0, {A: (0, 10)}), {A: 10}) is Verdict.REPLAY
    assert verdict(Batch(0, {A: (5, 7), B: (4, 4)}), {A: 10}) is Verdict.REPLAY
    assert verdict(Batch(0, {A: (5, 5)}), {}) is Verdict.REPLAY  # nothing to commit


def test_a_batch_straddling_or_mixing_held_offsets_is_refused() -> None:
    with pytest.raises(ConcurrentImport, match=r"a\[0\].*up to 10"):
        verdict(Batch(0, {A: (5, 15)}), {A: 10})
    with pytest.raises(ConcurrentImport):
        verdict(Batch(0, {A: (0, 10), B: (0, 10)}), {A: 10})


def test_a_batch_starts_where_the_last_ended_but_never_below_what_was_held() -> None:
    assert batch_ranges({A: 5, B: 0}, {A: 20, B: 3}, {A: 12}) == {A: (12, 20), B: (0, 3)}
    assert batch_ranges({A: 5}, {A: 8}, {A: 12}) == {A: (8, 8)}  # all held: empty


def test_a_ledger_beyond_the_logs_end_is_refused_before_anything_is_written() -> None:
    assert reconcile({A: 10}, {A: 0}, {A: 10}, "table t") == {A: 10}
    assert reconcile({("gone", 0): 5}, {A: 0}, {A: 10}, "table t") == {}
    with pytest.raises(BadInput, match=r"holds a\[0\] up to offset 11, but the log ends at 10"):
        reconcile({A: 11}, {A: 0}, {A: 10}, "table t")


ranges = st.dictionaries(
    st.sampled_from([A, B]),
    st.tuples(st.integers(0, 50), st.integers(0, 50)).map(lambda r: (min(r), max(r))),
)


@given(ranges)
def test_a_batch_is_named_by_its_offsets_alone(given_ranges: dict) -> None:  # type: ignore[type-arg]
    batch = Batch(3, given_ranges)
    assert batch.digest() == Batch(9, dict(reversed(list(given_ranges.items())))).digest()
    assert Batch.ranges_from_json(batch.to_json()) == batch.covered


@given(ranges, st.dictionaries(st.sampled_from([A, B]), st.integers(0, 60)))
def test_a_replay_never_adds_and_a_new_batch_never_overlaps(
    given_ranges: dict,  # type: ignore[type-arg]
    held: dict,  # type: ignore[type-arg]
) -> None:
    batch = Batch(0, given_ranges)
    try:
        decided = verdict(batch, held)
    except ConcurrentImport:
        # Refused only when some range reaches into what is held and past it, or some are held
        # and some are not.
        assert any(s < held.get(tp, 0) for tp, (s, _) in batch.covered.items())
        return
    for tp, (start, end) in batch.covered.items():
        if decided is Verdict.NEW:
            assert tp not in held or start >= held[tp]
        else:
            assert end <= held[tp]


def test_a_table_that_lost_what_the_checkpoint_committed_is_named() -> None:
    committed = {A: (0, 40), B: (7, 7)}  # B: the batches read nothing of it
    assert lacking({A: 40}, committed) is None
    assert lacking({A: 55, B: 3}, committed) is None  # more than the batches: another import's
    assert lacking({}, committed) == Lacking(A, 40, 0)  # deleted
    assert lacking({A: 25}, committed) == Lacking(A, 40, 25)  # rolled back
    assert lacking({}, {}) is None  # a new checkpoint


def test_tables_that_lack_only_a_batch_are_told_from_tables_that_lack_more() -> None:
    start, end = {A: 10, B: 5}, {A: 20, B: 5}  # B: the batch read nothing of it
    assert lacks_only({A: 10, B: 5}, start, end)  # the batch's commit never came
    assert lacks_only({A: 10}, start, end)
    assert not lacks_only({A: 20, B: 5}, start, end)  # it came
    assert not lacks_only({A: 9, B: 5}, start, end)  # less than what came before the batch
    assert not lacks_only({}, start, end)  # deleted
    assert lacks_only({}, {}, {A: 3})  # the first batch of a partition new to the query
    assert not lacks_only({A: 3}, {}, {})  # a batch of nothing


@given(
    st.dictionaries(st.sampled_from([A, B]), st.tuples(st.integers(0, 50), st.integers(0, 50))),
    st.dictionaries(st.sampled_from([A, B]), st.integers(0, 60)),
)
def test_a_table_lacks_exactly_the_partitions_it_holds_below_what_was_read(
    committed: dict,
    held: dict,  # type: ignore[type-arg]
) -> None:
    read = {tp: (start, end) for tp, (start, end) in committed.items()}
    short = sorted(tp for tp, (start, end) in read.items() if end > start and held.get(tp, 0) < end)
    found = lacking(held, read)
    if not short:
        assert found is None
    else:
        assert found == Lacking(short[0], read[short[0]][1], held.get(short[0], 0))


def test_a_recreated_topic_is_told_by_the_record_at_the_newest_held_offset() -> None:
    """Another timestamp or key at the same offset: another topic's record. A record the log
    no longer has there (retention, compaction: the log's first record is further on) or a
    partition the log did not answer for tells nothing."""
    held = {A: HeldRecord(99, 1000, b"k"), B: HeldRecord(5, 7, None)}
    assert recreated(held, {A: HeldRecord(99, 1000, b"k"), B: HeldRecord(5, 7, None)}) == []
    assert recreated(held, {A: HeldRecord(120, 5, b"x")}) == []
    later = recreated(held, {A: HeldRecord(99, 2000, b"k"), B: HeldRecord(5, 7, b"k")})
    assert [(each.tp, each.found) for each in later] == [
        (A, HeldRecord(99, 2000, b"k")),
        (B, HeldRecord(5, 7, b"k")),
    ]
    assert str(later[0]) == (
        "a[0]: the record at offset 99 has another timestamp than the one the table holds "
        "(1000, now 2000)"
    )
    assert "another key" in str(later[1]) and "(no key, now b'k')" in str(later[1])
