"""The executor side: read exactly one offset range with assign + seek, as Arrow batches.

No consumer group is joined and nothing is committed, so a slow or finished range never
blocks another task and never triggers a rebalance (seeds 000, 002, 003).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from lagless.exceptions import DataLossError, TerminalError, TransientError
from lagless.kafka_config import KafkaConfig
from lagless.planner.ranges import OffsetRange
from lagless.source.schema import ARROW_SCHEMA, HEADER_TYPE

CONSUME_BATCH = 10_000

Headers = list[tuple[str, bytes]]


def read_range(
    config: KafkaConfig,
    piece: OffsetRange,
    *,
    fail_on_data_loss: bool = True,
    poll_timeout_s: float = 60.0,
) -> Iterator[pa.RecordBatch]:
    if piece.start >= piece.end:
        return
    consumer = Consumer(config.reader())
    try:
        consumer.assign([TopicPartition(piece.topic, piece.partition, piece.start)])
        yield from _drain(consumer, piece, fail_on_data_loss, poll_timeout_s)
    finally:
        consumer.close()


def _drain(
    consumer: Consumer, piece: OffsetRange, fail_on_data_loss: bool, poll_timeout_s: float
) -> Iterator[pa.RecordBatch]:
    position = piece.start
    last_progress = time.monotonic()
    while position < piece.end:
        messages = consumer.consume(min(CONSUME_BATCH, piece.end - position), timeout=1.0)
        records = [m for m in messages if m.error() is None]
        if records and _offset(records[-1]) >= piece.end:
            records = [m for m in records if _offset(m) < piece.end]
        if records:
            position = _offset(records[-1]) + 1
            last_progress = time.monotonic()
            yield _to_arrow(records, piece.topic, piece.partition)
        for event in messages:
            if event.error() is not None:
                position = max(position, _after_event(consumer, event, piece, fail_on_data_loss))
        if not records and time.monotonic() - last_progress > poll_timeout_s:
            raise TransientError(
                f"no record from {piece.topic}[{piece.partition}] at offset {position} "
                f"for {poll_timeout_s:.0f} s (range ends at {piece.end})"
            )


def _after_event(
    consumer: Consumer, event: Message, piece: OffsetRange, fail_on_data_loss: bool
) -> int:
    """The read position an end-of-log or offset error implies."""
    err = cast(KafkaError, event.error())
    where = f"{piece.topic}[{piece.partition}]"
    if err.code() == KafkaError._PARTITION_EOF:
        end_of_log = _offset(event)
        if end_of_log >= piece.end:
            # Offsets below the end of the log that carried no record (transaction markers,
            # compaction) are absent, not lost.
            return piece.end
        return _lost(where, f"the log now ends at {end_of_log}", fail_on_data_loss, piece.end)
    if err.code() == KafkaError.OFFSET_OUT_OF_RANGE:
        tp = TopicPartition(piece.topic, piece.partition)
        low, _ = consumer.get_watermark_offsets(tp, timeout=10)
        resume = min(max(low, piece.start), piece.end)
        _lost(where, f"offsets before {low} were deleted", fail_on_data_loss, resume)
        if resume < piece.end:
            consumer.assign([TopicPartition(piece.topic, piece.partition, resume)])
        return resume
    if err.fatal():
        raise TerminalError(f"reading {where}: {err.str()}")
    return 0


def _lost(where: str, what: str, fail_on_data_loss: bool, resume_at: int) -> int:
    if fail_on_data_loss:
        raise DataLossError(
            f"{where}: {what} before lagless read them; "
            "rerun with failOnDataLoss=false to skip what is gone"
        )
    return resume_at


def _offset(message: Message) -> int:
    return cast(int, message.offset())


def _to_arrow(records: list[Message], topic: str, partition: int) -> pa.RecordBatch:
    """One pass over the messages: this loop is lagless's per-record cost."""
    count = len(records)
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    offsets: list[int | None] = []
    millis: list[int] = []
    kinds: list[int] = []
    with_headers = False
    for m in records:
        keys.append(m.key())
        values.append(m.value())
        offsets.append(m.offset())
        kind, ms = m.timestamp()
        kinds.append(kind)
        millis.append(ms)
        with_headers = with_headers or m.headers() is not None
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.repeat(pa.scalar(topic, pa.string()), count),
            pa.repeat(pa.scalar(partition, pa.int32()), count),
            pa.array(offsets, pa.int64()),
            pc.multiply(pa.array(millis, pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC")),
            pa.array(kinds, pa.int32()),
            _headers(records) if with_headers else pa.nulls(count, HEADER_TYPE),
        ],
        schema=ARROW_SCHEMA,
    )


def _headers(records: list[Message]) -> pa.Array:
    return pa.array(
        [
            [{"key": k, "value": v} for k, v in cast(Headers, h)] if h else None
            for h in (m.headers() for m in records)
        ],
        type=HEADER_TYPE,
    )
