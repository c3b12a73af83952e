"""The driver's view of the broker: which partitions exist and their low and high watermarks.

All broker I/O the planner depends on passes through OffsetReader, so the source's
offset arithmetic can be tested against the embedded broker or any object with the same methods.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from lagless.exceptions import BadInput, TransientError
from lagless.kafka_config import KafkaConfig

TP = tuple[str, int]
Offsets = dict[TP, int]


class OffsetReader:
    def __init__(self, config: KafkaConfig, timeout_s: float = 10.0, retry_s: float = 60.0) -> None:
        self._config = config
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._admin = AdminClient(config.admin())

    def partitions(self, topics: Iterable[str] = (), pattern: str | None = None) -> list[TP]:
        """Partitions of the named topics (each must exist) or of the topics matching pattern."""
        try:
            metadata = self._admin.list_topics(timeout=self._timeout_s)
        except KafkaException as exc:
            raise BadInput(
                f"cannot reach Kafka at {self._config.bootstrap}: {_reason(exc)}"
            ) from None
        if pattern is not None:
            regex = re.compile(pattern)
            names = sorted(t for t in metadata.topics if regex.fullmatch(t))
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

    def _list(self, partitions: list[TP], spec: OffsetSpec) -> Offsets:
        """Retries while the broker is away, up to retry_s: a failure here stalls the query."""
        if not partitions:
            return {}
        request = {TopicPartition(t, p): spec for t, p in partitions}
        deadline = time.monotonic() + self._retry_s
        while True:
            try:
                futures = self._admin.list_offsets(request, request_timeout=self._timeout_s)
                return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
            except KafkaException as exc:
                if time.monotonic() > deadline:
                    raise TransientError(
                        f"listing offsets on {self._config.bootstrap}: {_reason(exc)}"
                    ) from None
                time.sleep(1.0)


def _reason(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else exc
    return str(getattr(err, "str", lambda: err)())
