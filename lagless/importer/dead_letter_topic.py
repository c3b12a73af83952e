"""Rejected records to a Kafka topic as well as to `<table>_dlq`, for tools that watch topics.

The headers carry the error context under Kafka Connect's names
(errors.deadletterqueue.context.headers.enable), so tooling built for Connect reads them as is.
A replayed batch sends its dead letters again: the topic is at least once, and the headers'
topic, partition and offset tell copies apart. `<table>_dlq` stays exactly once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

from lagless.exceptions import TransientError
from lagless.kafka.config import KafkaConfig
from lagless.kafka.produce import produce

if TYPE_CHECKING:
    import pyarrow as pa

HEADER_PREFIX = "__connect.errors."
FLUSH_TIMEOUT_S = 60.0


def context_headers(row: dict[str, object]) -> list[tuple[str, str | bytes | None]]:
    context = {
        "topic": row["topic"],
        "partition": row["partition"],
        "offset": row["offset"],
        "stage": row["stage"],
        "connector.name": "lagless",
        "exception.message": row["error"],
    }
    return [(HEADER_PREFIX + name, str(value).encode()) for name, value in context.items()]


class DeadLetterTopic:
    def __init__(self, kafka: KafkaConfig, topic: str) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self._failures: list[str] = []
        self._producer = Producer(
            kafka.producer(
                **{
                    "enable.idempotence": True,
                    "delivery.report.only.error": True,
                    "on_delivery": self._on_delivery,
                }
            )
        )

    def _on_delivery(self, error: object, _message: object) -> None:
        if error is not None:
            self._failures.append(str(error))

    def send(self, rows: pa.Table) -> int:
        """Produce every row (DEAD_LETTER_COLUMNS) and wait until the broker has them all."""
        self._failures.clear()
        for row in rows.to_pylist():
            produce(
                self._producer,
                self.topic,
                value=row["value"],
                key=row["key"],
                headers=context_headers(row),
                timestamp=int(row["timestamp"] or 0),
            )
        left = self._producer.flush(FLUSH_TIMEOUT_S)
        if left or self._failures:
            reason = self._failures[0] if self._failures else f"{left} still queued"
            raise TransientError(f"dead-letter topic {self.topic!r}: not all sent ({reason})")
        return rows.num_rows

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Waits for what is still queued (sent batches were flushed already)."""
        self._producer.flush(FLUSH_TIMEOUT_S)
