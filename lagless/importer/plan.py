"""The import's plan (ImportPlan), resolved once from its options (spec.ImportSpec) by `check`,
with every check before anything is written: the store, the tables and their targets, the
partitions, what the checkpoint records, and the write path (write_path.py). The source's
options of each query are read off the plan (source_options)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from lagless.cdc.schema_change import merged
from lagless.exceptions import BadInput, SchemaChangeRefused
from lagless.importer import change_files
from lagless.importer.checkpoint import Fit, check_fit, last_journaled_offsets, stopped_tables
from lagless.importer.cluster import check_tasks_reach_store, master_url
from lagless.importer.debezium import events_of
from lagless.importer.routing import Destination, by_topic, route, table_names, topics_of
from lagless.importer.spec import MIN_TASK_RECORDS, ImportSpec
from lagless.importer.value_schema import ValueSchema, resolve
from lagless.importer.write_path import ROWS, Way, WritePath, decide, table_writer
from lagless.kafka import TP, Offsets
from lagless.kafka.offset_reader import OffsetReader
from lagless.sinks import Sink, Target, sink_from_url
from lagless.sinks.base import check_writable_path
from lagless.source import avro_values, to_json_offsets
from lagless.source import options as o
from lagless.source.data_loss import Lost, lost_offsets
from lagless.source.json_values import decodable

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)


@dataclass
class ImportPlan:
    """The import's plan, resolved once by `check`: the store (built once), the broker's
    reader, the partitions read, the tables (Destination: each one's target, topics, decoding
    and ledger), what the checkpoint records, and how batches reach the store (write_path).
    The run reads its decisions here, and the options they were resolved from (`spec`),
    rather than taking the options beside it."""

    # The import's options, checked: what the plan was resolved from.
    spec: ImportSpec
    sink: Sink
    reader: OffsetReader
    # Every partition the import reads, and each table's own (routing.py).
    partitions: list[TP]
    destinations: list[Destination]
    # The checkpoint's record to write before the query starts; None: it is there already.
    fit: Fit | None = None
    # Offsets the checkpoint stood at that the log no longer holds (--skip-lost-offsets).
    lost: list[Lost] = field(default_factory=list)
    # How the next query's batches reach the store (write_path.decide): decided with the
    # tables, again when a routed import adds tables (job.admit_new_topics).
    write_path: WritePath = ROWS

    def decide_write_path(self) -> None:
        """The write path for the tables as they are now: the one place it is decided."""
        self.write_path = decide(self.spec.write_options, self.sink, self.destinations)

    @property
    def held(self) -> Offsets:
        """What the tables hold, every table's partitions together (a topic has one table)."""
        return {tp: offset for each in self.destinations for tp, offset in each.held.items()}

    def destination_of(self, topic: str) -> Destination | None:
        return by_topic(self.destinations).get(topic)

    @property
    def shared_value_schema(self) -> ValueSchema | None:
        """The value's fields and their Avro decoding when every table has the same (one
        query's tasks decode values one way); None when they differ or there are none."""
        schemas = {
            (each.target.value_format, _json(each.target.fields), each.avro)
            for each in self.destinations
        }
        if len(schemas) != 1:
            return None
        first = self.destinations[0]
        if first.target.fields is None:
            return None
        return ValueSchema(first.target.fields, first.avro)

    @property
    def json_fields_tasks_decode(self) -> str | None:
        """Typed JSON values the source's tasks can decode (source/json_values.py): the
        value schema as JSON, else None (from_json decodes every value)."""
        shared = self.shared_value_schema
        if shared is None or shared.fields is None or shared.avro is not None:
            return None
        if self.destinations[0].target.value_format != "json":
            return None
        return shared.fields.json() if decodable(shared.fields.json()) else None

    @property
    def avro_tasks_decode(self) -> avro_values.AvroValues | None:
        """The Avro decoder of the source's tasks, when every table decodes alike."""
        shared = self.shared_value_schema
        if shared is None or shared.fields is None or shared.avro is None:
            return None
        return shared.avro.values(shared.fields.json())


def _json(fields: StructType | None) -> str | None:
    return fields.json() if fields is not None else None


def check(spec: ImportSpec) -> ImportPlan:
    """Every bad-input check, before anything is written to the sink or the checkpoint; a
    routed import's per table (check_destinations)."""
    if not spec.trigger_seconds > 0:
        raise BadInput(f"--trigger-seconds must be above 0, not {spec.trigger_seconds:g}")
    if spec.ending_timestamp is not None and spec.mode != "bulk":
        raise BadInput("--ending-timestamp needs --mode bulk (a continuous import has no end)")
    if spec.topic_pattern is not None and spec.topics:
        raise BadInput("--topic-pattern reads every topic it matches: give it without --topic")
    sink = sink_from_url(spec.sink_url)
    template = spec.template
    if not spec.routed:
        # Before the broker is asked anything: where the tasks write does not depend on it.
        _check_tasks_reach(spec, sink, spec.target(sink))
    check_writable_path(spec.checkpoint, "checkpoint directory", folder=True)
    fit = Fit.of(
        spec.topics,
        sink.identity,
        template.text if spec.routed else spec.target(sink).table,
        spec.write,
        spec.value_format,
        spec.key_fields,
        spec.topic_pattern or "",
    )
    new_fit = check_fit(spec.checkpoint, fit)
    reader = OffsetReader(spec.kafka, retry_s=spec.retry_seconds)
    partitions = spec.partitions(reader)
    if spec.topic_pattern is not None and not partitions and spec.mode == "bulk":
        raise BadInput(
            f"no topic on {spec.kafka.bootstrap} matches --topic-pattern {spec.topic_pattern!r}"
        )
    lost = check_log(spec, reader, partitions)
    if spec.dead_letter_topic is not None:
        if spec.dead_letter_topic in topics_of(partitions):
            raise BadInput(f"--dead-letter-topic {spec.dead_letter_topic!r} is being imported")
        reader.cluster.partitions([spec.dead_letter_topic])
    destinations = check_destinations(spec, sink, reader, partitions)
    plan = ImportPlan(spec, sink, reader, partitions, destinations, fit if new_fit else None, lost)
    plan.decide_write_path()
    return plan


def _check_tasks_reach(spec: ImportSpec, sink: Sink, target: Target) -> None:
    """BadInput when the tasks would write `target`'s files where the executors may not see
    them (cluster.check_tasks_reach_store)."""
    tasks_write = table_writer(spec.write_options, sink, target) is not None
    check_tasks_reach_store(master_url(spec.master), spec.shared_disk, sink, target, tasks_write)


def check_destinations(
    spec: ImportSpec, sink: Sink, reader: OffsetReader, partitions: list[TP]
) -> list[Destination]:
    """The tables these partitions' records land in, each checked as a table of its own: its
    name, value schema and layout (Sink.check), and whether the tasks can reach it. Called
    before the first batch, and again for topics that appear while a routed import runs."""
    partitions = with_change_events(spec, reader, partitions)
    if not partitions and spec.value_format == "debezium":
        return []
    names_of = _names_of(spec, reader, partitions)
    if spec.routed:
        tables = route(
            spec.template,
            topics_of(partitions),
            names_of,
            sink.table_name,
            spec.one_topic_per_table,
        )
    else:
        tables = {spec.target(sink).table: spec.topics}
    destinations = []
    stopped = stopped_tables(spec.checkpoint)
    for table, topics in tables.items():
        own = [tp for tp in partitions if tp[0] in topics]
        value_schema = resolve(spec, sink, own, topics, reader)
        target = target_for(spec, table, sink, value_schema)
        reason = stopped.get(target.table)
        if reason is None:
            target, reason = _checked(spec, sink, target)
        if spec.routed:
            _check_tasks_reach(spec, sink, target)
        where = f"table {target.table!r} of {sink.url}"
        spelled = spec.template.spelled(names_of(topics[0])) if spec.routed else ""
        destinations.append(
            Destination(
                target,
                topics,
                own,
                where,
                value_schema.avro,
                spelled=spelled,
                warning=value_schema.change_log,
                stopped=reason,
            )
        )
    return destinations


def with_change_events(spec: ImportSpec, reader: OffsetReader, partitions: list[TP]) -> list[TP]:
    """A mirror's partitions of the topics that hold records. A topic Debezium has sent
    nothing to yet has no table until its first change event, and never holds the other
    tables back: a batch that reads it stops the query, which makes its table and starts
    again (job.admit_new_topics). In bulk it is left out, with a warning; with no topic that
    holds a record, a bulk mirror has nothing to mirror: refused."""
    if spec.value_format != "debezium" or not partitions:
        return partitions
    low, high = reader.log.watermarks(partitions)
    ready = {tp[0] for tp in partitions if high[tp] > low[tp]}
    waiting = ", ".join(topic for topic in topics_of(partitions) if topic not in ready)
    if spec.mode == "bulk" and not ready:
        raise BadInput(
            f"--value-format debezium: the topics hold no change event yet ({waiting}); "
            "start the bulk mirror once Debezium has sent its snapshot, or run it with "
            "--mode continuous, which waits for the first event of each table"
        )
    if waiting and spec.mode == "bulk":
        log.warning("topics %s hold no change event yet: left out, a rerun mirrors them", waiting)
    elif waiting:
        log.info("topics %s hold no change event yet: their tables wait for it", waiting)
    return [tp for tp in partitions if tp[0] in ready]


def _checked(spec: ImportSpec, sink: Sink, target: Target) -> tuple[Target, str | None]:
    """Sink.check of the target, then the rules its table sets on rows (Sink.row_rules); a
    mirror's columns the widest of its table's and its newest events' (schema_change.merged).
    A schema change the table cannot follow stops the table (the reason returned), unless
    --schema-changes fail."""
    try:
        if target.value_format == "debezium" and target.fields is not None:
            held = sink.table_types(target)
            target = replace(target, fields=merged(target.fields, held, target.table))
        sink.check(target)
        target = replace(target, row_rules=sink.row_rules(target))
    except SchemaChangeRefused as refused:
        if spec.schema_changes == "fail":
            raise
        return target, str(refused)
    return target, None


def _names_of(
    spec: ImportSpec, reader: OffsetReader, partitions: list[TP]
) -> Callable[[str], dict[str, str]]:
    """A topic's names for the template (routing.table_names): from a sample record's value
    when the template needs more than the topic's name and the values can tell."""
    template = spec.template
    samples: dict[str, bytes | None] = {}
    if template.needs_source and spec.value_format == "debezium":
        low, high = reader.log.watermarks(partitions)
        firsts: dict[str, TP] = {}
        for tp in sorted(partitions):
            if high[tp] > low[tp]:
                firsts.setdefault(tp[0], tp)
        found = reader.records.at({tp: low[tp] for tp in firsts.values()})
        samples = {tp[0]: (records[0].value if records else None) for tp, records in found.items()}

    events = events_of(spec.schema_registry) if spec.value_format == "debezium" else None

    def names_of(topic: str) -> dict[str, str]:
        names = table_names(topic, samples.get(topic), events)
        missing = template.names - set(names)
        if missing:
            raise BadInput(
                f"--table {template.text!r}: topic {topic!r} has no {{{sorted(missing)[0]}}} "
                "(its name is not <prefix>.<schema>.<table>)"
            )
        return names

    return names_of


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


def timestamp_offsets(plan: ImportPlan, ms: int, low: Offsets, high: Offsets) -> Offsets:
    """Each partition's first offset at or after ms, else its high offset."""
    found = plan.reader.log.offsets_for_times(dict.fromkeys(high, ms), high)
    resolved = {}
    for tp, h in high.items():
        offset = found.get(tp)
        resolved[tp] = h if offset is None else min(max(offset, low[tp]), h)
    return resolved


def target_for(
    spec: ImportSpec, table: str, sink: Sink, value_schema: ValueSchema | None = None
) -> Target:
    """The table `table` of the store `sink` (its name as spelt there), with its value's
    columns and key when it has them."""
    change_log = value_schema is not None and value_schema.change_log is not None
    return Target(
        sink.table_name(table),
        "append" if change_log else spec.write,
        spec.value_format,
        value_schema.fields if value_schema else None,
        (value_schema.key_fields if value_schema else ()) or spec.key_fields,
        run_id=spec.run_id,
        deletes=spec.deletes,
        schema_registry=spec.schema_registry,
    )


def source_options(
    plan: ImportPlan,
    slots: int,
    bytes_per_record: Mapping[TP, float] | None = None,
) -> dict[str, str]:
    """The lagless-kafka source's options for this import's next query: its plan's tables,
    store and write path (checked), and what its ledgers hold."""
    spec = plan.spec
    options = spec.kafka.source_options()
    options.update(
        {
            f"{o.KAFKA_PREFIX}bootstrap.servers": spec.kafka.bootstrap,
            o.STARTING_OFFSETS: "earliest",
            o.FAIL_ON_DATA_LOSS: str(spec.fail_on_data_loss).lower(),
            o.SLOTS: str(slots),
            o.MIN_TASK_RECORDS: str(MIN_TASK_RECORDS),
            o.RETRY_SECONDS: str(spec.retry_seconds),
        }
    )
    topics, pattern = spec.subscription
    if pattern is not None:
        options[o.SUBSCRIBE_PATTERN] = pattern
    else:
        options[o.SUBSCRIBE] = ",".join(topics)
    options.update(_batch_limits(plan))
    if spec.value_format == "debezium":  # a primary-key change's headers (cdc/key_change.py)
        options[o.INCLUDE_HEADERS] = "true"
    writer = plan.write_path.writer
    if spec.starting_timestamp is not None:
        options[o.STARTING_TIMESTAMP] = str(spec.starting_timestamp)
    if spec.ending_timestamp is not None:
        options[o.AVAILABLE_NOW_ENDING_TIMESTAMP] = str(spec.ending_timestamp)
    if writer is not None:
        options[o.EXECUTOR_WRITER] = writer.name
        options[o.EXECUTOR_WRITER_CONFIG] = writer.config
        if writer.secret is not None:
            options[o.EXECUTOR_WRITER_SECRET] = writer.secret.reveal()
        if spec.routed:  # a task writes into one table: its pieces are of one topic
            options[o.ONE_TOPIC_PER_TASK] = "true"
    if plan.held:
        options[o.HELD_OFFSETS] = json.dumps(to_json_offsets(plan.held))
    if bytes_per_record:
        sizes = {tp: math.ceil(size) for tp, size in bytes_per_record.items()}
        options[o.BYTES_PER_RECORD] = json.dumps(to_json_offsets(sizes))
    if plan.json_fields_tasks_decode is not None:
        options[o.DECODE_JSON_VALUES] = plan.json_fields_tasks_decode
    avro = plan.avro_tasks_decode
    if avro is not None and writer is not None:
        options[o.DECODE_AVRO_VALUES] = avro.option()
    options.update(spec.extra_source_options)
    return options


def _batch_limits(plan: ImportPlan) -> dict[str, str]:
    """The source's limits of a batch: --max-records-per-batch, else bytes, by default what
    the plan's write path holds in the driver's memory (records the tasks write never wait
    there; a mirror's decoded events do, while the driver coalesces them)."""
    spec = plan.spec
    if spec.max_records_per_batch:
        return {o.MAX_RECORDS_PER_BATCH: str(spec.max_records_per_batch)}
    sink = plan.sink
    default = {
        Way.ROWS: sink.max_batch_bytes,
        Way.TASK_FILES: Sink.max_batch_bytes,
        Way.CHANGE_FILES: change_files.MAX_BATCH_BYTES,
    }[plan.write_path.way]
    return {
        o.MAX_BYTES_PER_BATCH: str(spec.max_bytes_per_batch or default),
        o.FIRST_BATCH_MAX_BYTES: str(sink.FIRST_BATCH_MAX_BYTES),
    }
