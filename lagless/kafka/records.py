"""A few records read at given offsets: when they were written and how big they are (the
planner's bytes per record, the lag's time behind)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from confluent_kafka import Consumer, TopicPartition

from lagless.kafka import TP
from lagless.kafka.config import KafkaConfig


@dataclass(frozen=True)
class RecordInfo:
    """A record as the driver needs it: when it was written, how big it is, and its value (a
    routed import's table may be named by it: importer/routing.py); where it is and its key,
    which tell a recreated topic's record from the one a table holds."""

    timestamp_s: float | None
    size_bytes: int
    value: bytes | None = None
    offset: int = -1
    timestamp_ms: int | None = None
    key: bytes | None = None


# A few records of each partition, all partitions in one fetch: with the reader's 1 MiB per
# partition, a fetch of 24 partitions filled 8 MiB from 8 of them and the rest waited for the
# next (Tansu: 3.2 s to sample 24 partitions, 0.6 s with this). A larger record still comes
# whole: a broker returns a partition's first record batch whatever this limit (KIP-74).
FEW_RECORDS = {"max.partition.fetch.bytes": 4096}
# The whole fetch may be larger than a range reader's (KafkaConfig.reader): it is for every
# partition at once, and a broker that ignores the partition's bound (Tansu) fills it from the
# first partitions (24 sampled there: 1.6 s with the reader's 1 MiB, 0.5 s with this).
FEW_RECORDS_FETCH_BYTES = 8 * 1024 * 1024


class Records:
    def __init__(self, config: KafkaConfig) -> None:
        self._config = config

    def at(
        self,
        starts: Mapping[TP, int],
        counts: Mapping[TP, int] | None = None,
        timeout_s: float = 3.0,
    ) -> dict[TP, list[RecordInfo]]:
        """The records of each partition from its start offset, `counts` of them (default one).
        A partition whose records do not arrive within timeout_s (none there, or deleted) has
        fewer or none."""
        seen: dict[TP, list[RecordInfo]] = {tp: [] for tp in starts}
        wanted = {tp: (counts or {}).get(tp, 1) for tp in starts}
        starts = {tp: offset for tp, offset in starts.items() if wanted[tp] > 0}
        if not starts:
            return seen
        settings = {**self._config.reader(), **FEW_RECORDS}
        settings["fetch.max.bytes"] = max(
            FEW_RECORDS_FETCH_BYTES, int(str(settings["fetch.max.bytes"]))
        )
        consumer = Consumer(settings)
        try:
            consumer.assign([TopicPartition(t, p, o) for (t, p), o in starts.items()])
            deadline = time.monotonic() + timeout_s
            pending = set(starts)
            while pending and time.monotonic() < deadline:
                for message in consumer.consume(1000, timeout=0.2):
                    tp = (cast(str, message.topic()), cast(int, message.partition()))
                    if message.error() is not None or tp not in pending:
                        continue
                    kind, millis = message.timestamp()
                    key = message.key()
                    seen[tp].append(
                        RecordInfo(
                            timestamp_s=millis / 1000 if kind and millis > 0 else None,
                            size_bytes=len(message.value() or b"") + len(key or b""),
                            value=message.value(),
                            offset=cast(int, message.offset()),
                            timestamp_ms=millis if kind else None,
                            key=bytes(key) if key is not None else None,
                        )
                    )
                    if len(seen[tp]) == wanted[tp]:
                        pending.discard(tp)
                        consumer.pause([TopicPartition(*tp)])
        finally:
            consumer.close()
        return seen
