"""A consumer group's committed offsets, read and committed without joining the group (the
importer's `--group`). The lag tools read many groups' at once through ClusterInfo.groups."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import OFFSET_INVALID, Consumer, TopicPartition

from lagless.kafka import TP
from lagless.kafka.connection import KafkaConnection

# The metadata lagless import commits its --group's offsets with (Kafka keeps a short string
# beside each committed offset; kafka-consumer-groups does not show it).
COMMITTED_BY_LAGLESS = "lagless import"


class GroupOffsets:
    def __init__(self, connection: KafkaConnection) -> None:
        self._connection = connection
        self._clients: dict[str, Consumer] = {}

    def committed(self, group: str, partitions: Iterable[TP]) -> dict[TP, int | None]:
        """`group`'s committed offset of each partition (None: never committed)."""
        wanted = [TopicPartition(t, p) for t, p in partitions]
        if not wanted:
            return {}
        found = self._connection.retried(
            lambda: self._client(group).committed(wanted, timeout=self._connection.timeout_s),
            f"reading the offsets of group {group!r}",
        )
        return {
            (tp.topic, tp.partition): None
            if tp.offset == OFFSET_INVALID or tp.offset < 0
            else tp.offset
            for tp in found
        }

    def commit(self, group: str, offsets: Mapping[TP, int]) -> None:
        """Commit `offsets` for `group` as they are (whether they move it forward is the
        caller's rule), each marked COMMITTED_BY_LAGLESS in its metadata: the lag tools then
        know the group is an import's, not consumers'."""
        if not offsets:
            return
        self._connection.retried(
            lambda: self._client(group).commit(
                offsets=[
                    TopicPartition(t, p, o, metadata=COMMITTED_BY_LAGLESS)
                    for (t, p), o in offsets.items()
                ],
                asynchronous=False,
            ),
            f"committing offsets of group {group!r}",
        )

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()

    def _client(self, group: str) -> Consumer:
        if group not in self._clients:
            self._clients[group] = Consumer(self._connection.config.group_committer(group))
        return self._clients[group]
