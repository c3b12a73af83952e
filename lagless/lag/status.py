"""Partition and group status over a window of samples, after Burrow's evaluator.

OffsetFetch does not say when a group committed, only what: a commit that does not move
the offset is invisible from outside. So STOP here means the committed offset has not moved
for longer than the window (it needs a history longer than the window), and STALL that it
did not move within the window while there was lag. Where the broker tells who holds which
partition (DescribeGroups), a lagging partition no member holds is STOP at once: nobody is
there to commit, whatever the window (so `serve` and `doctor`, which watch for different
spans, agree on a group with no consumer).

Three states need no window, only the latest sample, and are never OK however the lag
looks: LOST, the committed offset behind the log start (retention deleted records the group
had not read: it will skip them); AHEAD, the committed offset past the log's end (the topic
was recreated or truncated: the lag reads 0, yet the consumer resets at its next start); GONE,
an offset committed on a topic (or partition) that no longer exists.

A group's status is its worst partition's, but two states are a group's only: UNKNOWN while
its latest sample failed (the broker is away: what was seen before no longer holds) and
NO_COMMITS when it has no partition to judge (no commit yet, and no member holds one).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Sequence
from enum import IntEnum
from typing import cast

from lagless.lag.offsets import PartitionSample

# The span every status is judged over unless told otherwise: `lag --window`, `doctor
# --seconds` and `serve --window` default to it, so the three print the same word for the same
# group. Long enough to see a consumer that auto-commits (every 5 s by default) commit.
DEFAULT_WINDOW_S = 10.0


class Status(IntEnum):
    """Ordered by severity: a group's status is its worst partition's."""

    OK = 0
    WARN = 1
    STALL = 2
    STOP = 3
    GONE = 4
    REWIND = 5
    AHEAD = 6
    LOST = 7
    NO_COMMITS = 8
    UNKNOWN = 9

    @property
    def broken(self) -> bool:
        """The committed offset itself is wrong (not a consumer that is slow or stopped)."""
        return self in (Status.GONE, Status.AHEAD, Status.LOST)


def offset_status(sample: PartitionSample) -> Status | None:
    """LOST, AHEAD or GONE from the latest sample alone; None when the committed offset lies
    within the log (or was never committed)."""
    if sample.gone:
        return Status.GONE
    if sample.committed is None:
        return None
    if sample.committed > sample.end:
        return Status.AHEAD
    if sample.committed < sample.low:
        return Status.LOST
    return None


def partition_status(
    history: Sequence[PartitionSample], window_s: float, owned: bool | None = None
) -> Status:
    """The status of one partition from its samples, oldest first.

    LOST, AHEAD and GONE look at the latest sample; REWIND at the whole history; the other
    checks at the window, the samples taken
    within window_s of the latest one (older ones tell how long the offset has stood still).
    owned: whether a member of the group holds the partition (None: the broker cannot tell,
    or a rebalance is handing partitions out).
    """
    if not history:
        raise ValueError("a partition status needs at least one sample")
    latest = history[-1]
    broken = offset_status(latest)
    if broken is not None:
        return broken
    if _moved_back([s.committed for s in history]):
        return Status.REWIND
    if latest.lag == 0:
        return Status.OK
    if owned is False:
        return Status.STOP
    if len(history) == 1:  # nothing to compare yet (serve's first round, for every partition)
        return Status.OK
    window = [s for s in history if latest.at - s.at <= window_s]
    committed = [s.committed for s in window]
    if latest.at - _unchanged_since(history) > window_s:
        return Status.STOP
    if len(window) >= 2 and len(set(committed)) == 1 and all(s.lag > 0 for s in window):
        return Status.STALL
    lags = [s.lag for s in window]
    if len(window) >= 2 and all(after > before for before, after in itertools.pairwise(lags)):
        return Status.WARN
    return Status.OK


def _moved_back(committed: Sequence[int | None]) -> bool:
    """A committed offset lower than the one before it (a missing one compares with none)."""
    if None not in committed:  # the usual case, in C: serve judges every partition each round
        known = cast(Sequence[int], committed)
        return any(map(operator.lt, known[1:], known[:-1]))
    return any(
        before is not None and after is not None and after < before
        for before, after in itertools.pairwise(committed)
    )


def _unchanged_since(history: Sequence[PartitionSample]) -> float:
    """When the committed offset took the value it has in the latest sample."""
    since = history[-1].at
    for sample in reversed(history):
        if sample.committed != history[-1].committed:
            break
        since = sample.at
    return since


def group_status(statuses: Iterable[Status], sampled: bool = True) -> Status:
    """The worst partition's status; UNKNOWN when the latest sample failed (or none was taken
    yet), NO_COMMITS when there is no partition to judge."""
    if not sampled:
        return Status.UNKNOWN
    return max(statuses, default=Status.NO_COMMITS)
