"""RunHistory (serve's samples kept as runs of the same offsets, and each sample's time) gives
exactly History's samples, whatever the samples and their times: offsets that hold, move
and come back, partitions that come and go, gaps longer than the history keeps."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lagless.lag.offsets import PartitionSample
from lagless.lag.report import History, RunHistory

KEEP_S = 6.0

rounds = st.lists(
    st.tuples(
        st.sampled_from([0.5, 1.0, 1.0, 2.0, 7.0]),  # the gap since the round before
        st.lists(  # (partition, committed, low, end, gone) sampled this round
            st.tuples(
                st.integers(0, 2),
                st.sampled_from([None, 3, 3, 3, 5]),
                st.sampled_from([0, 0, 2]),
                st.sampled_from([6, 6, 9]),
                st.booleans(),
            ),
            max_size=4,
            unique_by=lambda sampled: sampled[0],
        ),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(rounds)
def test_a_run_history_gives_exactly_what_a_history_keeps(
    sampled_rounds: list[tuple[float, list[tuple[int, int | None, int, int, bool]]]],
) -> None:
    full, runs = History(keep_s=KEEP_S), RunHistory(keep_s=KEEP_S)
    at = 100.0
    for gap, sampled in sampled_rounds:
        at += gap
        samples = [
            PartitionSample("t", p, at, c, low, end, gone) for p, c, low, end, gone in sampled
        ]
        full.add(samples)
        runs.add(samples)
        assert runs.samples == full.samples
        assert len(runs) == len(full.samples)
        for key, kept in full.samples.items():
            assert runs.of(key) == kept
            assert runs.latest_of(key) == kept[-1]
            assert (runs.first_at(key), runs.count(key)) == (kept[0].at, len(kept))
