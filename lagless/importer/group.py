"""Commit an import's progress to a Kafka consumer group, so kafka-consumer-groups, Burrow
and `lagless lag` see how far the pipeline really is.

Commits follow the sink: only offsets of a batch already written are committed, and never
backwards, so a replayed batch cannot make a caught-up partition look stuck (seed 001).
The checkpoint, not the group, stays the source of truth for resuming.
"""

from __future__ import annotations

from typing import Self

from confluent_kafka import Consumer, KafkaException, TopicPartition

from lagless.exceptions import TransientError
from lagless.kafka_config import KafkaConfig
from lagless.source.offsets import Offsets


class GroupCommitter:
    def __init__(self, config: KafkaConfig, group: str, timeout_s: float = 10.0) -> None:
        self.group = group
        self._config = config
        self._timeout_s = timeout_s
        self._consumer: Consumer | None = None

    def committed(self, partitions: list[tuple[str, int]]) -> Offsets:
        found = self._client().committed(
            [TopicPartition(t, p) for t, p in partitions], timeout=self._timeout_s
        )
        return {(tp.topic, tp.partition): tp.offset for tp in found if tp.offset >= 0}

    def commit(self, end: Offsets) -> Offsets:
        """Commit `end` where it moves the group forward; returns what was committed."""
        try:
            current = self.committed(list(end))
            forward = {tp: offset for tp, offset in end.items() if offset > current.get(tp, -1)}
            if forward:
                self._client().commit(
                    offsets=[TopicPartition(t, p, o) for (t, p), o in forward.items()],
                    asynchronous=False,
                )
            return forward
        except KafkaException as exc:
            raise TransientError(
                f"committing offsets of group {self.group!r}: {exc.args[0].str()}"
            ) from None

    def _client(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer(self._config.group_committer(self.group))
        return self._consumer

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
