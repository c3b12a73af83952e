"""Where the partitions' logs stand: their watermarks (one request for all) and the offsets of
a time (the broker's ListOffsets)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from lagless.kafka import TP, Offsets
from lagless.kafka.connection import KafkaConnection

# The kind of spec ListOffsets by time takes (confluent_kafka does not export its class).
_BY_TIME = type(OffsetSpec.for_timestamp(0))


class LogOffsets:
    def __init__(self, connection: KafkaConnection) -> None:
        self._connection = connection
        # The latest offset a reader can reach: under read_committed (librdkafka's default) the
        # last stable offset, so a batch never waits on an open transaction.
        self._isolation = (
            IsolationLevel.READ_COMMITTED
            if connection.config.read_committed
            else IsolationLevel.READ_UNCOMMITTED
        )

    def watermarks(self, partitions: Iterable[TP]) -> tuple[Offsets, Offsets]:
        """(low, high): the first offset still kept and the next offset to be written."""
        wanted = list(partitions)
        return self._list(wanted, OffsetSpec.earliest()), self._list(wanted, OffsetSpec.latest())

    def latest(self, partitions: Iterable[TP]) -> Offsets:
        return self._list(list(partitions), OffsetSpec.latest())

    def offsets_for_times(
        self, timestamps: Mapping[TP, int], high: Mapping[TP, int] | None = None
    ) -> dict[TP, int | None]:
        """The first offset of each partition whose record's timestamp is at or after the given
        milliseconds (the broker's ListOffsets by time), or None when every record is older.
        `high`: where each partition's log ends for the caller (a broker that cannot answer
        looks no further; this one does not need it)."""
        specs = {tp: OffsetSpec.for_timestamp(ms) for tp, ms in timestamps.items()}
        return {
            tp: offset if offset >= 0 else None for tp, offset in self._list_specs(specs).items()
        }

    def _list(self, partitions: list[TP], spec: OffsetSpec) -> Offsets:
        return self._list_specs({tp: spec for tp in partitions})

    def _list_specs(self, specs: Mapping[TP, OffsetSpec]) -> Offsets:
        if not specs:
            return {}
        request = {TopicPartition(t, p): spec for (t, p), spec in specs.items()}

        def listed() -> Offsets:
            futures = self._connection.admin.list_offsets(
                request, isolation_level=self._isolation, request_timeout=self._connection.timeout_s
            )
            found = {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}
            for tp, offset in found.items():
                # An earliest or latest offset is never negative: a broker that stops answering
                # mid-request can leave librdkafka's "invalid" (-1001) in the answer. Asked again,
                # as for any failure; only by time does -1 mean an answer ("no such record").
                if offset < 0 and not isinstance(specs[tp], _BY_TIME):
                    raise KafkaException(
                        KafkaError(
                            KafkaError.OFFSET_NOT_AVAILABLE,
                            f"no offset for {tp[0]}[{tp[1]}] in the broker's answer ({offset})",
                        )
                    )
            return found

        return self._connection.retried(listed, "listing offsets")
