"""What the broker says about a group's offsets, behind a small seam so the logic is testable.

`OffsetSource` is the seam: `KafkaOffsetSource` asks a real broker, tests may hand the pure
functions plain `PartitionSample`s instead.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from lagless.exceptions import BadInput, TransientError
from lagless.kafka import TP
from lagless.kafka.config import KafkaConfig
from lagless.kafka.offset_reader import OffsetReader
from lagless.kafka.records import RecordInfo

# How long a first look may take before the broker counts as unreachable.
REACH_TIMEOUT_S = 5.0
_RECORD_READ_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class PartitionSample:
    """One look at one partition: the group's committed offset and the log's bounds."""

    topic: str
    partition: int
    at: float
    committed: int | None
    low: int
    end: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    @property
    def lag(self) -> int:
        """Records the group has still to read; from the log start when it never committed."""
        start = self.low if self.committed is None else self.committed
        return max(0, self.end - start)


class OffsetSource(Protocol):
    def sample(self) -> list[PartitionSample]:
        """The group's committed offset and the log bounds of every partition it reads."""
        ...

    def record_at(self, samples: Sequence[PartitionSample]) -> dict[tuple[str, int], RecordInfo]:
        """The record at each sample's committed offset (or log start), where it can be read."""
        ...

    def retention_ms(self) -> dict[str, int | None] | None:
        """retention.ms of each topic read (None: unlimited); None when the broker cannot tell."""
        ...

    def follow(self, partitions: Iterable[tuple[str, int]]) -> None:
        """Sample these too from now on (partitions a member holds, committed or not)."""
        ...

    def close(self) -> None: ...


class KafkaOffsetSource:
    """A group's committed offsets and its partitions' bounds, read without joining the group,
    through the broker-access module."""

    def __init__(
        self,
        config: KafkaConfig,
        group: str,
        topic: str | None = None,
        request_timeout_s: float = REACH_TIMEOUT_S,
    ) -> None:
        """Bad input when the broker cannot be reached (or the topic does not exist); a group
        that has committed nothing yet is not: `partitions` is empty until it commits or a
        partition is followed."""
        self.group = group
        self._topic = topic
        # No retries inside a request: a service keeps sampling while the broker is away and
        # reports the outage promptly instead of hanging on it.
        self._reader = OffsetReader(config, timeout_s=request_timeout_s, retry_s=0)
        try:
            try:
                self.partitions = self._committed_partitions()
            except TransientError as exc:
                raise BadInput(str(exc)) from None
        except BaseException:
            self._reader.close()
            raise

    def _committed_partitions(self) -> list[TP]:
        """The partitions of the topics the group has committed offsets on."""
        topic = self._topic
        every = self._reader.cluster.partitions([topic] if topic else (), None if topic else ".*")
        committed = self._reader.groups.committed(self.group, every)
        read_topics = {t for (t, _), offset in committed.items() if offset is not None}
        return [tp for tp in every if tp[0] in read_topics]

    def follow(self, partitions: Iterable[TP]) -> None:
        wanted = [tp for tp in partitions if self._topic in (None, tp[0])]
        self.partitions = sorted({*self.partitions, *wanted})

    def sample(self) -> list[PartitionSample]:
        if not self.partitions:
            # Nothing committed yet: look again each time (a first commit shows up at once).
            self.partitions = self._committed_partitions()
        committed = self._reader.groups.committed(self.group, self.partitions)
        low, end = self._reader.log.watermarks(self.partitions)
        at = time.time()
        return [
            PartitionSample(
                topic=t,
                partition=p,
                at=at,
                committed=committed.get((t, p)),
                low=low[(t, p)],
                end=end[(t, p)],
            )
            for t, p in self.partitions
        ]

    def record_at(self, samples: Sequence[PartitionSample]) -> dict[TP, RecordInfo]:
        wanted = {s.key: s.end - s.lag for s in samples if s.lag > 0}
        found = self._reader.records.at(wanted, timeout_s=_RECORD_READ_TIMEOUT_S)
        return {tp: records[0] for tp, records in found.items() if records}

    def retention_ms(self) -> dict[str, int | None] | None:
        return self._reader.cluster.retention_ms(t for t, _ in self.partitions)

    def close(self) -> None:
        self._reader.close()


def require_commits(source: KafkaOffsetSource, topic: str | None) -> None:
    """Bad input when the group has committed nothing (on the topic): nothing to show."""
    if not source.partitions:
        where = f"topic {topic!r}" if topic else "any topic"
        raise BadInput(f"group {source.group!r} has no committed offsets on {where}")


__all__ = [
    "KafkaOffsetSource",
    "OffsetSource",
    "PartitionSample",
    "RecordInfo",
    "require_commits",
]
