"""The executor side: read exactly the offset ranges of a task with assign, as Arrow batches.

No consumer group is joined and nothing is committed, so a slow or finished range never
blocks another task and never triggers a rebalance (seeds 000, 002, 003).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from lagless.exceptions import DataLossError, TerminalError
from lagless.kafka.config import KafkaConfig
from lagless.planner.ranges import OffsetRange
from lagless.retry import DEFAULT_RETRY_S, away_error, stopped_waiting
from lagless.source.schema import (
    ARROW_SCHEMA,
    HEADER_TYPE,
    NO_TIMESTAMP_TYPE,
    TIMESTAMP_TYPE_BY_KIND,
)

CONSUME_BATCH = 10_000
# Bytes of records in one Arrow batch handed to Spark. With librdkafka's prefetch capped in
# KafkaConfig.reader(), this keeps a task's memory bounded whatever the record size: 10,000
# records of seed 002's 800 KB would otherwise be 8 GB in one batch.
MAX_BATCH_BYTES = 8 * 1024 * 1024
# Records asked for before any record's size is known.
FIRST_CONSUME = 16
# A task that gets no record logs it this often at least (the broker may be away).
WARN_EVERY_S = 10.0

Headers = list[tuple[str, bytes]]
log = logging.getLogger(__name__)

# A task reads its ranges in turn, the next range's consumer assigned while the current one
# drains: the first fetch at a range's offset, a round trip or two to a broker far away,
# happens in the background, and the task finds the next range's records waiting (12 ranges
# with responses delayed 100 ms: 2.44 -> 1.22 s). Two consumers: more would only prefetch
# further ahead.
READ_AHEAD = 2

# Idle consumers per configuration in this process. Spark reuses its Python workers between
# tasks, so a task borrows the consumers (and their broker connections) that the last task
# left, as Spark's own Kafka source keeps a consumer pool per executor.
_idle: dict[tuple[tuple[str, str], ...], list[Consumer]] = {}


@contextmanager
def pooled_consumers(config: KafkaConfig, count: int) -> Iterator[list[Consumer]]:
    """`count` reader consumers with nothing assigned; returned to the pool unless the task
    failed (or stopped half way: what they prefetched must not reach the next task)."""
    settings = config.reader()
    key = tuple(sorted((k, str(v)) for k, v in settings.items()))
    idle = _idle.setdefault(key, [])
    consumers = [idle.pop() if idle else Consumer(settings) for _ in range(count)]
    try:
        yield consumers
    except BaseException:
        for consumer in consumers:
            consumer.close()
        raise
    for consumer in consumers:
        consumer.unassign()
    idle = _idle.setdefault(key, [])
    idle.extend(consumers)
    while len(idle) > READ_AHEAD:
        idle.pop(0).close()


@atexit.register
def _close_idle() -> None:
    while _idle:
        for consumer in _idle.popitem()[1]:
            consumer.close()


def read_ranges(
    config: KafkaConfig,
    pieces: Sequence[OffsetRange],
    *,
    fail_on_data_loss: bool = True,
    poll_timeout_s: float = 60.0,
    retry_s: float = DEFAULT_RETRY_S,
    stop: threading.Event | None = None,
) -> Iterator[pa.RecordBatch]:
    """Read each piece in turn, the next one's consumer assigned ahead (READ_AHEAD). A piece
    that brings no record for poll_timeout_s (at most WARN_EVERY_S) is logged as a broker away,
    and waited for up to retry_s (librdkafka reconnects by itself): then a TransientError; or
    until `stop` is set: then Stopped (the batch fails whole, and is replayed by a rerun)."""
    pieces = [piece for piece in pieces if piece.start < piece.end]
    if not pieces:
        return
    with pooled_consumers(config, min(len(pieces), READ_AHEAD)) as consumers:
        _assign(consumers[0], pieces[0])
        for index, piece in enumerate(pieces):
            if index + 1 < len(pieces):
                _assign(consumers[(index + 1) % len(consumers)], pieces[index + 1])
            yield from _drain(
                consumers[index % len(consumers)],
                piece,
                fail_on_data_loss,
                _Patience(config.bootstrap, min(poll_timeout_s, WARN_EVERY_S), retry_s, stop),
            )


def _assign(consumer: Consumer, piece: OffsetRange) -> None:
    consumer.assign([TopicPartition(piece.topic, piece.partition, piece.start)])


class _Patience:
    """How long a task waits for a record: it logs a broker away every `warn_every_s`, and
    gives up when the retry budget is spent."""

    def __init__(
        self,
        bootstrap: str,
        warn_every_s: float,
        budget_s: float,
        stop: threading.Event | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.warn_every_s = warn_every_s
        self.budget_s = budget_s
        self.stop = stop
        self._progress_at = time.monotonic()
        self._warned = 0

    def progressed(self) -> None:
        if self._warned:
            log.info(
                "the broker at %s is back after %.0f s",
                self.bootstrap,
                time.monotonic() - self._progress_at,
            )
        self._progress_at = time.monotonic()
        self._warned = 0

    def check(self, piece: OffsetRange, position: int) -> None:
        waited = time.monotonic() - self._progress_at
        where = f"{piece.topic}[{piece.partition}] at offset {position} (range ends at {piece.end})"
        if self.stop is not None and self.stop.is_set():
            raise stopped_waiting(f"reading {where}")
        if waited > self.budget_s:
            log.error("no record from %s for %.0f s: giving up", where, waited)
            raise away_error(
                f"the broker at {self.bootstrap}",
                waited,
                self.budget_s,
                f"no record from {where}",
            )
        if waited > self.warn_every_s * (self._warned + 1):
            self._warned += 1
            log.warning(
                "no record from %s for %.0f s: the broker may be away; waiting up to %.0f s",
                where,
                waited,
                self.budget_s,
            )


def _drain(
    consumer: Consumer, piece: OffsetRange, fail_on_data_loss: bool, patience: _Patience
) -> Iterator[pa.RecordBatch]:
    position = piece.start
    per_call = FIRST_CONSUME
    while position < piece.end:
        messages = consumer.consume(min(per_call, piece.end - position), timeout=1.0)
        batch, events = _decode(messages, piece, position)
        if batch is not None:
            position = batch.column("offset")[-1].as_py() + 1
            patience.progressed()
            record_bytes = max(1, batch.nbytes // batch.num_rows)
            per_call = max(1, min(CONSUME_BATCH, MAX_BATCH_BYTES // record_bytes))
            yield batch
        last = messages[-1] if messages else None
        if (
            batch is None
            and last is not None
            and last.error() is None
            and _offset(last) >= piece.end
        ):
            return  # the range's last offsets carried no record (transaction markers, aborts)
        for event in events:
            if _concerns(event, piece):
                position = max(position, _after_event(consumer, event, piece, fail_on_data_loss))
        if batch is None:
            patience.check(piece, position)


def _concerns(event: Message, piece: OffsetRange) -> bool:
    """False for an event about a partition a pooled consumer was assigned before."""
    partition = event.partition()
    return partition is None or partition < 0 or (event.topic(), partition) == piece.key


# librdkafka reports a fetch below the log start as OFFSET_OUT_OF_RANGE, or, under
# auto.offset.reset=error (the reader's setting), as _AUTO_OFFSET_RESET.
_OFFSET_GONE = (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET)


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
    # auto.offset.reset=error (KafkaConfig.reader) reports a deleted offset as _AUTO_OFFSET_RESET.
    if err.code() in _OFFSET_GONE:
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
    log.warning(
        "%s: %s before lagless read them; skipped up to %d (failOnDataLoss=false)",
        where,
        what,
        resume_at,
    )
    return resume_at


def _offset(message: Message) -> int:
    return cast(int, message.offset())


def _decode(
    messages: list[Message], piece: OffsetRange, position: int
) -> tuple[pa.RecordBatch | None, list[Message]]:
    """The records from position to the range's end as one Arrow batch, and the error events
    beside them.

    One pass over the messages: this loop is lagless's per-record cost. A pooled consumer was
    assigned other partitions before; librdkafka drops what it fetched for them on assign, and
    the check on the first record makes that an error rather than a wrong row.
    """
    first = next((m for m in messages if m.error() is None), None)
    if first is not None and (first.topic(), first.partition()) != piece.key:
        raise TerminalError(
            f"reading {piece.topic}[{piece.partition}] returned a record of "
            f"{first.topic()}[{first.partition()}]"
        )
    end = piece.end
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
        if not position <= offset < end:
            continue
        records.append(m)
        offsets.append(offset)
        keys.append(m.key())
        values.append(m.value())
        kind, ms = m.timestamp()
        kinds.append(TIMESTAMP_TYPE_BY_KIND.get(kind, NO_TIMESTAMP_TYPE))
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
            _timestamps(millis, piece, offsets),
            pa.array(kinds, pa.int32()),
            _headers(records) if with_headers else pa.nulls(count, HEADER_TYPE),
        ],
        schema=ARROW_SCHEMA,
    )
    return batch, events


def _timestamps(millis: list[int], piece: OffsetRange, offsets: list[int]) -> pa.Array:
    """Milliseconds since the epoch as Spark's microsecond timestamps; a record whose timestamp
    overflows that (a producer that wrote nanoseconds) fails the task naming it, as Spark's
    KAFKA_MALFORMED_RECORD_TIMESTAMP does, rather than wrapping around to a wrong time."""
    try:
        micros = pc.multiply_checked(pa.array(millis, pa.int64()), 1000)
    except pa.ArrowInvalid:
        bad = next(i for i, ms in enumerate(millis) if abs(ms) > (2**63 - 1) // 1000)
        raise TerminalError(
            f"{piece.topic}[{piece.partition}] offset {offsets[bad]}: the record's timestamp "
            f"{millis[bad]} is not milliseconds since the epoch (too large for a timestamp)"
        ) from None
    return micros.cast(pa.timestamp("us", tz="UTC"))


def _headers(records: list[Message]) -> pa.Array:
    return pa.array(
        [
            [{"key": k, "value": v} for k, v in cast(Headers, h)] if h else None
            for h in (m.headers() for m in records)
        ],
        type=HEADER_TYPE,
    )
