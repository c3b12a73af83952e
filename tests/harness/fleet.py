"""A fleet of consumer groups with commits, made fast on a real broker (noida-db): topics, a
few records in each partition, and each group's committed offsets through the admin client
(all groups in flight at once). For tests/integration/test_serve_fleet.py and bench/fleet.py."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Fleet:
    records: int
    """Records in each partition: every partition's end offset."""
    committed: dict[str, dict[tuple[str, int], int]]
    """Each group's committed offset of each partition it reads."""

    @property
    def groups(self) -> list[str]:
        return sorted(self.committed)

    def lag(self, group: str) -> int:
        return sum(self.records - offset for offset in self.committed[group].values())


def make_fleet(
    bootstrap: str,
    prefix: str,
    groups: int,
    partitions: int,
    groups_per_topic: int = 1,
    records: int = 4,
) -> Fleet:
    """`groups` groups named {prefix}-g00000..., each reading all `partitions` partitions of
    one topic shared by `groups_per_topic` groups; group j commits (j + p) % (records + 1) on
    partition p, so some partitions are caught up and others lag by up to `records`."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topics = [f"{prefix}-t{i:05d}" for i in range(-(-groups // groups_per_topic))]
    for start in range(0, len(topics), 500):
        created = admin.create_topics(
            [NewTopic(topic, partitions, 1) for topic in topics[start : start + 500]]
        )
        for future in created.values():
            future.result(TIMEOUT_S)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 100})
    for topic in topics:
        for partition in range(partitions):
            for number in range(records):
                while True:
                    try:
                        producer.produce(topic, f"{number}".encode(), partition=partition)
                        break
                    except BufferError:
                        producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(TIMEOUT_S) == 0, "records not delivered"
    committed = {
        f"{prefix}-g{j:05d}": {
            (topics[j // groups_per_topic], p): (j + p) % (records + 1) for p in range(partitions)
        }
        for j in range(groups)
    }
    futures = [
        admin.alter_consumer_group_offsets(
            [
                ConsumerGroupTopicPartitions(
                    group, [TopicPartition(t, p, offset) for (t, p), offset in offsets.items()]
                )
            ]
        )[group]
        for group, offsets in committed.items()
    ]
    for future in futures:
        future.result(TIMEOUT_S)
    return Fleet(records, committed)
