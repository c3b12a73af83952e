"""The one way to the broker's metadata and offsets, as Spark's KafkaOffsetReader: which
partitions exist, their watermarks (one request for all), the offsets of a time, a group's
committed offsets (read and committed without joining it), and the records at given offsets.

Every command and the source's driver side ask here; Kafka's errors become lagless's own here
(`_reason`): BadInput when the broker cannot be reached at the start; later, a request that
fails is retried while the broker is away (lagless/retry.py), and past the budget a
TransientError says so. Executors read their ranges with their own consumers
(source/reader.py): that is data, not metadata.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Self, TypeVar, cast

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ClusterMetadata, ConfigResource, OffsetSpec

from lagless.exceptions import BadInput, TransientError
from lagless.kafka.config import KafkaConfig
from lagless.retry import DEFAULT_RETRY_S, retried

TP = tuple[str, int]
T = TypeVar("T")
Offsets = dict[TP, int]

# Brokers that do not answer DescribeGroups or DescribeConfigs (the embedded broker does not)
# hold such a request for its whole timeout: a short one keeps callers responsive.
_DESCRIBE_TIMEOUT_S = 5.0
_DESCRIBE_CONFIGS_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class GroupMember:
    member_id: str
    client_id: str
    partitions: tuple[TP, ...]
    group_instance_id: str | None = None


@dataclass(frozen=True)
class GroupDescription:
    group: str
    assignor: str
    state: str
    members: tuple[GroupMember, ...]


@dataclass(frozen=True)
class RecordInfo:
    """A record as the driver needs it: when it was written and how big it is."""

    timestamp_s: float | None
    size_bytes: int


class OffsetReader:
    def __init__(
        self,
        config: KafkaConfig,
        timeout_s: float = 10.0,
        retry_s: float = DEFAULT_RETRY_S,
        *,
        reached: bool = False,
    ) -> None:
        """`retry_s`: how long a broker that went away is waited for (lagless/retry.py).
        Before it first answered (`reached`), an unreachable broker is bad input (a wrong
        address) rather than one to wait for."""
        self._config = config
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._reached = reached
        self._admin = AdminClient(config.admin())
        self._group_clients: dict[str, Consumer] = {}
        # The latest offset a reader can reach: under read_committed (librdkafka's default) the
        # last stable offset, so a batch never waits on an open transaction.
        self._isolation = (
            IsolationLevel.READ_COMMITTED
            if config.read_committed
            else IsolationLevel.READ_UNCOMMITTED
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        for client in self._group_clients.values():
            client.close()
        self._group_clients.clear()

    def partitions(
        self,
        topics: Iterable[str] = (),
        pattern: str | None = None,
        assign: Mapping[str, Iterable[int]] | None = None,
    ) -> list[TP]:
        """Partitions of the named topics (each must exist), of the topics matching pattern
        (`.*`: every topic but Kafka's internal ones), or the assigned ones (each must exist)."""
        if not self._reached:
            try:
                metadata = self._admin.list_topics(timeout=self._timeout_s)
            except KafkaException as exc:
                raise BadInput(
                    f"cannot reach the broker at {self._config.bootstrap} within "
                    f"{self._timeout_s:.0f} s ({_reason(exc)})"
                ) from None
            self._reached = True
        else:
            named = set(topics) | set(assign or ())

            def answered() -> ClusterMetadata:
                found = self._admin.list_topics(timeout=self._timeout_s)
                # A restarting broker may answer before it leads its partitions again.
                failing = sorted(t for t in named if t in found.topics and found.topics[t].error)
                if failing:
                    raise KafkaException(found.topics[failing[0]].error)
                return found

            metadata = self._retried(answered, "listing topics")
        if assign is not None:
            wanted = [(t, p) for t, parts in sorted(assign.items()) for p in sorted(parts)]
            for t, p in wanted:
                found = metadata.topics.get(t)
                if found is None or found.error or p not in found.partitions:
                    raise BadInput(f"partition {t}[{p}] does not exist on {self._config.bootstrap}")
            return wanted
        if pattern is not None:
            regex = re.compile(pattern)
            names = sorted(
                t
                for t, meta in metadata.topics.items()
                if regex.fullmatch(t) and not meta.error and not t.startswith("__")
            )
        else:
            names = list(topics)
            missing = [t for t in names if t not in metadata.topics or metadata.topics[t].error]
            if missing:
                raise BadInput(f"topic {missing[0]!r} does not exist on {self._config.bootstrap}")
        return [(t, p) for t in names for p in sorted(metadata.topics[t].partitions)]

    def watermarks(self, partitions: Iterable[TP]) -> tuple[Offsets, Offsets]:
        """(low, high): the first offset still kept and the next offset to be written."""
        wanted = list(partitions)
        return self._list(wanted, OffsetSpec.earliest()), self._list(wanted, OffsetSpec.latest())

    def latest(self, partitions: Iterable[TP]) -> Offsets:
        return self._list(list(partitions), OffsetSpec.latest())

    def offsets_for_times(
        self, timestamps: Mapping[TP, int], high: Mapping[TP, int] | None = None
    ) -> dict[TP, int | None]:
        """The first offset of each partition whose record's timestamp is at or after the given
        milliseconds (the broker's ListOffsets by time), or None when every record is older.

        librdkafka's mock cluster (the embedded broker) answers every such request with "none":
        when the broker says none but one of the partition's last records is that recent, the
        answer cannot be right and the partition is scanned instead (SCAN_CHECK_RECORDS)."""
        wanted = dict(timestamps)
        found: dict[TP, int | None] = {}
        for tp, offset in self._list_specs(
            {tp: OffsetSpec.for_timestamp(ms) for tp, ms in wanted.items()}
        ).items():
            found[tp] = offset if offset >= 0 else None
        unanswered = [tp for tp, offset in found.items() if offset is None]
        if unanswered:
            low, top = self.watermarks(unanswered)
            top = {tp: (high or top).get(tp, top[tp]) for tp in unanswered}
            for tp in unanswered:
                if top[tp] > low[tp]:
                    found[tp] = _scan_for_time(self._config, tp, low[tp], top[tp], wanted[tp])
        return found

    def committed(self, group: str, partitions: Iterable[TP]) -> dict[TP, int | None]:
        """`group`'s committed offset of each partition (None: never committed), read without
        joining the group."""
        wanted = [TopicPartition(t, p) for t, p in partitions]
        if not wanted:
            return {}
        found = self._retried(
            lambda: self._group_client(group).committed(wanted, timeout=self._timeout_s),
            f"reading the offsets of group {group!r}",
        )
        return {
            (tp.topic, tp.partition): None
            if tp.offset == OFFSET_INVALID or tp.offset < 0
            else tp.offset
            for tp in found
        }

    def commit(self, group: str, offsets: Mapping[TP, int]) -> None:
        """Commit `offsets` for `group` as they are (whether they move it forward is the
        caller's rule), without joining the group."""
        if not offsets:
            return
        self._retried(
            lambda: self._group_client(group).commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                asynchronous=False,
            ),
            f"committing offsets of group {group!r}",
        )

    def _group_client(self, group: str) -> Consumer:
        if group not in self._group_clients:
            self._group_clients[group] = Consumer(self._config.group_committer(group))
        return self._group_clients[group]

    def records_at(
        self,
        starts: Mapping[TP, int],
        counts: Mapping[TP, int] | None = None,
        timeout_s: float = 3.0,
    ) -> dict[TP, list[RecordInfo]]:
        """The records of each partition from its start offset, `counts` of them (default one).
        A partition whose records do not arrive within timeout_s (none there, or deleted) has
        fewer or none."""
        seen: dict[TP, list[RecordInfo]] = {tp: [] for tp in starts}
        wanted = {tp: (counts or {}).get(tp, 1) for tp in starts}
        starts = {tp: offset for tp, offset in starts.items() if wanted[tp] > 0}
        if not starts:
            return seen
        consumer = Consumer(self._config.reader())
        try:
            consumer.assign([TopicPartition(t, p, o) for (t, p), o in starts.items()])
            deadline = time.monotonic() + timeout_s
            pending = set(starts)
            while pending and time.monotonic() < deadline:
                for message in consumer.consume(1000, timeout=0.2):
                    tp = (cast(str, message.topic()), cast(int, message.partition()))
                    if message.error() is not None or tp not in pending:
                        continue
                    kind, millis = message.timestamp()
                    seen[tp].append(
                        RecordInfo(
                            timestamp_s=millis / 1000 if kind and millis > 0 else None,
                            size_bytes=len(message.value() or b"") + len(message.key() or b""),
                        )
                    )
                    if len(seen[tp]) == wanted[tp]:
                        pending.discard(tp)
                        consumer.pause([TopicPartition(*tp)])
        finally:
            consumer.close()
        return seen

    def retention_ms(self, topics: Iterable[str]) -> dict[str, int | None] | None:
        """retention.ms of each topic (None: unlimited), from DescribeConfigs; None when the
        broker does not tell (the embedded broker does not answer)."""
        futures = self._admin.describe_configs(
            [ConfigResource("topic", topic) for topic in sorted(set(topics))],
            request_timeout=_DESCRIBE_CONFIGS_TIMEOUT_S,
        )
        found: dict[str, int | None] = {}
        try:
            for resource, future in futures.items():
                entry = future.result().get("retention.ms")
                value = None if entry is None or entry.value is None else int(entry.value)
                # Kafka spells "no time limit" as -1.
                found[resource.name] = None if value is None or value < 0 else value
        except (KafkaException, ValueError):
            return None
        return found

    def list_groups(self) -> list[str] | None:
        """Every consumer group the broker knows; None when it does not answer ListGroups."""
        future = self._admin.list_consumer_groups(request_timeout=_DESCRIBE_TIMEOUT_S)
        try:
            listed = future.result()
        except KafkaException as exc:
            raise TransientError(f"ListGroups failed: {_reason(exc)}") from None
        unsupported = [
            error for error in listed.errors if error.code() == KafkaError._UNSUPPORTED_FEATURE
        ]
        if unsupported and not listed.valid:
            return None
        if listed.errors and not listed.valid:
            raise TransientError(f"ListGroups failed: {listed.errors[0].str()}")
        return sorted({group.group_id for group in listed.valid})

    def describe_group(self, group: str) -> GroupDescription | None:
        """The group's state, assignor, members and their partitions (DescribeGroups); None
        when the broker does not tell."""
        future = self._admin.describe_consumer_groups([group], request_timeout=_DESCRIBE_TIMEOUT_S)
        try:
            found = future[group].result()
        except KafkaException:
            return None
        return GroupDescription(
            group=group,
            assignor=found.partition_assignor or "",
            state=str(getattr(found.state, "name", found.state)),
            members=tuple(
                GroupMember(
                    member_id=member.member_id,
                    client_id=member.client_id,
                    partitions=tuple(
                        sorted(
                            (tp.topic, tp.partition)
                            for tp in (member.assignment.topic_partitions or [])
                        )
                    ),
                    group_instance_id=member.group_instance_id,
                )
                for member in found.members
            ),
        )

    def _list(self, partitions: list[TP], spec: OffsetSpec) -> Offsets:
        return self._list_specs({tp: spec for tp in partitions})

    def _list_specs(self, specs: Mapping[TP, OffsetSpec]) -> Offsets:
        if not specs:
            return {}
        request = {TopicPartition(t, p): spec for (t, p), spec in specs.items()}

        def listed() -> Offsets:
            futures = self._admin.list_offsets(
                request, isolation_level=self._isolation, request_timeout=self._timeout_s
            )
            found = {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
            for tp, offset in found.items():
                # An earliest or latest offset is never negative: a broker that stops answering
                # mid-request can leave librdkafka's "invalid" (-1001) in the answer. Asked again,
                # as for any failure; only by time does -1 mean an answer ("no such record").
                if offset < 0 and not isinstance(specs[tp], _BY_TIME):
                    raise KafkaException(
                        KafkaError(
                            KafkaError.OFFSET_NOT_AVAILABLE,
                            f"no offset for {tp[0]}[{tp[1]}] in the broker's answer ({offset})",
                        )
                    )
            return found

        return self._retried(listed, "listing offsets")

    def _retried(self, attempt: Callable[[], T], doing: str) -> T:
        """attempt() again while the broker is away, up to retry_s: a failure here stalls the
        query, and past the budget the import exits 75."""
        return retried(
            attempt,
            what=f"the broker at {self._config.bootstrap} ({doing})",
            budget_s=self._retry_s,
            retry_on=(KafkaException,),
            reason=lambda exc: _reason(cast(KafkaException, exc)),
        )


def _reason(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else exc
    return str(getattr(err, "str", lambda: err)())


# The kind of spec ListOffsets by time takes (confluent_kafka does not export its class).
_BY_TIME = type(OffsetSpec.for_timestamp(0))

# Records read from a partition's end to tell whether a "none" answer to ListOffsets by time
# can be right; a broker that answers such requests is never scanned further.
SCAN_CHECK_RECORDS = 16


def _scan_for_time(
    config: KafkaConfig, tp: TP, low: int, high: int, ms: int, timeout_s: float = 30.0
) -> int | None:
    """The first offset in [low, high) whose timestamp is at or after ms, found by reading;
    None when the last records are all older (then the broker's "none" was right)."""
    consumer = Consumer(config.reader())
    try:

        def first_at_or_after(start: int) -> int | None:
            consumer.assign([TopicPartition(tp[0], tp[1], start)])
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                for message in consumer.consume(1000, timeout=0.5):
                    error = message.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            return None
                        continue
                    offset = message.offset()
                    if offset is None or offset >= high:
                        return None
                    if message.timestamp()[1] >= ms:
                        return offset
            raise TransientError(f"reading {tp[0]}[{tp[1]}] for offsets by time timed out")

        if first_at_or_after(max(low, high - SCAN_CHECK_RECORDS)) is None:
            return None
        return first_at_or_after(low)
    finally:
        consumer.close()
