"""The logs' offsets on the embedded broker (lagless/broker/, librdkafka's mock cluster), which
answers every ListOffsets by time with "none": a partition the broker says has no record that
recent, but one of whose last records is, is read to find the offset. OffsetReader takes this
only where the cluster is the mock one (its id says so): a real broker is never scanned."""

from __future__ import annotations

import time
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaError, TopicPartition

from lagless.exceptions import TransientError
from lagless.kafka import TP
from lagless.kafka.config import KafkaConfig
from lagless.kafka.log_offsets import LogOffsets

# librdkafka names a mock cluster "mockCluster<address>"; Kafka's ids are base64 UUIDs.
EMBEDDED_CLUSTER_ID_PREFIX = "mockCluster"
# Records read from a partition's end to tell whether a "none" answer to ListOffsets by time
# can be right.
SCAN_CHECK_RECORDS = 16


def is_embedded(cluster_id: str) -> bool:
    return cluster_id.startswith(EMBEDDED_CLUSTER_ID_PREFIX)


class EmbeddedLogOffsets(LogOffsets):
    def offsets_for_times(
        self, timestamps: Mapping[TP, int], high: Mapping[TP, int] | None = None
    ) -> dict[TP, int | None]:
        """As the broker answers, with each partition it answers "none" for scanned up to
        `high` (default: its latest offset)."""
        found = super().offsets_for_times(timestamps, high)
        unanswered = [tp for tp, offset in found.items() if offset is None]
        if unanswered:
            low, top = self.watermarks(unanswered)
            top = {tp: (high or top).get(tp, top[tp]) for tp in unanswered}
            for tp in unanswered:
                if top[tp] > low[tp]:
                    found[tp] = _scan_for_time(
                        self._connection.config, tp, low[tp], top[tp], timestamps[tp]
                    )
        return found


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
