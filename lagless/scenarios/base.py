"""What a scenario is: a topic, records, and a misbehaving consumer group driven from one
thread (a consumer used from two threads at once can hang a commit), reproducing a field
report on a live broker for the doctor to diagnose."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping

from confluent_kafka import Consumer, Message, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from lagless.kafka.config import KafkaConfig
from lagless.lag.doctor import DEFAULT_FETCH_BYTES, Finding

GROUP = "field-report"
TOPIC = "events"


class Scenario(ABC):
    name: str
    title: str
    """One line: the report's failure as the newcomer sees it."""
    cure: str
    """One line: why `lagless import` does not have that problem."""
    partitions: int
    fetch_bytes: int = DEFAULT_FETCH_BYTES
    """The consumers' fetch size per partition, told to the doctor."""
    topic = TOPIC
    group = GROUP
    # Set by run.py once the doctor holds its first sample: a failure that shows as a change
    # between two samples (001's rewind) waits for it, however slow the doctor was to start.
    watching: threading.Event

    @abstractmethod
    def produce(self, config: KafkaConfig) -> int:
        """Writes the backlog; the number of records."""

    @abstractmethod
    def misbehave(
        self, config: KafkaConfig, sink_url: str, ready: threading.Event, stop: threading.Event
    ) -> None:
        """Runs the group in this thread only: sets `ready` once the failure shows, keeps the
        group going (the doctor watches it) until `stop`, then closes every member. sink_url:
        the table the cure imports into (004's consumer writes there first)."""

    def broker_findings(self, config: KafkaConfig, sink_url: str) -> list[Finding]:
        """What the demo can add to the doctor's findings from outside the group (004)."""
        return []


def create_topic(config: KafkaConfig, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": config.bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(10)


def produce(
    config: KafkaConfig, topic: str, records: Mapping[int, list[tuple[bytes, bytes]]]
) -> int:
    """Each partition's (key, value) records, in order; how many."""
    producer = Producer({**{"bootstrap.servers": config.bootstrap}, "linger.ms": 5})
    count = 0
    for partition, items in records.items():
        for key, value in items:
            producer.produce(topic, value, key, partition=partition)
            producer.poll(0)
            count += 1
    producer.flush(30)
    return count


def numbered(partitions: int, count: int) -> dict[int, list[tuple[bytes, bytes]]]:
    """`count` plain records per partition, keyed k0, k1, ...: a backlog for a group to lag on."""
    return {
        p: [(f"k{n}".encode(), f"record {n}".encode()) for n in range(count)]
        for p in range(partitions)
    }


class NumberedBacklog(Scenario):
    """A scenario whose backlog is `records` numbered records on each partition."""

    records: int

    def produce(self, config: KafkaConfig) -> int:
        create_topic(config, self.topic, self.partitions)
        return produce(config, self.topic, numbered(self.partitions, self.records))


def member(
    config: KafkaConfig, group: str, client_id: str, assignor: str, **extra: object
) -> Consumer:
    """A consumer of the group that commits only when told to."""
    settings: dict[str, object] = {
        **{"bootstrap.servers": config.bootstrap},
        "group.id": group,
        "client.id": client_id,
        "partition.assignment.strategy": assignor,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        # Short, so a member that leaves is noticed and a rebalance ends within the demo.
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 300,
        **extra,
    }
    return Consumer(settings)


def coordinates(record: Message) -> tuple[str, int, int]:
    """A record's topic, partition and offset: set on every record a consumer hands over."""
    return str(record.topic()), int(record.partition() or 0), int(record.offset() or 0)
