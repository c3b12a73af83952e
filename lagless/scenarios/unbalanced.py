"""Report 000, the unbalanced import: fewer consumers than partitions, some partitions already
drained, and consumers that block on a drained partition while their other one lags."""

from __future__ import annotations

import threading
import time

from lagless.kafka.config import KafkaConfig
from lagless.kafka.offset_reader import OffsetReader
from lagless.scenarios.base import Scenario, create_topic, member, produce
from lagless.scenarios.blocking_reader import BlockingRoundRobin

RECORDS = 200
DRAINED = (4, 5)
CONSUMERS = 3
WAIT_S = 1.0


class Unbalanced(Scenario):
    name = "000"
    title = (
        f"{CONSUMERS} consumers (round-robin) for 6 partitions, partitions 4 and 5 drained by an "
        f"earlier run: the consumers holding them wait {WAIT_S:g} s on them at every turn"
    )
    cure = "lagless import plans by records, not by partitions: no task waits on a drained one"
    partitions = 6

    def produce(self, config: KafkaConfig) -> int:
        create_topic(config, self.topic, self.partitions)
        value = b"statement " * 20
        records = {
            p: [(f"doc-{p}-{n}".encode(), value) for n in range(RECORDS)]
            for p in range(self.partitions)
        }
        count = produce(config, self.topic, records)
        # An earlier run of the group read partitions 4 and 5 to their end.
        with OffsetReader(config) as reader:
            reader.groups.commit(self.group, {(self.topic, p): RECORDS for p in DRAINED})
        return count

    def misbehave(
        self, config: KafkaConfig, sink_url: str, ready: threading.Event, stop: threading.Event
    ) -> None:
        consumers = [
            member(config, self.group, f"importer-{n}", "roundrobin") for n in range(CONSUMERS)
        ]
        readers = [BlockingRoundRobin(c, WAIT_S, batch=5) for c in consumers]
        try:
            for consumer in consumers:
                consumer.subscribe([self.topic])
            while not stop.is_set():
                for reader in readers:
                    for _record in reader.read_next_partition():
                        time.sleep(0.005)  # processing, one record at a time
                held = sum(len(c.assignment()) for c in consumers)
                if held == self.partitions and all(c.assignment() for c in consumers):
                    ready.set()
        finally:
            for consumer in consumers:
                consumer.close()
