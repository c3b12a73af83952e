"""Options of the lagless Kafka source, parsed once from Spark's string map.

The Kafka options have the names and the meaning of Spark's own Kafka source, as its
"Structured Streaming + Kafka Integration Guide" describes them
(https://spark.apache.org/docs/latest/streaming/structured-streaming-kafka-integration.html):
names match case-insensitively, and an option the source does not know is refused rather
than ignored, so a typo cannot silently change what is imported. lagless's own options
(maxRecordsPerBatch, maxBytesPerBatch, slots, minTaskRecords, pollTimeoutMs, ...) keep their
names. Every name is a constant below; KNOWN lists them all.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, overload

from lagless.exceptions import BadInput
from lagless.kafka.config import KafkaConfig
from lagless.retry import DEFAULT_RETRY_S
from lagless.secret import Secret
from lagless.source.json_values import decodable

EARLIEST = -2
LATEST = -1

# --- Spark's Kafka source options (Structured Streaming + Kafka Integration Guide) ---------
# Exactly one of the three: a comma-separated topic list, a Java-style regex of topic names,
# or JSON {"topicA": [0, 1], "topicB": [2, 4]} of specific partitions.
SUBSCRIBE = "subscribe"
SUBSCRIBE_PATTERN = "subscribePattern"
ASSIGN = "assign"
# "earliest", "latest" (streams only) or JSON {"topicA": {"0": 23, "1": -2}}, -2 = earliest,
# -1 = latest, naming every partition the query reads; a topic may be given whole:
# {"topicA": "earliest", "topicB": {"0": 23}}. Default: "latest" for streams, "earliest" for
# batch queries, as in Spark.
STARTING_OFFSETS = "startingOffsets"
# Batch queries only: "latest" or JSON {"topicA": {"0": 50, "1": -1}} (-1 = latest).
ENDING_OFFSETS = "endingOffsets"
# Milliseconds since the epoch, for every partition; the start is the first offset whose
# timestamp is at or after it (the broker's ListOffsets by time). Takes precedence over
# startingOffsetsByTimestamp, which takes precedence over startingOffsets.
STARTING_TIMESTAMP = "startingTimestamp"
# JSON {"topicA": {"0": 1000, "1": 1000}}: a timestamp per partition.
STARTING_OFFSETS_BY_TIMESTAMP = "startingOffsetsByTimestamp"
# What a starting timestamp after the partition's last record means: "latest" (lagless's
# default: the end offset, nothing before it is read) or "error" (Spark's default: the query
# fails).
STARTING_OFFSETS_BY_TIMESTAMP_STRATEGY = "startingOffsetsByTimestampStrategy"
# Batch queries only, like endingOffsets; a timestamp after the last record means the latest
# offset, as in Spark.
ENDING_TIMESTAMP = "endingTimestamp"
ENDING_OFFSETS_BY_TIMESTAMP = "endingOffsetsByTimestamp"
# Streams only: at most this many offsets per micro-batch, shared over the partitions in
# proportion to their backlog as Spark shares it (a partition's share rounded down, one
# offset for a partition whose share is below one), before lagless's own maxRecordsPerBatch
# and maxBytesPerBatch apply.
MAX_OFFSETS_PER_TRIGGER = "maxOffsetsPerTrigger"
# Streams only: a micro-batch waits until this many records are available, or until
# maxTriggerDelay (default 15m; a number with a unit: ms, s, m, h, d) has passed since the
# last one. Not applied under the availableNow trigger (a bulk import), as in Spark.
MIN_OFFSETS_PER_TRIGGER = "minOffsetsPerTrigger"
MAX_TRIGGER_DELAY = "maxTriggerDelay"
# At least this many Spark tasks per batch (long ranges are split further), when the batch
# holds as many records.
MIN_PARTITIONS = "minPartitions"
# No task reads more than this many records.
MAX_RECORDS_PER_PARTITION = "maxRecordsPerPartition"
# Whether the headers column holds the records' headers; false (Spark's default) gives nulls.
# The column is in the schema either way, as in Spark.
INCLUDE_HEADERS = "includeHeaders"
# Whether offsets deleted before they were read fail the query (default true).
FAIL_ON_DATA_LOSS = "failOnDataLoss"
# Spark's name for how long a task waits for a record; lagless's pollTimeoutMs is the same.
KAFKA_CONSUMER_POLL_TIMEOUT_MS = "kafkaConsumer.pollTimeoutMs"
# kafka.<librdkafka setting>: passed to every client (kafka.bootstrap.servers is required).
KAFKA_PREFIX = "kafka."
# Accepted for Spark's jobs, with no effect: lagless's readers join no consumer group, so
# there is no generated group id to prefix; offset requests retry on lagless's own budget
# rather than a count of retries.
GROUP_ID_PREFIX = "groupIdPrefix"
FETCH_OFFSET_NUM_RETRIES = "fetchOffset.numRetries"
FETCH_OFFSET_RETRY_INTERVAL_MS = "fetchOffset.retryIntervalMs"

# --- lagless's own options -----------------------------------------------------------------
MAX_RECORDS_PER_BATCH = "maxRecordsPerBatch"
MAX_BYTES_PER_BATCH = "maxBytesPerBatch"
# The first micro-batch a query plans reads at most this many bytes, so its rows land seconds
# after the start instead of after a whole large batch; the batches after it use the limit.
FIRST_BATCH_MAX_BYTES = "firstBatchMaxBytes"
SLOTS = "slots"
MIN_TASK_RECORDS = "minTaskRecords"
MIN_TASK_BYTES = "minTaskBytes"
POLL_TIMEOUT_MS = "pollTimeoutMs"
# Seconds a broker that is away (unreachable, hung, restarting) is waited for, by the planning
# on the driver and by each task reading its ranges, before the query fails with a
# TransientError (lagless import --retry-seconds; lagless/retry.py).
RETRY_SECONDS = "retrySeconds"
EXECUTOR_WRITER = "executorWriter"
EXECUTOR_WRITER_CONFIG = "executorWriterConfig"
# The writer's secret (a store's password): Spark redacts options named like "secret".
EXECUTOR_WRITER_SECRET = "executorWriterSecret"
# true: every task reads pieces of one topic only (a routed import's tasks each write into the
# one table their topic is routed to: executor_write.routed).
ONE_TOPIC_PER_TASK = "oneTopicPerTask"
# Streams under the availableNow trigger only (lagless import --ending-timestamp): stop at the
# offsets of this time (as endingTimestamp would) instead of at the latest offsets.
AVAILABLE_NOW_ENDING_TIMESTAMP = "availableNowEndingTimestamp"
# JSON {"topic": {"0": 42}}: the store already holds every offset below these (its ledger, as
# lagless import reads it at the start), so no batch reads them, whatever the checkpoint says.
HELD_OFFSETS = "heldOffsets"
# JSON {"topic": {"0": 104}}: bytes per record of these partitions, measured by lagless import
# while Spark started (importer/job.py), so planning the first batch does not read them again
# (on a broker slow to answer a fetch at a new offset, that read took seconds).
BYTES_PER_RECORD = "bytesPerRecord"
# A Spark schema (StructType JSON): the tasks add the values decoded into it as a column
# (json_values.py), where that gives what from_json would (lagless import's typed JSON).
DECODE_JSON_VALUES = "decodeJsonValues"
# Avro values decoded by the tasks for their executorWriter (avro_values.AvroValues.option()).
DECODE_AVRO_VALUES = "decodeAvroValues"
# Where the source's planning and tasks log (logs.settings()), when Spark's Python workers do
# not inherit the import's environment: a Spark Connect server's (importer/connect_writer.py).
LOG_TO = "logTo"
# A file whose appearance asks the query to stop (lagless import's signals.StopFile): the
# planning's and the tasks' waits for a broker that is away end then (retry.py).
STOP_FILE = "stopFile"

KNOWN = (
    SUBSCRIBE,
    SUBSCRIBE_PATTERN,
    ASSIGN,
    STARTING_OFFSETS,
    ENDING_OFFSETS,
    STARTING_TIMESTAMP,
    STARTING_OFFSETS_BY_TIMESTAMP,
    STARTING_OFFSETS_BY_TIMESTAMP_STRATEGY,
    ENDING_TIMESTAMP,
    ENDING_OFFSETS_BY_TIMESTAMP,
    MAX_OFFSETS_PER_TRIGGER,
    MIN_OFFSETS_PER_TRIGGER,
    MAX_TRIGGER_DELAY,
    MIN_PARTITIONS,
    MAX_RECORDS_PER_PARTITION,
    INCLUDE_HEADERS,
    FAIL_ON_DATA_LOSS,
    KAFKA_CONSUMER_POLL_TIMEOUT_MS,
    GROUP_ID_PREFIX,
    FETCH_OFFSET_NUM_RETRIES,
    FETCH_OFFSET_RETRY_INTERVAL_MS,
    MAX_RECORDS_PER_BATCH,
    MAX_BYTES_PER_BATCH,
    FIRST_BATCH_MAX_BYTES,
    SLOTS,
    MIN_TASK_RECORDS,
    MIN_TASK_BYTES,
    POLL_TIMEOUT_MS,
    RETRY_SECONDS,
    EXECUTOR_WRITER,
    EXECUTOR_WRITER_CONFIG,
    EXECUTOR_WRITER_SECRET,
    ONE_TOPIC_PER_TASK,
    AVAILABLE_NOW_ENDING_TIMESTAMP,
    HELD_OFFSETS,
    BYTES_PER_RECORD,
    DECODE_JSON_VALUES,
    DECODE_AVRO_VALUES,
    LOG_TO,
    STOP_FILE,
)
# Options a batch query refuses (Spark: "... is only for batch queries" / "... streaming").
BATCH_ONLY = (ENDING_OFFSETS, ENDING_TIMESTAMP, ENDING_OFFSETS_BY_TIMESTAMP)
STREAM_ONLY = (AVAILABLE_NOW_ENDING_TIMESTAMP,)

PartitionMap = dict[str, dict[str, int]]
# {"topic": {"partition": offset}}, or {"topic": EARLIEST or LATEST} for a whole topic
OffsetsJson = dict[str, dict[str, int] | int]
# "earliest" | "latest" | OffsetsJson
OffsetsSpec = str | OffsetsJson
# a timestamp for every partition, or one per partition
TimestampSpec = int | PartitionMap

_DURATION_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}
_DURATION_MS |= {"d": 86_400_000}


@dataclass(frozen=True)
class SourceOptions:
    kafka: KafkaConfig
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: dict[str, tuple[int, ...]] | None = None
    starting: OffsetsSpec = "earliest"
    ending: OffsetsSpec = "latest"
    starting_timestamps: TimestampSpec | None = None
    starting_timestamp_strategy: Literal["latest", "error"] = "latest"
    ending_timestamps: TimestampSpec | None = None
    available_now_ending_timestamp: int | None = None
    max_offsets_per_trigger: int | None = None
    max_records_per_batch: int | None = None
    max_bytes_per_batch: int | None = None
    first_batch_max_bytes: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_s: float = 15 * 60.0
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    held: PartitionMap = field(default_factory=dict)
    bytes_per_record: PartitionMap = field(default_factory=dict)
    slots: int = 2
    min_task_records: int = 1
    # A batch lighter than this per task is packed into fewer tasks (planner/pack.py).
    min_task_bytes: int = 8 * 1024 * 1024
    # "module:function" and its JSON config: tasks write their records there (executor_write.py).
    executor_writer: str | None = None
    executor_writer_config: str = "{}"
    executor_writer_secret: Secret | None = None
    one_topic_per_task: bool = False
    poll_timeout_s: float = 60.0
    retry_s: float = DEFAULT_RETRY_S
    log_to: str | None = None
    stop_file: str | None = None
    decode_json_values: str | None = None
    decode_avro_values: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], *, batch: bool | None = False) -> SourceOptions:
        """The options of a stream (`spark.readStream`) or, with batch, of a batch query
        (`spark.read`); a BadInput naming the option for anything the source cannot honour.
        batch=None checks what any query needs (at load(), before Spark says which it is)."""
        lowered = _known(options)
        _refuse_other_query_options(lowered, batch)
        bootstrap, kafka_opts = _kafka_options(options)
        topics, pattern, assign = _subscription(lowered)
        starting, ending = _offsets(lowered, batch)
        max_records, per_trigger, min_per_trigger = _trigger_limits(lowered)
        for name in (FETCH_OFFSET_NUM_RETRIES, FETCH_OFFSET_RETRY_INTERVAL_MS):
            _whole(lowered, name)
        strategy = _timestamp_strategy(lowered)
        poll_ms = _positive(lowered, POLL_TIMEOUT_MS) or _positive(
            lowered, KAFKA_CONSUMER_POLL_TIMEOUT_MS
        )
        secret = _raw(lowered, EXECUTOR_WRITER_SECRET)
        trigger_delay = _raw(lowered, MAX_TRIGGER_DELAY)
        return cls(
            kafka=KafkaConfig.from_options(bootstrap, kafka_opts),
            topics=topics,
            pattern=pattern,
            assign=assign,
            starting=starting,
            ending=ending,
            starting_timestamps=_timestamps(
                lowered, STARTING_TIMESTAMP, STARTING_OFFSETS_BY_TIMESTAMP
            ),
            starting_timestamp_strategy="error" if strategy == "error" else "latest",
            ending_timestamps=_timestamps(lowered, ENDING_TIMESTAMP, ENDING_OFFSETS_BY_TIMESTAMP),
            available_now_ending_timestamp=_timestamp(lowered, AVAILABLE_NOW_ENDING_TIMESTAMP),
            max_offsets_per_trigger=per_trigger,
            max_records_per_batch=max_records,
            max_bytes_per_batch=_positive(lowered, MAX_BYTES_PER_BATCH),
            first_batch_max_bytes=_positive(lowered, FIRST_BATCH_MAX_BYTES),
            min_offsets_per_trigger=min_per_trigger,
            max_trigger_delay_s=(
                cls.max_trigger_delay_s if trigger_delay is None else _duration_s(trigger_delay)
            ),
            min_partitions=_positive(lowered, MIN_PARTITIONS),
            max_records_per_partition=_positive(lowered, MAX_RECORDS_PER_PARTITION),
            include_headers=_bool(lowered, INCLUDE_HEADERS, cls.include_headers),
            fail_on_data_loss=_bool(lowered, FAIL_ON_DATA_LOSS, cls.fail_on_data_loss),
            held=(
                _partition_map(raw_held, HELD_OFFSETS, 'JSON like {"topic": {"0": 42}}')
                if (raw_held := _raw(lowered, HELD_OFFSETS))
                else {}
            ),
            bytes_per_record=(
                _partition_map(raw_sizes, BYTES_PER_RECORD, 'JSON like {"topic": {"0": 104}}')
                if (raw_sizes := _raw(lowered, BYTES_PER_RECORD))
                else {}
            ),
            slots=_positive(lowered, SLOTS) or cls.slots,
            min_task_records=_positive(lowered, MIN_TASK_RECORDS) or cls.min_task_records,
            min_task_bytes=_positive(lowered, MIN_TASK_BYTES) or cls.min_task_bytes,
            executor_writer=_raw(lowered, EXECUTOR_WRITER) or None,
            executor_writer_config=_raw(
                lowered, EXECUTOR_WRITER_CONFIG, cls.executor_writer_config
            ),
            executor_writer_secret=secret if secret is None else Secret(secret),
            one_topic_per_task=_bool(lowered, ONE_TOPIC_PER_TASK, cls.one_topic_per_task),
            poll_timeout_s=poll_ms / 1000 if poll_ms else cls.poll_timeout_s,
            retry_s=_seconds(lowered, RETRY_SECONDS, cls.retry_s),
            log_to=_raw(lowered, LOG_TO) or None,
            stop_file=_raw(lowered, STOP_FILE) or None,
            decode_json_values=_json_fields(lowered),
            decode_avro_values=_avro_values(lowered),
        )


def _refuse_other_query_options(lowered: Mapping[str, str], batch: bool | None) -> None:
    """A BadInput for an option of the other kind of query (endingOffsets in a stream, ...)."""
    query = "batch" if batch else "streaming"
    refused = () if batch is None else STREAM_ONLY if batch else BATCH_ONLY
    for name in refused:
        if name.lower() in lowered:
            raise BadInput(f"option {name} is not supported in {query} queries")


def _kafka_options(options: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """kafka.bootstrap.servers, which is required, and the other kafka.* settings."""
    kafka_opts = {
        k[len(KAFKA_PREFIX) :]: v for k, v in options.items() if k.lower().startswith(KAFKA_PREFIX)
    }
    bootstrap = kafka_opts.pop("bootstrap.servers", "")
    if not bootstrap:
        raise BadInput("option kafka.bootstrap.servers is required")
    return bootstrap, kafka_opts


def _subscription(
    lowered: Mapping[str, str],
) -> tuple[tuple[str, ...], str | None, dict[str, tuple[int, ...]] | None]:
    """The topics read: by subscribe, subscribePattern or assign, exactly one of them."""
    given = [name for name in (SUBSCRIBE, SUBSCRIBE_PATTERN, ASSIGN) if name.lower() in lowered]
    if len(given) != 1:
        raise BadInput(
            f"exactly one of the options {SUBSCRIBE}, {SUBSCRIBE_PATTERN} and {ASSIGN} must "
            f"be specified (given: {', '.join(given) or 'none'})"
        )
    topics = tuple(t.strip() for t in _raw(lowered, SUBSCRIBE, "").split(",") if t.strip())
    if given == [SUBSCRIBE] and not topics:
        raise BadInput(f"option {SUBSCRIBE}: no topics to subscribe to")
    pattern = _raw(lowered, SUBSCRIBE_PATTERN)
    if given == [SUBSCRIBE_PATTERN] and not (pattern or "").strip():
        raise BadInput(f"option {SUBSCRIBE_PATTERN}: the pattern to subscribe is empty")
    assigned = _raw(lowered, ASSIGN)
    if given == [ASSIGN] and not (assigned or "").strip():
        raise BadInput(f"option {ASSIGN}: no topic partitions to assign")
    assign = _assign(assigned) if assigned else None
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise BadInput(
                f"option {SUBSCRIBE_PATTERN} {pattern!r} is not a regular expression: {exc}"
            ) from None
    return topics, pattern, assign


def _offsets(lowered: Mapping[str, str], batch: bool | None) -> tuple[OffsetsSpec, OffsetsSpec]:
    """startingOffsets and endingOffsets, refused where Spark refuses them."""
    given_start = _raw(lowered, STARTING_OFFSETS)
    # Unset: a batch query starts at the earliest offsets (the field's default), a stream
    # at the latest, as in Spark.
    starting: OffsetsSpec = SourceOptions.starting if batch else "latest"
    if given_start is not None:
        starting = _offsets_spec(given_start, STARTING_OFFSETS)
    given_end = _raw(lowered, ENDING_OFFSETS)
    ending = SourceOptions.ending if given_end is None else _offsets_spec(given_end, ENDING_OFFSETS)
    if starting == "latest" and batch:
        raise BadInput(f"option {STARTING_OFFSETS} cannot be latest in batch queries")
    if isinstance(starting, dict) and batch and _names(starting, LATEST):
        raise BadInput(f"option {STARTING_OFFSETS} cannot use -1 (latest) in batch queries")
    if ending == "earliest" or (isinstance(ending, dict) and _names(ending, EARLIEST)):
        raise BadInput(f"option {ENDING_OFFSETS} cannot be earliest (-2)")
    if batch and isinstance(starting, dict) and isinstance(ending, dict):
        _check_start_before_end(starting, ending)
    return starting, ending


def _trigger_limits(lowered: Mapping[str, str]) -> tuple[int | None, int | None, int | None]:
    """maxRecordsPerBatch, maxOffsetsPerTrigger and minOffsetsPerTrigger, the minimum not
    above either maximum."""
    max_records = _positive(lowered, MAX_RECORDS_PER_BATCH)
    per_trigger = _positive(lowered, MAX_OFFSETS_PER_TRIGGER)
    min_per_trigger = _positive(lowered, MIN_OFFSETS_PER_TRIGGER)
    for name, maximum in (
        (MAX_OFFSETS_PER_TRIGGER, per_trigger),
        (MAX_RECORDS_PER_BATCH, max_records),
    ):
        if min_per_trigger is not None and maximum is not None and min_per_trigger > maximum:
            raise BadInput(
                f"option {MIN_OFFSETS_PER_TRIGGER} ({min_per_trigger}) is higher than "
                f"{name} ({maximum})"
            )
    return max_records, per_trigger, min_per_trigger


def _timestamp_strategy(lowered: Mapping[str, str]) -> str:
    """startingOffsetsByTimestampStrategy: latest or error."""
    strategy = _raw(
        lowered, STARTING_OFFSETS_BY_TIMESTAMP_STRATEGY, SourceOptions.starting_timestamp_strategy
    )
    strategy = strategy.strip().lower()
    if strategy not in ("latest", "error"):
        raise BadInput(
            f"option {STARTING_OFFSETS_BY_TIMESTAMP_STRATEGY} must be latest or error, "
            f"not {strategy!r}"
        )
    return strategy


def include_headers(options: Mapping[str, str]) -> bool:
    """Whether the options ask for the headers column (includeHeaders), which decides the
    source's schema before the options are parsed for a batch or a stream."""
    return _bool(_known(options), INCLUDE_HEADERS, SourceOptions.include_headers)


def _known(options: Mapping[str, str]) -> dict[str, str]:
    """The options by lower-cased name; a BadInput for a name the source does not know."""
    known = {name.lower(): name for name in KNOWN}
    lowered: dict[str, str] = {}
    for name, value in options.items():
        key = name.lower()
        if key.startswith(KAFKA_PREFIX):
            continue
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {known[close[0]]}?)" if close else ""
            raise BadInput(f"unknown option {name!r} of the lagless-kafka source{hint}")
        if key in lowered:
            raise BadInput(f"option {known[key]} is given twice")
        lowered[key] = value
    return lowered


@overload
def _raw(options: Mapping[str, str], name: str) -> str | None: ...
@overload
def _raw(options: Mapping[str, str], name: str, default: str) -> str: ...
def _raw(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """The option `name` (a constant above) as given, from the options by lower-cased name."""
    return options.get(name.lower(), default)


def _names(spec: OffsetsJson, offset: int) -> bool:
    return any(
        parts == offset if isinstance(parts, int) else offset in parts.values()
        for parts in spec.values()
    )


def _check_start_before_end(starting: OffsetsJson, ending: OffsetsJson) -> None:
    """Spark's checks of a batch query's JSON offsets before it asks the broker: both name
    the same partitions, and no given start is beyond its given end."""
    if any(isinstance(parts, int) for parts in (*starting.values(), *ending.values())):
        return  # a whole topic: its partitions are only known from the broker
    start = {(t, p): o for t, parts in starting.items() for p, o in parts.items()}  # type: ignore[union-attr]
    end = {(t, p): o for t, parts in ending.items() for p, o in parts.items()}  # type: ignore[union-attr]
    if start.keys() != end.keys():
        raise BadInput(
            f"options {STARTING_OFFSETS} and {ENDING_OFFSETS} must name the same topic "
            "partitions, as in Spark"
        )
    for (topic, partition), offset in sorted(start.items()):
        until = end[(topic, partition)]
        if offset >= 0 and until >= 0 and offset > until:
            raise BadInput(
                f"the specified start offset {offset} is greater than the end offset {until} "
                f"for {topic}[{partition}]"
            )


def _whole(
    options: Mapping[str, str], name: str, what: str = "a whole number", *, least: int = 0
) -> int | None:
    """The option as a whole number of at least `least` (`what` it stands for in the
    message)."""
    raw = _raw(options, name)
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"option {name} must be {what}, not {raw!r}") from None
    if value < least:
        bound = f"at least {least}" if least else what
        raise BadInput(f"option {name} must be {bound}, not {value}")
    return value


def _positive(options: Mapping[str, str], name: str) -> int | None:
    """A count of at least 1; a blank value is no value."""
    raw = _raw(options, name)
    if raw is not None and raw.strip() == "":
        return None
    return _whole(options, name, least=1)


def _seconds(options: Mapping[str, str], name: str, default: float) -> float:
    raw = _raw(options, name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise BadInput(f"option {name} must be a number of seconds, not {raw!r}") from None
    if not value >= 0:
        raise BadInput(f"option {name} must be at least 0, not {raw}")
    return value


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = _raw(options, name)
    if raw is None:
        return default
    if raw.strip().lower() in ("true", "1", "yes"):
        return True
    if raw.strip().lower() in ("false", "0", "no"):
        return False
    raise BadInput(f"option {name} must be true or false, not {raw!r}")


def _duration_s(raw: str) -> float:
    """Spark's time strings: "15m", "30s", "500ms", "2h", "1d"; a bare number is milliseconds."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", raw.lower())
    if not match or match.group(2) not in ("", *_DURATION_MS):
        raise BadInput(
            f"option {MAX_TRIGGER_DELAY} must be a duration like 15m, 30s or 500ms, not {raw!r}"
        )
    return int(match.group(1)) * _DURATION_MS.get(match.group(2), 1) / 1000


def _assign(raw: str) -> dict[str, tuple[int, ...]]:
    """{"topicA": [0, 1], "topicB": [2, 4]}."""
    try:
        parsed = json.loads(raw)
        if not isinstance(parsed, dict) or not parsed:
            raise ValueError
        out: dict[str, tuple[int, ...]] = {}
        for topic, partitions in parsed.items():
            if not isinstance(partitions, list) or not partitions:
                raise ValueError
            if not all(
                isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
            ):
                raise ValueError
            out[str(topic)] = tuple(sorted(set(partitions)))
        return out
    except ValueError:
        raise BadInput(
            f'option {ASSIGN} must be JSON like {{"topicA": [0, 1], "topicB": [2]}}, not {raw!r}'
        ) from None


def _partition_map(raw: str, name: str, example: str) -> PartitionMap:
    """{"topic": {"0": 42}} with whole numbers; a BadInput naming the option otherwise."""
    try:
        parsed = json.loads(raw)
        if not isinstance(parsed, dict) or not parsed:
            raise ValueError
        out: PartitionMap = {}
        for topic, parts in parsed.items():
            if not isinstance(parts, dict):
                raise ValueError
            out[str(topic)] = {}
            for partition, value in parts.items():
                if isinstance(value, bool) or not isinstance(value, int) or int(partition) < 0:
                    raise ValueError
                out[str(topic)][str(int(partition))] = value
        return out
    except ValueError:
        raise BadInput(f"option {name} must be {example}, not {raw!r}") from None


def _avro_values(lowered: Mapping[str, str]) -> str | None:
    """decodeAvroValues: how the tasks decode Avro values for the writer that takes them."""
    raw = _raw(lowered, DECODE_AVRO_VALUES)
    if not raw:
        return None
    if not _raw(lowered, EXECUTOR_WRITER):
        raise BadInput(f"option {DECODE_AVRO_VALUES} needs option {EXECUTOR_WRITER}")
    try:
        given = json.loads(raw)
        if isinstance(given["reader_schema"], str) and decodable(given["fields"]):
            return raw
    except (ValueError, AttributeError, KeyError, TypeError):
        pass
    raise BadInput(
        f"option {DECODE_AVRO_VALUES} must give a reader schema and a Spark schema of INT, "
        f"BIGINT, DOUBLE, BOOLEAN and STRING columns, not {raw!r}"
    )


def _json_fields(lowered: Mapping[str, str]) -> str | None:
    """decodeJsonValues: a schema whose columns the tasks can decode (json_values.py)."""
    raw = _raw(lowered, DECODE_JSON_VALUES)
    if not raw:
        return None
    try:
        if decodable(raw):
            return raw
    except (ValueError, AttributeError, KeyError, TypeError):
        pass
    raise BadInput(
        f"option {DECODE_JSON_VALUES} must be a Spark schema (StructType JSON) of INT, BIGINT, "
        f"DOUBLE, BOOLEAN and STRING columns, not {raw!r}"
    )


_WHOLE_TOPIC = {"earliest": EARLIEST, "latest": LATEST}


def _offsets_spec(raw: str, name: str) -> OffsetsSpec:
    """earliest | latest | {"topic": {"0": 42, "1": -2}} (-2 earliest, -1 latest, as in Spark),
    where a topic may be "earliest" or "latest" as a whole: {"topic": "earliest"}."""
    if raw.strip().lower() in _WHOLE_TOPIC:
        return raw.strip().lower()
    example = 'earliest, latest or JSON like {"topic": {"0": 42}} or {"topic": "earliest"}'
    try:
        parsed = json.loads(raw)
    except ValueError:
        raise BadInput(f"option {name} must be {example}, not {raw!r}") from None
    if not isinstance(parsed, dict) or not parsed:
        raise BadInput(f"option {name} must be {example}, not {raw!r}")
    whole = {
        str(t): _WHOLE_TOPIC[v.strip().lower()]
        for t, v in parsed.items()
        if isinstance(v, str) and v.strip().lower() in _WHOLE_TOPIC
    }
    by_partition = {t: v for t, v in parsed.items() if str(t) not in whole}
    spec: OffsetsJson = dict(whole)
    if by_partition:
        spec.update(_partition_map(json.dumps(by_partition), name, example))
    if any(
        o < EARLIEST for parts in spec.values() if isinstance(parts, dict) for o in parts.values()
    ):
        raise BadInput(f"option {name}: an offset must be at least -2, as in Spark")
    return spec


def _timestamp(options: Mapping[str, str], name: str) -> int | None:
    return _whole(options, name, "milliseconds since the epoch")


def _timestamps(options: Mapping[str, str], every: str, by_partition: str) -> TimestampSpec | None:
    """One timestamp for every partition (precedence, as in Spark), else one per partition."""
    single = _timestamp(options, every)
    if single is not None:
        return single
    raw = _raw(options, by_partition)
    if raw is None:
        return None
    spec = _partition_map(raw, by_partition, 'JSON like {"topic": {"0": 1700000000000}}')
    if any(ts < 0 for parts in spec.values() for ts in parts.values()):
        raise BadInput(f"option {by_partition}: timestamps are milliseconds since the epoch")
    return spec
