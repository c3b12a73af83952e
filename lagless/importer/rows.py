"""What a batch of Kafka records becomes before a sink sees it: typed columns, the reason a
record is rejected, and, in upsert mode, one row per key. All of it runs in the JVM, but the
decoding of Avro values (importer/decode.py: Arrow batches in the executors' Python workers)
and of the typed JSON values the source's tasks decode (source/json_values.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from lagless.cdc import envelope, key_change
from lagless.cdc.envelope import DELETE_COLUMN, ERROR_COLUMN, NEW_SCHEMA_COLUMN, SKIP_COLUMN
from lagless.cdc.unavailable import kept_columns, unavailable_json, unavailable_value
from lagless.exceptions import BadInput
from lagless.first_line import first_line
from lagless.importer import debezium
from lagless.sinks.base import DEAD_LETTER_COLUMNS, TOMBSTONE, Target
from lagless.sinks.ledger import TP
from lagless.sinks.upsert_order import LOG_TIME, RANK
from lagless.source import avro_values
from lagless.source.json_values import COLUMN as DECODED
from lagless.source.json_values import CORRUPT as _CORRUPT

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

    from lagless.importer.decode import AvroDecoding

INVALID_UTF8 = "value is not valid UTF-8"
INVALID_JSON = "value is not valid JSON"
NOT_AN_OBJECT = "value is not a JSON object"
NULL_KEY = "null key in upsert mode"
TOMBSTONE_WITHOUT_KEY_FIELDS = "tombstone whose Kafka key does not give the --key-field values"
VALIDATE = "validate"
# Internal columns of a shaped batch, named so that no value field can take their name.
RAW, BYTES, ERROR = "_lagless_raw", "_lagless_bytes", "_lagless_error"
_PARSED, _TEXTS = "_lagless_parsed", "_lagless_texts"
_RANK = "_lagless_rank"
_PRIOR = "_lagless_prior"


def too_large(limit: int) -> str:
    return f"value is larger than --max-record-bytes {limit}"


def wrong_type(field: str, type_name: str) -> str:
    return f"field {field!r} is not {type_name}"


def missing(field: str) -> str:
    return f"required field {field!r} is missing"


def _checks(
    target: Target, max_record_bytes: int | None, avro: AvroDecoding | None
) -> list[tuple[Column, str | Column]]:
    """(condition, reason) in the order they are tried: the first that holds is the reason."""
    from pyspark.sql import functions as F

    value = F.col("value")
    checks: list[tuple[Column, str | Column]] = []
    if target.mode == "upsert" and not target.key_fields:
        checks.append((F.col("key").isNull(), NULL_KEY))
    if max_record_bytes is not None:
        checks.append((F.length(value) > max_record_bytes, too_large(max_record_bytes)))
    if target.value_format == "json":
        checks.append((value.isNotNull() & ~F.is_valid_utf8(value), INVALID_UTF8))
        if target.fields is None:
            checks.append(
                (value.isNotNull() & F.try_parse_json(value.cast("string")).isNull(), INVALID_JSON)
            )
    if target.value_format == "debezium":  # the envelope's reason (envelope.REASONS), as is
        return [*checks, (F.col(ERROR_COLUMN).isNotNull(), F.col(ERROR_COLUMN))]
    if target.fields is None:
        return checks
    parsed = F.col(_PARSED)
    if avro is not None:
        checks += [(F.col(avro.ERROR) == reason, reason) for reason in avro.reasons]
    else:
        checks.append((F.col(_TEXTS)[_CORRUPT].isNotNull(), NOT_AN_OBJECT))
        for field in target.fields:
            given = F.col(_TEXTS)[field.name].isNotNull()
            reason = wrong_type(field.name, field.dataType.simpleString())
            checks.append((given & parsed[field.name].isNull(), reason))
    for field in target.fields:
        if not field.nullable or field.name in target.key_fields:
            checks.append((value.isNotNull() & parsed[field.name].isNull(), missing(field.name)))
    if target.mode == "upsert" and target.key_fields:
        from_key = _key_fields_from_kafka_key(target)
        unkeyed = F.lit(False)
        for name in target.key_fields:
            unkeyed = unkeyed | from_key[name].isNull()
        checks.append((value.isNull() & unkeyed, TOMBSTONE_WITHOUT_KEY_FIELDS))
    return checks


def _key_fields_from_kafka_key(target: Target) -> dict[str, Column]:
    """A tombstone has no value to take --key-field values from: they come from its Kafka key,
    its text for one key field, a JSON object holding them for several."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    assert target.fields is not None
    key = F.col("key").cast("string")
    if len(target.key_fields) == 1:
        (name,) = target.key_fields
        return {name: key.try_cast(target.fields[name].dataType)}
    fields = StructType([target.fields[name] for name in target.key_fields])
    return {name: F.from_json(key, fields)[name] for name in target.key_fields}


def rejection_reasons(
    target: Target, max_record_bytes: int | None = None, avro: AvroDecoding | None = None
) -> list[str]:
    """Every error text `rejection` can give for this target (a Debezium event's reason
    begins with one of envelope.REASONS: UNSTORABLE names the column and why), then those of
    the table's rules on rows (_rules_kept)."""
    texts = [text for _, text in _checks(target, max_record_bytes, avro) if isinstance(text, str)]
    if target.value_format == "debezium":
        texts += [*envelope.REASONS, *(avro_values.REASONS if target.schema_registry else ())]
    return texts + [rule.broken for rule in target.row_rules]


def _rejection(target: Target, max_record_bytes: int | None, avro: AvroDecoding | None) -> Column:
    """NULL for a record the target accepts, else the first reason it does not."""
    from pyspark.sql import functions as F

    reason = F.lit(None).cast("string")
    for condition, text in reversed(_checks(target, max_record_bytes, avro)):
        reason = F.when(condition, F.lit(text) if isinstance(text, str) else text).otherwise(reason)
    return reason


def _as_text(fields: StructType) -> StructType:
    """Every field as a string (a JSON value's text), plus the text of a value that is not a
    JSON object: tells a field absent or null from one of another type."""
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType(
        [StructField(f.name, StringType()) for f in fields] + [StructField(_CORRUPT, StringType())]
    )


def _parse_json(records: DataFrame, fields: StructType) -> DataFrame:
    """_PARSED: the value parsed into `fields`, and _TEXTS (_as_text) where that failed.

    One parse per record: Spark's from_json spends most of its time setting a parser up, and
    a typed import into SQLite ran at 0.44x two plain consumers parsing every value twice.
    The typed parse notes the text of a value it could not take (_CORRUPT): a value that is
    not JSON, not an object, or has a field of another type. Only those are parsed again as
    texts, which tells which of these it is (rejection reasons); a value the typed parse took
    has no field of another type and is an object, so _TEXTS stays NULL for it and no reason
    read from _TEXTS holds, as it would not with _TEXTS parsed.

    Values the source's tasks decoded (DECODED, where they decode alike: json_values.py) are
    taken as they are; from_json parses the others."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    text = F.col("value").cast("string")
    corrupt = {"columnNameOfCorruptRecord": _CORRUPT}
    noted = StructType([*fields, StructField(_CORRUPT, StringType())])
    typed = F.from_json(text, noted, corrupt)
    if DECODED in records.columns:
        typed = F.coalesce(F.col(DECODED), typed)  # from_json runs only where it is NULL
    parsed = records.withColumn(_PARSED, typed)
    # A projection of its own: the texts' parse is evaluated once per row, and only where the
    # typed parse failed (Spark does not inline an expensive expression used several times).
    return parsed.withColumn(
        _TEXTS,
        F.when(
            F.col(_PARSED)[_CORRUPT].isNotNull(),
            F.from_json(text, _as_text(fields), corrupt),
        ),
    )


def _fields(target: Target) -> list[Column]:
    """The value's fields as columns; in upsert mode a tombstone's key fields too."""
    from pyspark.sql import functions as F

    assert target.fields is not None
    parsed = F.col(_PARSED)
    from_key = _key_fields_from_kafka_key(target) if target.key_fields else {}
    columns = []
    for field in target.fields:
        column = parsed[field.name]
        if field.name in from_key:
            column = F.when(F.col("value").isNull(), from_key[field.name]).otherwise(column)
        columns.append(column.alias(field.name))
    return columns


def shape(
    records: DataFrame,
    target: Target,
    max_record_bytes: int | None = None,
    avro: AvroDecoding | None = None,
    log_times: Mapping[TP, int] | None = None,
) -> DataFrame:
    """Sink columns (Target.row_columns), plus RAW (the value as read), BYTES (key + value) and
    ERROR (the reason it is rejected, else NULL). An upsert's rows carry their log time
    (upsert_order.py), each partition's running maximum starting from `log_times` (its log
    time where the batch starts, none for a partition not listed), over every record read,
    the rejected ones included."""
    from pyspark.sql import functions as F

    size = F.coalesce(F.length("key"), F.lit(0)) + F.coalesce(F.length("value"), F.lit(0))
    if target.fields is None:
        value = F.col("value").cast("string") if target.value_format == "json" else F.col("value")
        stored = [value.alias("value"), F.unix_millis("timestamp").alias("timestamp")]
    elif target.value_format == "debezium":
        records = debezium.decode(records, target, _PARSED)
        parsed = F.col(_PARSED)
        stored = [
            F.unix_millis("timestamp").alias("timestamp"),
            *(parsed[name].alias(name) for name in target.fields.fieldNames()),
            F.col(SKIP_COLUMN).alias(SKIP_COLUMN),
            F.col(NEW_SCHEMA_COLUMN).alias(NEW_SCHEMA_COLUMN),
        ]
        if target.marks:  # the store fills the marks; the batch's key changes (key_change.py)
            stored += [F.lit(None).cast("string").alias(n) for n in key_change.MARK_COLUMNS]
            stored += [F.col(key_change.MOVES), F.col(key_change.TAKES)]
            stored.append(F.lit(False).alias(key_change.MOVE_ONLY))
    else:
        if avro is not None:
            records = avro.decode(records, _PARSED)
        else:
            records = _parse_json(records, target.fields)
        stored = [F.unix_millis("timestamp").alias("timestamp"), *_fields(target)]
    deleted = F.col(DELETE_COLUMN) if target.value_format == "debezium" else F.col("value").isNull()
    extra = []
    if target.mode == "upsert":
        extra = [
            _log_time(log_times or {}).alias(LOG_TIME),
            deleted.alias(TOMBSTONE),
        ]
    shaped = records.select(
        "topic",
        "partition",
        "offset",
        "key",
        *stored,
        *extra,
        F.col("value").alias(RAW),
        size.alias(BYTES),
        _rejection(target, max_record_bytes, avro).alias(ERROR),
    )
    return _rules_kept(shaped, target)


def _rules_kept(shaped: DataFrame, target: Target) -> DataFrame:
    """ERROR, for a row no other reason rejects, the first of the table's rules on rows
    (Target.row_rules) it breaks: false or NULL, as Delta reads a rule. A tombstone and a
    skipped change event are no row the table takes: no rule is asked of them. A rule Spark
    cannot read or resolve on the table's columns refuses the import before anything of the
    batch is written."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    if not target.row_rules:
        return shaped
    taken = F.col(ERROR).isNull()
    if target.mode == "upsert":
        taken = taken & ~F.col(TOMBSTONE)
    if target.value_format == "debezium":
        taken = taken & ~F.col(SKIP_COLUMN)
    broken = F.lit(None).cast("string")
    try:
        for rule in reversed(target.row_rules):
            holds = F.coalesce(F.expr(rule.condition).cast("boolean"), F.lit(False))
            broken = F.when(~holds, F.lit(rule.broken)).otherwise(broken)
        return shaped.withColumn(ERROR, F.when(taken, broken).otherwise(F.col(ERROR)))
    except AnalysisException as exc:
        rule = next(r for r in target.row_rules if not _resolves(shaped, r.condition))
        raise BadInput(
            f"table {target.table!r} sets the rule {rule.name} ({rule.condition}) on its rows, "
            f"which Spark cannot evaluate on them: {first_line(exc)}"
        ) from None


def _resolves(shaped: DataFrame, condition: str) -> bool:
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    try:
        shaped.select(F.expr(condition))
    except AnalysisException:
        return False
    return True


def _log_time(carried: Mapping[TP, int]) -> Column:
    """A record's log time: the newest timestamp of its partition up to it, in this batch and
    before (`carried`, per partition; a partition not listed starts from none)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    up_to_here = (
        Window.partitionBy("topic", "partition")
        .orderBy("offset")
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    running = F.max(F.unix_millis("timestamp")).over(up_to_here)
    if not carried:
        return running
    return F.greatest(running, F.expr(carried_log_time_sql(carried)))


def carried_log_time_sql(carried: Mapping[TP, int]) -> str:
    """SQL: the row's partition's entry of `carried`, NULL for one not listed. A map per topic,
    which Spark folds into one literal: its generated code holds the map by reference, so
    every batch runs the code the first compiled, and a row looks its partition up. (A CASE
    of a branch per partition, its times inlined, was compiled again for each batch, and
    each row tried every branch: a fifth of a mirror's 100k-event import on 64 partitions.)"""
    by_topic: dict[str, list[str]] = {}
    for (topic, partition), ms in sorted(carried.items()):
        by_topic.setdefault(topic, []).extend([str(int(partition)), f"{int(ms)}L"])
    maps = ", ".join(f"{sql_string(t)}, map({', '.join(kv)})" for t, kv in by_topic.items())
    return f"try_element_at(try_element_at(map({maps}), topic), partition)"


def sql_string(text: str) -> str:
    """A Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def accepted(shaped: DataFrame, target: Target) -> DataFrame:
    """Rows for the target; in upsert mode only the newest record of each key, a tombstone
    included (coalescing): the one of the highest rank (upsert_order.py), the sinks' rule."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rows = shaped.where(F.col(ERROR).isNull())
    if target.value_format == "debezium":
        rows = _carried_in_batch(rows.where(~F.col(SKIP_COLUMN)), target)
    rows = rows.select(*target.row_columns)
    if target.mode != "upsert":
        return rows
    newest_first = Window.partitionBy(*target.unique).orderBy(
        *(F.col(name).desc() for name in RANK)
    )
    ranked = rows.withColumn(_RANK, F.row_number().over(newest_first))
    if not target.marks:
        return ranked.where(F.col(_RANK) == 1).drop(_RANK)
    # A delete that begins a key change is kept for its move though a later event of its key
    # outranks it (MOVE_ONLY; the store keeps the first of each: key_change.py).
    return (
        ranked.where((F.col(_RANK) == 1) | F.col(key_change.MOVES).isNotNull())
        .withColumn(key_change.MOVE_ONLY, F.col(_RANK) != 1)
        .drop(_RANK)
    )


def _carried_in_batch(rows: DataFrame, target: Target) -> DataFrame:
    """Debezium, in upsert mode: what a key's earlier events of the batch give its later ones
    before coalescing keeps only the newest (the store does the same across batches).

    - A column an update left UNAVAILABLE (TOASTed, unchanged) takes the key's latest earlier
      value of the batch; or, where the latest earlier event is a create that takes a key
      change, that change (TAKES), or where it is a delete, nothing ("": cdc/key_change.py,
      change_files.py `_carried_in_batch` alike); the store keeps its own only for what no
      earlier event reaches.
    - --deletes soft: a delete after the key's create or update in the same batch becomes that
      row flagged _deleted (the store never held it, so its soft delete would flag nothing).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    assert target.fields is not None
    if target.mode != "upsert":
        return rows
    by_key = Window.partitionBy(*target.unique, "partition").orderBy("offset")
    earlier = by_key.rowsBetween(Window.unboundedPreceding, -1)
    takes = F.col(key_change.TAKES)
    carried, found = {}, []
    for name, data_type in kept_columns(target.fields, target.unique):
        column = F.col(name)
        nested = unavailable_json(data_type)
        if nested is None:
            unavailable = F.coalesce(column == F.lit(unavailable_value(data_type)), F.lit(False))
        else:  # maps have no equality in Spark: their JSON text, as the SQL stores hold it
            unavailable = F.coalesce(F.to_json(column) == F.lit(nested), F.lit(False))
        nothing = F.lit(None).cast(data_type).alias("v")
        source = (
            F.when(F.col(TOMBSTONE), F.struct(nothing, F.lit("").alias("t")))
            .when(~unavailable, F.struct(column.alias("v"), F.lit(None).cast("string").alias("t")))
            .when(takes.isNotNull(), F.struct(nothing, takes.alias("t")))
        )
        known = F.last(source, True).over(earlier)
        filling = unavailable & takes.isNull() & known.isNotNull()
        carried[name] = F.when(filling & known["t"].isNull(), known["v"]).otherwise(column)
        found.append(F.when(filling, known["t"]))
    if found:
        carried[key_change.TAKES] = F.coalesce(takes, *found)
        rows = rows.select(*(carried.get(c, F.col(c)).alias(c) for c in rows.columns))
    if target.deletes != "soft":
        return rows
    own = (*envelope.CDC_COLUMNS, envelope.DELETED, *key_change.MARK_COLUMNS)
    values = [n for n in target.fields.fieldNames() if n not in (*target.unique, *own)]
    prior = F.last(F.when(~F.col(TOMBSTONE), F.struct(*values)), True).over(earlier)
    rows = rows.withColumn(_PRIOR, prior)
    after_a_row = F.col(TOMBSTONE) & F.col(_PRIOR).isNotNull()
    flagged = {n: F.when(after_a_row, F.col(_PRIOR)[n]).otherwise(F.col(n)) for n in values}
    flagged[TOMBSTONE] = F.col(TOMBSTONE) & F.col(_PRIOR).isNull()
    return rows.select(*(flagged.get(c, F.col(c)).alias(c) for c in rows.columns if c != _PRIOR))


def dead_letters(shaped: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    rejected = shaped.where(F.col(ERROR).isNotNull())
    return rejected.select(
        "topic",
        "partition",
        "offset",
        "timestamp",
        "key",
        F.col(RAW).alias("value"),
        F.lit(VALIDATE).alias("stage"),
        F.col(ERROR).alias("error"),
    ).select(*DEAD_LETTER_COLUMNS)
