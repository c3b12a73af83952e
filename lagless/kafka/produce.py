"""Producing without losing a record to a full local queue."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer

# How long to serve delivery reports before trying again when librdkafka's queue is full.
_FULL_QUEUE_WAIT_S = 0.05


def produce(producer: Producer, topic: str, **record: Any) -> None:
    """`producer.produce(topic, **record)`, waiting for room while the local queue is full
    (librdkafka raises BufferError then, and the record would be dropped)."""
    while True:
        try:
            producer.produce(topic, **record)
            return
        except BufferError:
            producer.poll(_FULL_QUEUE_WAIT_S)
