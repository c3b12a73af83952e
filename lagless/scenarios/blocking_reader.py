"""The reader of reports 000 and 002: a consumer that reads its partitions one at a time, in
turn, and waits on each until records come or its timeout passes — so a drained partition, or
one whose next record is too large for a fetch, holds up all its others."""

from __future__ import annotations

from confluent_kafka import Consumer, Message, TopicPartition

from lagless.scenarios.base import coordinates


class BlockingRoundRobin:
    def __init__(self, consumer: Consumer, wait_s: float, batch: int) -> None:
        self.consumer = consumer
        self.wait_s = wait_s
        self.batch = batch
        self._turn = 0

    def read_next_partition(self) -> list[Message]:
        """Reads the next of the consumer's partitions (pausing the others); commits what it
        read. Blocks up to wait_s when that partition has nothing to give."""
        held = sorted(self.consumer.assignment(), key=lambda tp: (tp.topic, tp.partition))
        if not held:
            self.consumer.poll(0.05)  # joins the group, keeps it alive
            return []
        current = held[self._turn % len(held)]
        self._turn += 1
        others = [tp for tp in held if tp.partition != current.partition]
        if others:
            self.consumer.pause(others)
        self.consumer.resume([current])
        records = [m for m in self.consumer.consume(self.batch, self.wait_s) if m.error() is None]
        if records:
            last: dict[tuple[str, int], int] = {}
            for m in records:
                topic, partition, offset = coordinates(m)
                last[(topic, partition)] = offset + 1
            self.consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in last.items()],
                asynchronous=False,
            )
        return records
