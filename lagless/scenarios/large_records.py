"""Report 002, the lagging partition: one deal updated in a flood of records far larger than
the consumers' fetch size, all on one partition, read by a consumer that goes round its
partitions and blocks on each fetch: that partition crawls, a record per turn."""

from __future__ import annotations

import os
import threading
import time

from lagless.kafka.config import KafkaConfig
from lagless.scenarios.base import Scenario, create_topic, member, produce

FETCH_BYTES = 64 * 1024
LARGE_BYTES = 256 * 1024
UPDATES = 40
SMALL = 50
HOT_PARTITION = 2


class LargeRecords(Scenario):
    name = "002"
    title = (
        f"{UPDATES} updates of deal 42, {LARGE_BYTES // 1024} KB each, on partition "
        f"{HOT_PARTITION}; the consumer fetches {FETCH_BYTES // 1024} KB per partition and "
        "blocks on each partition in turn"
    )
    cure = "lagless import reads every partition in parallel tasks with Spark's fetch sizes"
    partitions = 3
    fetch_bytes = FETCH_BYTES

    def produce(self, config: KafkaConfig) -> int:
        create_topic(config, self.topic, self.partitions)
        records = {
            p: [(f"deal-{p}{n}".encode(), b'{"price": 10}') for n in range(SMALL)]
            for p in range(self.partitions)
            if p != HOT_PARTITION
        }
        # Random bytes: a compressed batch would hide the size from nobody, but stay honest.
        records[HOT_PARTITION] = [(b"deal-42", os.urandom(LARGE_BYTES)) for _ in range(UPDATES)]
        return produce(config, self.topic, records)

    def misbehave(
        self, config: KafkaConfig, sink_url: str, ready: threading.Event, stop: threading.Event
    ) -> None:
        from lagless.scenarios.blocking_reader import BlockingRoundRobin

        consumer = member(
            config,
            self.group,
            "deal-reader",
            "roundrobin",
            **{"fetch.message.max.bytes": FETCH_BYTES},
        )
        reader = BlockingRoundRobin(consumer, wait_s=1.0, batch=1)
        try:
            consumer.subscribe([self.topic])
            turns = 0
            while not stop.is_set():
                for record in reader.read_next_partition():
                    if record.partition() == HOT_PARTITION:
                        time.sleep(0.2)  # parsing a large deal
                        turns += 1
                if turns >= 1:
                    ready.set()
        finally:
            consumer.close()
