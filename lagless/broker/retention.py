"""Retention the embedded broker keeps on demand: by time (`retention_ms`) and by size below
what librdkafka's mock keeps by itself (`retention_bytes`, at most cluster.RETENTION_BYTES).

A thread reads each partition's new records as they arrive (one consumer over loopback, the
records' sizes and timestamps only), and deletes the oldest past either limit
(EmbeddedBroker.delete_records), as Kafka's log cleaner would: what a test or a demo of
retention needs, on a broker that has none of its own to set.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from lagless.exceptions import TerminalError
from lagless.partitions import TP

# How often the limits are enforced.
EVERY_S = 0.5

log = logging.getLogger(__name__)


@dataclass
class _Log:
    """What the thread knows of a partition: its records from the log start, as
    (offset, bytes, timestamp ms), and where to read on."""

    kept: deque[tuple[int, int, int]] = field(default_factory=deque)
    size: int = 0
    next: int = 0

    def forget_below(self, offset: int) -> None:
        while self.kept and self.kept[0][0] < offset:
            self.size -= self.kept.popleft()[1]
        self.next = max(self.next, offset)


class Retention(threading.Thread):
    """Enforces the limits every EVERY_S until `stop()`; `delete(topic, partition, offset)`
    moves a partition's log start."""

    def __init__(
        self,
        bootstrap: str,
        delete: Callable[[str, int, int], None],
        retention_ms: int | None,
        retention_bytes: int | None,
    ) -> None:
        super().__init__(name="lagless-broker-retention", daemon=True)
        self.bootstrap = bootstrap
        self.delete = delete
        self.retention_ms = retention_ms
        self.retention_bytes = retention_bytes
        self._stopped = threading.Event()
        self._logs: dict[TP, _Log] = {}

    def stop(self) -> None:
        self._stopped.set()
        if self.is_alive():
            self.join(timeout=10)

    def run(self) -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "lagless-broker-retention",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "log_level": 2,  # not librdkafka's line per failed connection: run() says it once
            }
        )
        away_since: float | None = None
        try:
            while not self._stopped.wait(EVERY_S):
                try:
                    self.enforce(consumer)
                except (KafkaException, TerminalError) as exc:
                    # A broker set down (or stopping) fails a pass, never the thread: the next
                    # pass enforces the limits again once it answers.
                    if away_since is None:
                        away_since = time.monotonic()
                        log.warning("broker retention waits for the broker: %s", exc)
                    continue
                if away_since is not None:
                    log.info(
                        "broker retention: the broker is back after %.1f s",
                        time.monotonic() - away_since,
                    )
                    away_since = None
        finally:
            consumer.close()

    def enforce(self, consumer: Consumer) -> None:
        """Read what arrived, then delete what is past a limit."""
        metadata = consumer.list_topics(timeout=5)
        for topic, meta in metadata.topics.items():
            if topic.startswith("__"):
                continue
            for partition in meta.partitions:
                tp = (topic, partition)
                log = self._logs.setdefault(tp, _Log())
                low, high = consumer.get_watermark_offsets(TopicPartition(*tp), timeout=5)
                log.forget_below(low)  # the mock's own retention, or a DeleteRecords
                if log.next < high:
                    self._read(consumer, tp, log, high)
                self._trim(tp, log, high)

    def _read(self, consumer: Consumer, tp: TP, log: _Log, high: int) -> None:
        consumer.assign([TopicPartition(tp[0], tp[1], log.next)])
        while log.next < high and not self._stopped.is_set():
            for message in consumer.consume(1000, timeout=1.0):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return
                    continue
                offset = message.offset()
                if offset is None or offset < log.next:
                    continue
                size = len(message.key() or b"") + len(message.value() or b"")
                log.kept.append((offset, size, message.timestamp()[1]))
                log.size += size
                log.next = offset + 1

    def _trim(self, tp: TP, log: _Log, high: int) -> None:
        oldest_kept = time.time() * 1000 - self.retention_ms if self.retention_ms else None
        before = log.kept[0][0] if log.kept else None
        while log.kept and (
            (self.retention_bytes is not None and log.size > self.retention_bytes)
            or (oldest_kept is not None and log.kept[0][2] < oldest_kept)
        ):
            log.size -= log.kept.popleft()[1]
        start = log.kept[0][0] if log.kept else log.next
        if before is not None and start > before:
            self.delete(tp[0], tp[1], min(start, high))
