"""Bytes per record of each partition, from a few records read at the start of its range.

The planner weighs tasks by bytes, so a partition of 800 KB records (seed 002) is split
far finer than one of 100 B records with the same count.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import cast

from confluent_kafka import Consumer, TopicPartition

from lagless.kafka_config import KafkaConfig
from lagless.planner.ranges import OffsetRange

SAMPLE_RECORDS = 16


def sample_bytes_per_record(
    config: KafkaConfig, ranges: Sequence[OffsetRange], timeout_s: float = 3.0
) -> dict[tuple[str, int], float]:
    wanted = {r.key: min(SAMPLE_RECORDS, r.records) for r in ranges if r.records > 0}
    if not wanted:
        return {}
    seen: dict[tuple[str, int], list[int]] = {key: [] for key in wanted}
    consumer = Consumer(config.reader())
    try:
        consumer.assign(
            [TopicPartition(r.topic, r.partition, r.start) for r in ranges if r.key in wanted]
        )
        deadline = time.monotonic() + timeout_s
        pending = set(wanted)
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(1000, timeout=0.2):
                if message.error() is not None:
                    continue
                key = (cast(str, message.topic()), cast(int, message.partition()))
                sizes = seen[key]
                if len(sizes) < wanted[key]:
                    sizes.append(len(message.value() or b"") + len(message.key() or b""))
                    if len(sizes) == wanted[key]:
                        pending.discard(key)
                        consumer.pause([TopicPartition(key[0], key[1])])
    finally:
        consumer.close()
    return {key: sum(sizes) / len(sizes) for key, sizes in seen.items() if sizes}
