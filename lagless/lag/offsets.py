"""What the broker says about a group's offsets, behind a small seam so the logic is testable.

`OffsetSource` is the seam: `KafkaOffsetSource` asks a real broker, tests may hand the pure
functions plain `PartitionSample`s instead.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from lagless.exceptions import BadInput
from lagless.kafka_config import KafkaConfig

REACH_TIMEOUT_S = 5.0
_REQUEST_TIMEOUT_S = 10.0
_RECORD_READ_TIMEOUT_S = 2.0
_DESCRIBE_CONFIGS_TIMEOUT_S = 2.0


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


@dataclass(frozen=True)
class RecordInfo:
    """The record at an offset: when it was written and how big it is."""

    timestamp_s: float | None
    size_bytes: int


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

    def close(self) -> None: ...


class KafkaOffsetSource:
    """Reads a group's committed offsets (OffsetFetch) without joining the group."""

    def __init__(
        self,
        config: KafkaConfig,
        group: str,
        topic: str | None = None,
        request_timeout_s: float = _REQUEST_TIMEOUT_S,
    ) -> None:
        self.group = group
        self._config = config
        # A service keeps sampling while the broker is away: a shorter wait per request lets
        # it report the outage promptly instead of hanging on it.
        self._request_timeout_s = request_timeout_s
        self._consumer = Consumer(config.group_offsets_reader(group))
        self._partitions = self._find_partitions(topic)

    def _find_partitions(self, topic: str | None) -> list[TopicPartition]:
        try:
            metadata = self._consumer.list_topics(topic=topic, timeout=REACH_TIMEOUT_S)
        except KafkaException as exc:
            self._consumer.close()
            raise BadInput(
                f"cannot reach the broker at {self._config.bootstrap} within "
                f"{REACH_TIMEOUT_S:.0f} s ({exc.args[0].str()})"
            ) from None
        topics = {
            name: meta
            for name, meta in metadata.topics.items()
            if meta.error is None and not name.startswith("__")
        }
        if topic is not None and topic not in topics:
            self._consumer.close()
            raise BadInput(f"topic {topic!r} does not exist on {self._config.bootstrap}")
        every = [
            TopicPartition(name, partition)
            for name, meta in sorted(topics.items())
            for partition in sorted(meta.partitions)
        ]
        committed = self._committed(every) if every else []
        read_topics = {tp.topic for tp in committed if tp.offset != OFFSET_INVALID}
        if not read_topics:
            self._consumer.close()
            where = f"topic {topic!r}" if topic else "any topic"
            raise BadInput(f"group {self.group!r} has no committed offsets on {where}")
        return [TopicPartition(tp.topic, tp.partition) for tp in every if tp.topic in read_topics]

    def _committed(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        try:
            return list(self._consumer.committed(partitions, timeout=self._request_timeout_s))
        except KafkaException as exc:
            raise BadInput(
                f"cannot read the offsets of group {self.group!r}: {exc.args[0].str()}"
            ) from None

    def sample(self) -> list[PartitionSample]:
        committed = self._committed(self._partitions)
        samples = []
        for tp in committed:
            low, end = self._consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition),
                timeout=self._request_timeout_s,
                cached=False,
            )
            samples.append(
                PartitionSample(
                    topic=tp.topic,
                    partition=tp.partition,
                    at=time.time(),
                    committed=None if tp.offset < 0 else tp.offset,
                    low=low,
                    end=end,
                )
            )
        return samples

    def record_at(self, samples: Sequence[PartitionSample]) -> dict[tuple[str, int], RecordInfo]:
        wanted = {s.key: s.end - s.lag for s in samples if s.lag > 0}
        if not wanted:
            return {}
        reader = Consumer(self._config.reader())
        found: dict[tuple[str, int], RecordInfo] = {}
        try:
            reader.assign([TopicPartition(t, p, offset) for (t, p), offset in wanted.items()])
            deadline = time.monotonic() + _RECORD_READ_TIMEOUT_S
            while len(found) < len(wanted) and time.monotonic() < deadline:
                message = reader.poll(0.2)
                if message is None or message.error() is not None:
                    continue
                key = (message.topic(), message.partition())
                if key in wanted and key not in found:
                    kind, millis = message.timestamp()
                    found[key] = RecordInfo(
                        timestamp_s=millis / 1000 if kind and millis > 0 else None,
                        size_bytes=len(message.value() or b"") + len(message.key() or b""),
                    )
        finally:
            reader.close()
        return found

    def retention_ms(self) -> dict[str, int | None] | None:
        """DescribeConfigs of the topics read; the embedded broker does not answer it."""
        admin = AdminClient({key: str(value) for key, value in self._config.admin().items()})
        topics = sorted({tp.topic for tp in self._partitions})
        futures = admin.describe_configs(
            [ConfigResource("topic", topic) for topic in topics],
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

    def close(self) -> None:
        self._consumer.close()
