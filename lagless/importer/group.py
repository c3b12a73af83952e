"""Commit an import's progress to a Kafka consumer group, so kafka-consumer-groups, Burrow
and `lagless lag` see how far the pipeline really is.

Commits follow the sink: only offsets of a batch already written are committed, and never
backwards, so a replayed batch cannot make a caught-up partition look stuck (seed 001).
The checkpoint, not the group, stays the source of truth for resuming.
"""

from __future__ import annotations

from lagless.kafka import Offsets
from lagless.kafka.group_offsets import GroupOffsets


class GroupCommitter:
    def __init__(self, offsets: GroupOffsets, group: str) -> None:
        self.group = group
        self._offsets = offsets

    def commit(self, end: Offsets) -> Offsets:
        """Commit `end` where it moves the group forward; returns what was committed."""
        current = self._offsets.committed(self.group, end)
        forward = {tp: offset for tp, offset in end.items() if offset > (current.get(tp) or -1)}
        self._offsets.commit(self.group, forward)
        return forward
