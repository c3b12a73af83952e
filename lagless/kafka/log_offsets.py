"""Where the partitions' logs stand: their watermarks (one request for all) and the offsets of
a time (the broker's ListOffsets)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import OffsetSpec

from lagless.kafka import TP, Offsets
from lagless.kafka.connection import KafkaConnection, reason

# ListOffsets' timestamps that ask for the log's end and start.
OFFSET_LATEST_TIME = -1
OFFSET_EARLIEST_TIME = -2
# Partitions per ListOffsets in log_bounds (see there).
BOUNDS_SLICE = 500
# The kind of spec ListOffsets by time takes (confluent_kafka does not export its class).
_BY_TIME = type(OffsetSpec.for_timestamp(0))
# ListOffsets by time: no record at or after the time.
NO_SUCH_RECORD = -1


class LogOffsets:
    def __init__(self, connection: KafkaConnection) -> None:
        self._connection = connection
        self._consumer: Consumer | None = None
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

    def log_bounds(self, partitions: Iterable[TP]) -> tuple[Offsets, Offsets, dict[TP, str]]:
        """(log start, log end, failed) as a group's lag is measured against
        (kafka-consumer-groups' LOG-END-OFFSET): the end is the high watermark, whatever the
        client's isolation, so a consumer reading uncommitted records is never seen past the
        end while a transaction is open. Never retried (the lag tools sample again). A
        partition the broker did not answer for is in neither mapping but in `failed`, with
        the reason.

        Asked through a consumer's ListOffsets (offsets_for_times with Kafka's "latest" and
        "earliest" timestamps) in slices: the admin client's list_offsets makes a Python
        future per partition (2.7 s for 24,000 partitions here) and librdkafka's answer to
        one request grows as its square (24,000 partitions: 6.6 s in one request, 0.1 s in
        slices of 500)."""
        wanted = list(dict.fromkeys(partitions))
        failed: dict[TP, str] = {}
        bounds: list[Offsets] = []
        consumer = self._offsets_consumer()
        for spec in (OFFSET_EARLIEST_TIME, OFFSET_LATEST_TIME):
            found: Offsets = {}
            for start in range(0, len(wanted), BOUNDS_SLICE):
                part = wanted[start : start + BOUNDS_SLICE]
                try:
                    answered = consumer.offsets_for_times(
                        [TopicPartition(t, p, spec) for t, p in part],
                        timeout=self._connection.timeout_s,
                    )
                except KafkaException as exc:
                    failed.update(dict.fromkeys(part, reason(exc)))
                    continue
                for tp in answered:
                    key = (tp.topic, tp.partition)
                    if tp.error is not None:
                        failed[key] = tp.error.str()
                    elif tp.offset < 0:  # a broker that stops answering mid-request
                        failed[key] = f"no offset in the broker's answer ({tp.offset})"
                    else:
                        found[key] = tp.offset
            bounds.append(found)
        low, end = bounds
        for key in failed:
            low.pop(key, None)
            end.pop(key, None)
        return low, end, failed

    def _offsets_consumer(self) -> Consumer:
        """A consumer that only asks ListOffsets (never assigned, never a member), reading
        uncommitted: made at the first use, closed by close()."""
        if self._consumer is None:
            settings = {
                **self._connection.config.admin(),
                "group.id": "lagless-offsets",
                "enable.auto.commit": False,
                "isolation.level": "read_uncommitted",
            }
            self._consumer = Consumer(settings)
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

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
            tp: None if offset == NO_SUCH_RECORD else offset
            for tp, offset in self._list_specs(specs).items()
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
                # as for any failure; only by time does -1 mean an answer ("no such record"),
                # and only -1 (-1001 there too is no answer, not "every record is older").
                by_time = isinstance(specs[tp], _BY_TIME)
                if offset < 0 and not (by_time and offset == NO_SUCH_RECORD):
                    raise KafkaException(
                        KafkaError(
                            KafkaError.OFFSET_NOT_AVAILABLE,
                            f"no offset for {tp[0]}[{tp[1]}] in the broker's answer ({offset})",
                        )
                    )
            return found

        return self._connection.retried(listed, "listing offsets")
