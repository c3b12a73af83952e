"""Commit an import's progress to a Kafka consumer group, so kafka-consumer-groups, Burrow
and `lagless lag` see how far the pipeline really is.

Commits follow the sink: only offsets of a batch already written are committed, and never
backwards, so a replayed batch cannot make a caught-up partition look stuck (seed 001).
The checkpoint, not the group, stays the source of truth for resuming.
"""

from __future__ import annotations

from lagless.kafka.offset_reader import OffsetReader, Offsets


class GroupCommitter:
    def __init__(self, broker: OffsetReader, group: str) -> None:
        self.group = group
        self._broker = broker

    def commit(self, end: Offsets) -> Offsets:
        """Commit `end` where it moves the group forward; returns what was committed."""
        current = self._broker.committed(self.group, end)
        forward = {tp: offset for tp, offset in end.items() if offset > (current.get(tp) or -1)}
        self._broker.commit(self.group, forward)
        return forward
