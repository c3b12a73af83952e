"""Real consumer groups for the doctor's membership tests: confluent_kafka consumers that
subscribe, kept alive by a thread that polls them (a member that is not polled leaves, or
holds a rebalance up), and that commit only what the test tells them to."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

SETTLE_TIMEOUT_S = 20.0


def create_topic(bootstrap: str, topic: str, partitions: int, records_each: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(10)
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in range(partitions):
        for number in range(records_each):
            producer.produce(topic, f"{topic}-{number}".encode(), partition=partition)
    producer.flush(10)


class LiveGroup:
    """Members of one group on one topic. One thread polls them all and is the only one to use
    them while they are members (a consumer used from two threads at once can hang): the test
    asks it to commit, and reads back what the broker holds with a client of its own."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.topic = topic
        self.members: list[Consumer] = []
        self._held: dict[int, list[int]] = {}
        self._commits: list[tuple[Consumer, list[TopicPartition]]] = []
        self._lock = threading.Lock()
        self._polling = threading.Event()
        self._stop = threading.Event()
        # Reads committed offsets without joining: never a member, so never polled.
        self._reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        self._thread = threading.Thread(target=self._poll_all, name=f"poll-{group}", daemon=True)
        self._thread.start()

    def join(self, assignor: str, instance_id: str | None = None) -> Consumer:
        config = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "partition.assignment.strategy": assignor,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            # Short, so a member that leaves is noticed within the test, and rebalances end.
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 300,
        }
        if instance_id:
            config["group.instance.id"] = instance_id
        consumer = Consumer(config)
        consumer.subscribe([self.topic])
        with self._lock:
            self.members.append(consumer)
        return consumer

    def leave(self, consumer: Consumer) -> None:
        with self._lock:
            self.members.remove(consumer)
        consumer.close()

    def _poll_all(self) -> None:
        while not self._stop.is_set():
            if not self._polling.wait(0.05):
                continue
            with self._lock:
                for consumer, offsets in self._commits:
                    consumer.commit(offsets=offsets, asynchronous=True)
                self._commits.clear()
                for consumer in self.members:
                    consumer.poll(0.02)  # records are read and dropped: nothing is committed
                    self._held[id(consumer)] = sorted(tp.partition for tp in consumer.assignment())

    def start_polling(self) -> None:
        self._polling.set()

    def stop_polling(self) -> None:
        """Members stop answering rebalances (their heartbeats go on: they stay members)."""
        self._polling.clear()
        with self._lock:  # the round in progress is over once the lock is free
            pass

    def settle(self, partitions: int) -> list[list[int]]:
        """Poll until the broker says the group is stable with every member in it and every
        partition held, and the members agree; each member's partitions, in join order."""
        self.start_polling()
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        held: list[list[int]] = []
        while time.monotonic() < deadline:
            with self._lock:
                held = [self._held.get(id(c), []) for c in self.members]
                count = len(self.members)
            found = admin.describe_consumer_groups([self.group])[self.group].result(5)
            on_broker = sorted(
                sorted(tp.partition for tp in m.assignment.topic_partitions) for m in found.members
            )
            if (
                found.state.name == "STABLE"
                and len(found.members) == count
                and sum(len(h) for h in held) == partitions
                and on_broker == sorted(held)
            ):
                return held
            time.sleep(0.05)
        raise AssertionError(f"group {self.group} did not settle: {held}")

    def commit(self, consumer: Consumer, offsets: dict[int, int]) -> None:
        """The member commits offsets of partitions it holds (in the polling thread), until the
        broker has them: one that meets a rebalance still settling is refused, so it is sent
        again."""
        wanted = [TopicPartition(self.topic, p, o) for p, o in offsets.items()]
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while time.monotonic() < deadline:
            with self._lock:
                self._commits.append((consumer, wanted))
            time.sleep(0.1)
            try:
                found = self._reader.committed(
                    [TopicPartition(self.topic, p) for p in offsets], timeout=2
                )
            except KafkaException:
                continue
            if {tp.partition: tp.offset for tp in found} == offsets:
                return
        raise AssertionError(f"group {self.group} did not commit {offsets}")

    def close(self) -> None:
        self._stop.set()
        self._polling.set()
        self._thread.join()
        for consumer in self.members:
            consumer.close()
        self.members.clear()
        self._reader.close()


@contextmanager
def live_group(bootstrap: str, group: str, topic: str) -> Iterator[LiveGroup]:
    running = LiveGroup(bootstrap, group, topic)
    try:
        yield running
    finally:
        running.close()


def kinds(findings: Sequence[dict[str, str]]) -> list[str]:
    return [finding["kind"] for finding in findings]
