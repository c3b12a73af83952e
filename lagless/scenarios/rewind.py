"""Report 001, the out-of-order commit: a consumer slow on a record loses its partition in a
rebalance, its successor reads ahead and commits, then the first one — still a member, of the
current generation — commits the partition it no longer owns: the committed offset goes back."""

from __future__ import annotations

import threading
import time

from confluent_kafka import TopicPartition

from lagless.kafka.config import KafkaConfig
from lagless.scenarios.base import NumberedBacklog, coordinates, member

RECORDS = 30
SLOW_PARTITION = 1
# The slow consumer finishes its record this long after the doctor's first sample (its
# successor has committed by then): within the doctor's watch, so the doctor sees the offset
# before and after. Counted from `ready`, a doctor slow to start under load (CI) could take
# its first sample after the rewind and see none.
LATE_COMMIT_S = 3.0


class Rewind(NumberedBacklog):
    name = "001"
    title = (
        "consumer-a is slow on a record of partition 1, consumer-b joins and takes partition 1 "
        "over, reads it to the end and commits; then consumer-a commits its old record"
    )
    cure = "lagless import commits offsets only with the rows they cover, in the sink's ledger"
    partitions = 2
    records = RECORDS

    def misbehave(
        self, config: KafkaConfig, sink_url: str, ready: threading.Event, stop: threading.Event
    ) -> None:
        # roundrobin orders members by id (client.id first): a keeps partition 0, b gets 1.
        a = member(config, self.group, "consumer-a", "roundrobin")
        b = None
        try:
            a.subscribe([self.topic])
            in_hand = None  # the record of partition 1 consumer-a is slow on
            other_done = False  # a reads the other partition to its end, committing it
            while not (in_hand is not None and other_done) and not stop.is_set():
                for m in a.consume(10, 0.2):
                    if m.error() is not None:
                        continue
                    if m.partition() != SLOW_PARTITION:
                        a.commit(message=m, asynchronous=False)
                        other_done = coordinates(m)[2] + 1 >= RECORDS
                    elif in_hand is None:
                        in_hand = coordinates(m)[2]
            b = member(config, self.group, "consumer-b", "roundrobin")
            b.subscribe([self.topic])
            b_done = False
            late_at = None
            while not stop.is_set():
                a.poll(0.05)  # a stays in the group, its record still in hand
                for m in b.consume(50, 0.05):
                    if m.error() is None and m.partition() == SLOW_PARTITION:
                        b.commit(message=m, asynchronous=False)
                        b_done = coordinates(m)[2] + 1 >= RECORDS
                if b_done:
                    ready.set()
                if b_done and late_at is None and self.watching.is_set():
                    late_at = time.monotonic() + LATE_COMMIT_S
                if late_at is not None and in_hand is not None and time.monotonic() >= late_at:
                    # A commit of a member of the current generation: the coordinator takes it.
                    a.commit(
                        offsets=[TopicPartition(self.topic, SLOW_PARTITION, in_hand + 1)],
                        asynchronous=False,
                    )
                    late_at = float("inf")
        finally:
            a.close()
            if b is not None:
                b.close()
