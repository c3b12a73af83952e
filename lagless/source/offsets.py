"""The driver's view of the broker: which partitions exist, their low and high watermarks, and
the offsets of a time.

All broker I/O the planner depends on passes through OffsetReader, so the source's
offset arithmetic can be tested against the embedded broker or any object with the same methods.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
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
        # The latest offset a reader can reach: under read_committed (librdkafka's default) the
        # last stable offset, so a batch never waits on an open transaction.
        self._isolation = (
            IsolationLevel.READ_COMMITTED
            if config.read_committed
            else IsolationLevel.READ_UNCOMMITTED
        )

    def partitions(
        self,
        topics: Iterable[str] = (),
        pattern: str | None = None,
        assign: Mapping[str, Iterable[int]] | None = None,
    ) -> list[TP]:
        """Partitions of the named topics (each must exist), of the topics matching pattern, or
        the assigned ones (each must exist)."""
        try:
            metadata = self._admin.list_topics(timeout=self._timeout_s)
        except KafkaException as exc:
            raise BadInput(
                f"cannot reach Kafka at {self._config.bootstrap}: {_reason(exc)}"
            ) from None
        if assign is not None:
            wanted = [(t, p) for t, parts in sorted(assign.items()) for p in sorted(parts)]
            for t, p in wanted:
                found = metadata.topics.get(t)
                if found is None or found.error or p not in found.partitions:
                    raise BadInput(f"partition {t}[{p}] does not exist on {self._config.bootstrap}")
            return wanted
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

    def _list(self, partitions: list[TP], spec: OffsetSpec) -> Offsets:
        return self._list_specs({tp: spec for tp in partitions})

    def _list_specs(self, specs: Mapping[TP, OffsetSpec]) -> Offsets:
        """Retries while the broker is away, up to retry_s: a failure here stalls the query."""
        if not specs:
            return {}
        request = {TopicPartition(t, p): spec for (t, p), spec in specs.items()}
        deadline = time.monotonic() + self._retry_s
        while True:
            try:
                futures = self._admin.list_offsets(
                    request, isolation_level=self._isolation, request_timeout=self._timeout_s
                )
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
