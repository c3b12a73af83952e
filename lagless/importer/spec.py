"""What an import is asked to do (ImportSpec), and every check of it before anything is written."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from lagless.exceptions import BadInput
from lagless.importer.checkpoint import Fit, check_fit, last_journaled_offsets
from lagless.importer.cluster import check_tasks_reach_store, master_url
from lagless.importer.decode import AvroDecoding
from lagless.importer.value_schema import ValueSchema, resolve
from lagless.kafka import TP, Offsets
from lagless.kafka.config import KafkaConfig
from lagless.kafka.offset_reader import OffsetReader
from lagless.retry import DEFAULT_RETRY_S
from lagless.sinks import Sink, Target, sink_from_url
from lagless.sinks.base import (
    TaskWriter,
    TaskWrittenSink,
    ValueFormat,
    WriteMode,
    check_writable_path,
)
from lagless.sinks.maintenance import DEFAULT_KEEP_HISTORY_S, DEFAULT_TARGET_FILE_SIZE, Policy
from lagless.sinks.url import absolute
from lagless.source import avro_values, json_values, to_json_offsets
from lagless.source import options as o
from lagless.source.data_loss import Lost, lost_offsets
from lagless.source.json_values import decodable

log = logging.getLogger(__name__)
# The fewest records the planner puts in a piece of a range (planner/split.py): a remainder
# smaller joins the piece before it. Each piece starts a fetch at a new offset, which a broker
# may take half a second to answer (Tansu on a 30M-record topic): a small first batch's
# remainders of 375 records, packed into one task, held the batch for 2.4 s. Four imports each
# of that topic: 32.9-35.5 s launch to exit with pieces of any size, 30.6-34.7 s with this.
MIN_TASK_RECORDS = 1000

RunMode = Literal["bulk", "continuous"]

# Seconds between maintenance rounds of an import (importer/maintenance.py).
DEFAULT_MAINTAIN_EVERY_S = 10.0

# Task slots per Spark core: a little more than one keeps a core busy while a task starts.
SLOTS_PER_CORE = 2


def slots_for(parallelism: int) -> int:
    return max(2, parallelism * SLOTS_PER_CORE)


@dataclass(frozen=True)
class ImportSpec:
    kafka: KafkaConfig
    topics: tuple[str, ...]
    sink_url: str
    checkpoint: str
    table: str | None = None
    write: WriteMode = "append"
    mode: RunMode = "bulk"
    value_format: ValueFormat = "raw"
    max_records_per_batch: int | None = None
    max_bytes_per_batch: int | None = None
    slots: int | None = None
    trigger_seconds: float = 0.5
    fail_on_data_loss: bool = True
    master: str | None = None
    group: str | None = None
    max_record_bytes: int | None = None
    dead_letter_topic: str | None = None
    # Milliseconds since the epoch: start at the first record this recent; in bulk mode, stop
    # before the first one that recent (Spark's startingTimestamp / endingTimestamp).
    starting_timestamp: int | None = None
    ending_timestamp: int | None = None
    extra_source_options: dict[str, str] = field(default_factory=dict)
    # A Spark DDL schema, @file of one, "infer" (JSON); an Avro schema file (Avro).
    value_schema: str | None = None
    schema_registry: str | None = None
    key_fields: tuple[str, ...] = ()
    # How long a broker or database that is away is waited for (lagless/retry.py).
    retry_seconds: float = DEFAULT_RETRY_S
    # Spark settings (--spark-conf), set after lagless's own: spark.archives ships lagless.
    spark_conf: tuple[tuple[str, str], ...] = ()
    # The executors see the driver's filesystem at the same paths (--shared-disk).
    shared_disk: bool = False
    # Table maintenance between batches (importer/maintenance.py): files merged up to this
    # size, versions kept this long, a round at most this often (0: none).
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    keep_history_s: float = DEFAULT_KEEP_HISTORY_S
    maintain_every_s: float = DEFAULT_MAINTAIN_EVERY_S

    @property
    def maintenance_policy(self) -> Policy:
        return Policy(self.target_file_size, self.keep_history_s)

    def target(self, value_schema: ValueSchema | None = None) -> Target:
        if self.table is None and len(self.topics) != 1:
            raise BadInput("importing several topics needs --table")
        return Target(
            sink_from_url(self.sink_url).table_name(self.table or self.topics[0]),
            self.write,
            self.value_format,
            value_schema.fields if value_schema else None,
            self.key_fields,
            run_id=hashlib.sha256(os.path.abspath(self.checkpoint).encode()).hexdigest()[:12],
        )

    def source_options(
        self,
        slots: int,
        held: Offsets | None = None,
        bytes_per_record: Mapping[TP, float] | None = None,
        json_fields: str | None = None,
        target: Target | None = None,
        avro: AvroDecoding | None = None,
    ) -> dict[str, str]:
        """The lagless-kafka source's options for this import (target: as the checks resolved
        it; json_fields: Checked.json_fields_tasks_decode; avro: Checked.avro)."""
        options = self.kafka.source_options()
        options.update(
            {
                f"{o.KAFKA_PREFIX}bootstrap.servers": self.kafka.bootstrap,
                o.SUBSCRIBE: ",".join(self.topics),
                o.STARTING_OFFSETS: "earliest",
                o.FAIL_ON_DATA_LOSS: str(self.fail_on_data_loss).lower(),
                o.SLOTS: str(slots),
                o.MIN_TASK_RECORDS: str(MIN_TASK_RECORDS),
                o.RETRY_SECONDS: str(self.retry_seconds),
            }
        )
        writer = self.executor_writer(target)
        if self.max_records_per_batch:
            options[o.MAX_RECORDS_PER_BATCH] = str(self.max_records_per_batch)
        else:
            sink = sink_from_url(self.sink_url)
            # Records the source's tasks write themselves never wait in the driver's memory.
            default = Sink.max_batch_bytes if writer is not None else sink.max_batch_bytes
            options[o.MAX_BYTES_PER_BATCH] = str(self.max_bytes_per_batch or default)
            options[o.FIRST_BATCH_MAX_BYTES] = str(sink.FIRST_BATCH_MAX_BYTES)
        if self.starting_timestamp is not None:
            options[o.STARTING_TIMESTAMP] = str(self.starting_timestamp)
        if self.ending_timestamp is not None:
            options[o.AVAILABLE_NOW_ENDING_TIMESTAMP] = str(self.ending_timestamp)
        if writer is not None:
            options[o.EXECUTOR_WRITER] = writer.name
            options[o.EXECUTOR_WRITER_CONFIG] = writer.config
            if writer.secret is not None:
                options[o.EXECUTOR_WRITER_SECRET] = writer.secret.reveal()
        if held:
            options[o.HELD_OFFSETS] = json.dumps(to_json_offsets(held))
        if bytes_per_record:
            sizes = {tp: math.ceil(size) for tp, size in bytes_per_record.items()}
            options[o.BYTES_PER_RECORD] = json.dumps(to_json_offsets(sizes))
        if json_fields is not None:
            options[o.DECODE_JSON_VALUES] = json_fields
        if avro is not None and writer is not None and target and target.fields is not None:
            options[o.DECODE_AVRO_VALUES] = avro.values(target.fields.json()).option()
        options.update(self.extra_source_options)
        return options

    def with_absolute_paths(self) -> ImportSpec:
        """The checkpoint and a local store's path made absolute (the same places)."""
        return replace(
            self, checkpoint=os.path.abspath(self.checkpoint), sink_url=absolute(self.sink_url)
        )

    def executor_writer(self, target: Target | None = None) -> TaskWriter | None:
        """The store's writer for the source's tasks, when they write this import's records
        (task_written); else None. target: as the checks resolved it (a typed one's fields)."""
        target = target or self.target()
        sink = self.task_written(sink_from_url(self.sink_url), target)
        return sink.executor_writer(target, _decoded(target)) if sink is not None else None

    def task_written(self, sink: Sink, target: Target | None = None) -> TaskWrittenSink | None:
        """The sink, when the source's tasks write this import's records themselves: an append
        without a size limit, of raw values (none can be rejected, none goes to a dead-letter
        topic) or of typed values in columns of INT, BIGINT, DOUBLE, BOOLEAN and STRING
        (json_values.decodable), JSON or Avro, which the tasks decode (the values they do not
        decode, they leave to Spark's rows), into a store that takes them so for this
        target. Else None: rows go through Spark (Sink.write). target: as the checks resolved
        it; a typed one is known only then."""
        target = target or self.target()
        if (
            not isinstance(sink, TaskWrittenSink)
            or target.mode != "append"
            or self.max_record_bytes is not None
        ):
            return None
        if target.value_format == "raw":
            if self.dead_letter_topic is not None:
                return None
        elif target.fields is None or not decodable(target.fields.json()):
            return None
        return sink if sink.executor_writer(target, _decoded(target)) is not None else None


def _decoded(target: Target) -> str | None:
    """The source's column of typed values decoded in its tasks, for a typed target."""
    if target.fields is None:
        return None
    return avro_values.COLUMN if target.value_format == "avro" else json_values.COLUMN


@dataclass
class Checked:
    """What validation found, so the run does not ask the broker twice."""

    sink: Sink
    target: Target
    reader: OffsetReader
    partitions: list[tuple[str, int]]
    avro: AvroDecoding | None = None
    # The checkpoint's record to write before the query starts; None: it is there already.
    fit: Fit | None = None
    # Offsets the checkpoint stood at that the log no longer holds (--skip-lost-offsets).
    lost: list[Lost] = field(default_factory=list)

    @property
    def where(self) -> str:
        """The target as messages name it: the store (no password) and the table."""
        return f"table {self.target.table!r} of {self.sink.url}"

    @property
    def json_fields_tasks_decode(self) -> str | None:
        """Typed JSON values the source's tasks can decode (source/json_values.py): the
        value schema as JSON, else None (from_json decodes every value)."""
        fields = self.target.fields
        if self.target.value_format != "json" or fields is None or self.avro is not None:
            return None
        return fields.json() if decodable(fields.json()) else None


def check(spec: ImportSpec) -> Checked:
    """Every bad-input check, before anything is written to the sink or the checkpoint."""
    if spec.ending_timestamp is not None and spec.mode != "bulk":
        raise BadInput("--ending-timestamp needs --mode bulk (a continuous import has no end)")
    table = spec.target().table  # the table name, before anything is asked of the broker
    sink = sink_from_url(spec.sink_url)
    # Before the broker is asked anything: where the tasks write does not depend on the log.
    check_tasks_reach_store(
        master_url(spec.master),
        spec.shared_disk,
        sink,
        spec.target(),
        spec.executor_writer() is not None,
    )
    check_writable_path(spec.checkpoint, "checkpoint directory", folder=True)
    fit = Fit.of(spec.topics, sink.identity, table, spec.write, spec.value_format, spec.key_fields)
    new_fit = check_fit(spec.checkpoint, fit)
    reader = OffsetReader(spec.kafka, retry_s=spec.retry_seconds)
    partitions = reader.cluster.partitions(spec.topics)
    lost = check_log(spec, reader, partitions)
    if spec.dead_letter_topic is not None:
        if spec.dead_letter_topic in spec.topics:
            raise BadInput(f"--dead-letter-topic {spec.dead_letter_topic!r} is being imported")
        reader.cluster.partitions([spec.dead_letter_topic])
    value_schema = resolve(spec, partitions)
    target = spec.target(value_schema)
    sink.check(target)
    return Checked(
        sink, target, reader, partitions, value_schema.avro, fit if new_fit else None, lost
    )


def check_log(
    spec: ImportSpec, reader: OffsetReader, partitions: list[tuple[str, int]]
) -> list[Lost]:
    """The checkpoint's offsets against the log: offsets it has not read that the log no longer
    holds (a recreated topic, retention, a partition gone) refuse the import, unless
    --skip-lost-offsets, which reads on from the log's start (the source does the same)."""
    journaled = last_journaled_offsets(spec.checkpoint)
    if not journaled:
        return []
    low, high = reader.log.watermarks(partitions)
    lost = lost_offsets(journaled, low, high)
    if lost and spec.fail_on_data_loss:
        raise BadInput(
            f"checkpoint {spec.checkpoint!r} does not fit the log: {lost[0]}; "
            "rerun with --skip-lost-offsets to read on from the log's start"
        )
    for each in lost:
        log.warning("%s: skipped, reading on from the log's start", each)
    return lost


def timestamp_offsets(checked: Checked, ms: int, low: Offsets, high: Offsets) -> Offsets:
    """Each partition's first offset at or after ms, else its high offset."""
    found = checked.reader.log.offsets_for_times(dict.fromkeys(high, ms), high)
    resolved = {}
    for tp, h in high.items():
        offset = found.get(tp)
        resolved[tp] = h if offset is None else min(max(offset, low[tp]), h)
    return resolved
