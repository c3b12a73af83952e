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
        batch, events = _decode(messages, piece)
        if batch is not None:
            position = batch.column("offset")[-1].as_py() + 1
            last_progress = time.monotonic()
            yield batch
        for event in events:
            position = max(position, _after_event(consumer, event, piece, fail_on_data_loss))
        if batch is None and time.monotonic() - last_progress > poll_timeout_s:
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


def _decode(
    messages: list[Message], piece: OffsetRange
) -> tuple[pa.RecordBatch | None, list[Message]]:
    """The records inside the range as one Arrow batch, and the error events beside them.

    One pass over the messages: this loop is lagless's per-record cost.
    """
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    offsets: list[int] = []
    millis: list[int] = []
    kinds: list[int] = []
    records: list[Message] = []
    events: list[Message] = []
    with_headers = False
    for m in messages:
        if m.error() is not None:
            events.append(m)
            continue
        offset = _offset(m)
        if offset >= piece.end:
            continue
        records.append(m)
        offsets.append(offset)
        keys.append(m.key())
        values.append(m.value())
        kind, ms = m.timestamp()
        kinds.append(kind)
        millis.append(ms)
        with_headers = with_headers or m.headers() is not None
    count = len(offsets)
    if not count:
        return None, events
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array(keys, pa.binary()),
            pa.array(values, pa.binary()),
            pa.repeat(pa.scalar(piece.topic, pa.string()), count),
            pa.repeat(pa.scalar(piece.partition, pa.int32()), count),
            pa.array(offsets, pa.int64()),
            pc.multiply(pa.array(millis, pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC")),
            pa.array(kinds, pa.int32()),
            _headers(records) if with_headers else pa.nulls(count, HEADER_TYPE),
        ],
        schema=ARROW_SCHEMA,
    )
    return batch, events


def _headers(records: list[Message]) -> pa.Array:
    return pa.array(
        [
            [{"key": k, "value": v} for k, v in cast(Headers, h)] if h else None
            for h in (m.headers() for m in records)
        ],
        type=HEADER_TYPE,
    )
