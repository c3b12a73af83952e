"""What the broker says about groups' offsets, behind small seams so the logic is testable.

`FleetSource` is the broker seen by the lag tools: every group's committed offsets, the
topics, the partitions' log bounds, asked for all groups at once (`KafkaFleetSource`, one
admin client whatever the number of groups). `sample_groups` turns one such look into each
group's `PartitionSample`s. `OffsetSource` is one group seen the same way (`lag`, `doctor`):
`KafkaOffsetSource` samples through the same functions, so the three tools see the same
partitions. Tests may hand the pure functions plain samples instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from lagless.exceptions import BadInput, TransientError
from lagless.kafka import TP
from lagless.kafka.cluster_info import GroupsFound
from lagless.kafka.config import KafkaConfig
from lagless.kafka.embedded_log_offsets import is_embedded
from lagless.kafka.group_offsets import COMMITTED_BY_LAGLESS
from lagless.kafka.groups import GroupDescription
from lagless.kafka.offset_reader import OffsetReader
from lagless.kafka.records import RecordInfo
from lagless.retry import retried

# How long a first look may take before the broker counts as unreachable.
REACH_TIMEOUT_S = 5.0
# How old the list of topics may be: new partitions and deleted topics show within this.
TOPICS_MAX_AGE_S = 30.0
UNKNOWN_TOPIC_MAX_AGE_S = 5.0
_RECORD_READ_TIMEOUT_S = 2.0


@dataclass(slots=True)
class PartitionSample:
    """One look at one partition: the group's committed offset and the log's bounds. Never
    changed once made (not frozen only for speed: serve makes one per partition of every group
    each round, and a frozen dataclass takes four times as long to make)."""

    topic: str
    partition: int
    at: float
    committed: int | None
    low: int
    end: int
    gone: bool = False
    """The topic (or this partition of it) no longer exists: low and end are 0, meaningless."""
    lag: int = field(init=False)
    """Records the group has still to read; from the log start when it never committed. 0
    where the committed offset is past the end (nothing there to read: the consumer will
    reset) or the partition is gone. Computed once: serve reads it for every partition of
    every group each round."""

    def __post_init__(self) -> None:
        lag = self.end - (self.low if self.committed is None else self.committed)
        self.lag = 0 if self.gone or lag < 0 else lag

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)


@dataclass(frozen=True)
class FleetLook:
    """One look at the cluster for many groups, taken at `at`."""

    at: float
    committed: Mapping[str, Mapping[TP, int] | str]
    """Each group's committed offsets, or why the broker did not tell them."""
    topics: Mapping[str, int]
    """Every topic and its number of partitions."""
    low: Mapping[TP, int] = field(default_factory=dict)
    end: Mapping[TP, int] = field(default_factory=dict)
    failed: Mapping[TP, str] = field(default_factory=dict)
    """Partitions whose log bounds the broker did not tell, with the reason."""
    described: Mapping[str, GroupDescription | None] = field(default_factory=dict)
    """Each group's members, where asked and told."""
    partitions: Mapping[str, Sequence[TP]] = field(default_factory=dict)
    """The partitions each group is judged on (group_partitions), of the groups told."""
    metadata: Mapping[str, str] = field(default_factory=dict)
    """The metadata a group's offsets were committed with, where there is some."""

    def committed_by_lagless(self, group: str) -> bool:
        return self.metadata.get(group) == COMMITTED_BY_LAGLESS


class FleetSource(Protocol):
    """The broker as the lag tools ask it, for many groups at once."""

    def groups(
        self,
        groups: Sequence[str],
        describe: bool,
        known: Mapping[str, Sequence[TP]] | None = None,
    ) -> GroupsFound:
        """Each group's committed offsets (topics that no longer exist included) or the reason
        the broker did not tell them, the metadata they were committed with, and with
        `describe`, each group's members and assignments (None where not told). `known`: the
        partitions a group is known to read, the only ones asked of it where the broker lets
        (cheaper for the broker than every partition it committed on); the others' every
        partition."""
        ...

    def describe(self, groups: Sequence[str]) -> Mapping[str, GroupDescription | None]:
        """Each group's state, members and their partitions (DescribeGroups), None where not
        told; waits for the answer (serve asks it in a thread of its own, between rounds)."""
        ...

    def topics(self, max_age_s: float = 0.0) -> dict[str, int]:
        """Every topic and its partition count, as known at most max_age_s ago. Raises
        LaglessError when the broker is away."""
        ...

    def log_bounds(
        self, partitions: Sequence[TP]
    ) -> tuple[dict[TP, int], dict[TP, int], dict[TP, str]]:
        """(log start, log end, failed) of each partition, in one round for all."""
        ...

    def list_groups(self) -> list[str] | None:
        """Every consumer group the broker knows; None when it does not answer ListGroups."""
        ...

    def records_at(self, starts: Mapping[TP, int]) -> dict[TP, RecordInfo]:
        """The record at each offset, where it can be read in a short while."""
        ...

    def retention_ms(self, topics: Iterable[str]) -> dict[str, int | None] | None:
        """retention.ms of each topic (None: unlimited); None when the broker cannot tell."""
        ...

    def close(self) -> None: ...


class KafkaFleetSource:
    """The fleet's offsets through the broker-access module: one admin client for every group
    (and one DescribeGroups child process), however many groups are watched."""

    def __init__(self, config: KafkaConfig, request_timeout_s: float = REACH_TIMEOUT_S) -> None:
        # No retries inside a request: the lag tools sample again, and a service reports an
        # outage promptly instead of hanging on it.
        self._reader = OffsetReader(config, timeout_s=request_timeout_s, retry_s=0)
        self._topics: dict[str, int] = {}
        self._topics_at: float | None = None

    def groups(
        self,
        groups: Sequence[str],
        describe: bool,
        known: Mapping[str, Sequence[TP]] | None = None,
    ) -> GroupsFound:
        # The embedded broker answers an OffsetFetch of "every partition" with none: asked
        # there of every partition of every topic, never of a real broker.
        named = None
        if is_embedded(self._reader.connection.cluster_id()):
            named = [
                (t, p)
                for t, count in sorted(self.topics(TOPICS_MAX_AGE_S).items())
                for p in range(count)
            ]
        return self._reader.cluster.groups(groups, describe, named, known)

    def describe(self, groups: Sequence[str]) -> dict[str, GroupDescription | None]:
        return self._reader.cluster.describe_groups(groups, self._reader.connection.timeout_s)

    def topics(self, max_age_s: float = 0.0) -> dict[str, int]:
        # Metadata of every topic costs (0.3 s for 2,000 topics here): asked again only when
        # older than the caller allows.
        asked = time.monotonic()
        if self._topics_at is None or asked - self._topics_at > max_age_s:
            self._topics, self._topics_at = self._reader.cluster.topic_partitions(), asked
        return self._topics

    def log_bounds(
        self, partitions: Sequence[TP]
    ) -> tuple[dict[TP, int], dict[TP, int], dict[TP, str]]:
        found = self._reader.cluster.log_bounds(partitions)
        return self._reader.log.log_bounds(partitions) if found is None else found

    def list_groups(self) -> list[str] | None:
        return self._reader.cluster.list_groups()

    def records_at(self, starts: Mapping[TP, int]) -> dict[TP, RecordInfo]:
        found = self._reader.records.at(starts, timeout_s=_RECORD_READ_TIMEOUT_S)
        return {tp: records[0] for tp, records in found.items() if records}

    def retention_ms(self, topics: Iterable[str]) -> dict[str, int | None] | None:
        return self._reader.cluster.retention_ms(topics)

    def close(self) -> None:
        self._reader.close()


def look(
    source: FleetSource,
    groups: Sequence[str],
    followed: Mapping[str, Iterable[TP]] | None = None,
    describe: bool = True,
    now: Callable[[], float] = time.time,
    known: Mapping[str, Sequence[TP]] | None = None,
) -> FleetLook:
    """One look for all `groups`: the topics, their committed offsets (and members), then the
    log bounds of every partition any of them reads (each partition asked once, however many
    groups read it): the ends after the commits, so a commit is never seen past a stale end.
    Raises LaglessError when the broker cannot be reached.

    The topics are those known within TOPICS_MAX_AGE_S, looked up again within
    UNKNOWN_TOPIC_MAX_AGE_S when a group committed on a topic not known (new, or deleted),
    and at once when the log bounds of a known one failed (deleted since). `known`: the
    partitions a group is known to read, the only ones its offsets are asked of (see
    FleetSource.groups)."""
    topics = source.topics(TOPICS_MAX_AGE_S)
    asked = source.groups(groups, describe, known)
    committed = asked.committed
    read = {t for offsets in committed.values() if isinstance(offsets, Mapping) for t, _ in offsets}
    if not read <= topics.keys():
        topics = source.topics(UNKNOWN_TOPIC_MAX_AGE_S)
    partitions = {
        group: group_partitions(offsets, topics, (followed or {}).get(group, ()))
        for group, offsets in committed.items()
        if not isinstance(offsets, str)
    }
    wanted = {tp for keys in partitions.values() for tp in keys}
    low, end, failed = source.log_bounds(sorted(tp for tp in wanted if _exists(tp, topics)))
    if failed:
        topics = source.topics()
        retry = sorted(tp for tp in failed if _exists(tp, topics))
        low2, end2, failed = source.log_bounds(retry) if retry else ({}, {}, {})
        low, end = {**low, **low2}, {**end, **end2}
    return FleetLook(
        now(), committed, topics, low, end, failed, asked.described, partitions, asked.metadata
    )


def _exists(tp: TP, topics: Mapping[str, int]) -> bool:
    return tp[1] < topics.get(tp[0], 0)


def group_partitions(
    committed: Mapping[TP, int],
    topics: Mapping[str, int],
    followed: Iterable[TP] = (),
    topic: str | None = None,
) -> list[TP]:
    """The partitions a group is judged on: every partition of each topic it committed on or
    whose partitions its members hold, and the partitions it committed on that no longer
    exist. `topic`: that topic's only."""
    held = [tp for tp in followed if topic in (None, tp[0])]
    read = {t for t, _ in committed if topic in (None, t)} | {t for t, _ in held}
    keys = {(t, p) for t in read for p in range(topics.get(t, 0))}
    keys.update(tp for tp in committed if tp[0] in read)
    keys.update(held)
    return sorted(keys)


def group_samples(
    found: FleetLook, group: str, followed: Iterable[TP] = (), topic: str | None = None
) -> list[PartitionSample]:
    """The group's samples in one look. Raises TransientError when the broker did not tell
    its offsets, or the bounds of one of its partitions."""
    offsets = found.committed.get(group)
    if offsets is None or isinstance(offsets, str):
        raise TransientError(
            f"the broker did not tell the committed offsets of group {group!r}"
            + (f": {offsets}" if offsets else "")
        )
    keys = found.partitions.get(group)
    if keys is None or topic is not None:
        keys = group_partitions(offsets, found.topics, followed, topic)
    # The loop of every partition of every group each round in serve: names bound once.
    topics, failed, low, end, at = found.topics, found.failed, found.low, found.end, found.at
    samples = []
    for key in keys:
        t, p = key
        gone = p >= topics.get(t, 0)
        if not gone and key in end and key not in failed:
            samples.append(PartitionSample(t, p, at, offsets.get(key), low[key], end[key]))
        elif gone and key not in failed:
            samples.append(PartitionSample(t, p, at, offsets.get(key), 0, 0, True))
        else:
            # Not told, or not asked (a topic that appeared during the look): the next look.
            why = failed.get(key, "not asked yet")
            raise TransientError(f"the broker did not tell where {t}[{p}]'s log ends: {why}")
    return samples


def record_starts(samples: Iterable[PartitionSample]) -> dict[TP, int]:
    """Where the record at the committed offset (or the log start) is, for each partition that
    lags and still holds it: the oldest record not read, whose timestamp is the time lag."""
    return {s.key: s.end - s.lag for s in samples if s.lag > 0 and s.end - s.lag >= s.low}


class OffsetSource(Protocol):
    by_lagless: bool
    """The group's offsets are committed by lagless import (its --group), not by consumers."""
    description: GroupDescription | None
    """Who held which partition at the latest sample (None: the broker did not tell)."""

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
    """One group's committed offsets and its partitions' bounds, read without joining the
    group, as `serve` reads a fleet's (`look`, `group_samples`)."""

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
        self._followed: set[TP] = set()
        self.by_lagless = False
        self.description: GroupDescription | None = None
        """Who held which partition at the latest sample (None: the broker did not tell)."""
        self.fleet = KafkaFleetSource(config, request_timeout_s)
        try:
            try:
                if topic is not None and topic not in self.fleet.topics():
                    raise BadInput(f"topic {topic!r} does not exist on {config.bootstrap}")
                # A group's answer may fail for a moment (a rebalance under way): asked again
                # for the request's timeout, as a consumer's committed() does.
                first = retried(
                    self.sample,
                    what=f"the offsets of group {group!r}",
                    budget_s=request_timeout_s,
                    retry_on=(TransientError,),
                )
                self.partitions = [s.key for s in first]
            except TransientError as exc:
                raise BadInput(str(exc)) from None
        except BaseException:
            self.fleet.close()
            raise

    def follow(self, partitions: Iterable[TP]) -> None:
        self._followed.update(tp for tp in partitions if self._topic in (None, tp[0]))

    def sample(self) -> list[PartitionSample]:
        found = look(self.fleet, [self.group], {self.group: self._followed})
        samples = group_samples(found, self.group, self._followed, self._topic)
        self.partitions = [s.key for s in samples]
        self.by_lagless = found.committed_by_lagless(self.group)
        self.description = found.described.get(self.group)
        return samples

    def record_at(self, samples: Sequence[PartitionSample]) -> dict[TP, RecordInfo]:
        return self.fleet.records_at(record_starts(samples))

    def retention_ms(self) -> dict[str, int | None] | None:
        return self.fleet.retention_ms(t for t, _ in self.partitions)

    def close(self) -> None:
        self.fleet.close()


def require_commits(source: KafkaOffsetSource, topic: str | None) -> None:
    """Bad input when the group has committed nothing (on the topic): nothing to show."""
    if not source.partitions:
        where = f"topic {topic!r}" if topic else "any topic"
        raise BadInput(f"group {source.group!r} has no committed offsets on {where}")


__all__ = [
    "FleetLook",
    "FleetSource",
    "KafkaFleetSource",
    "KafkaOffsetSource",
    "OffsetSource",
    "PartitionSample",
    "RecordInfo",
    "group_samples",
    "look",
    "record_starts",
    "require_commits",
]
