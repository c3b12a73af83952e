"""The driver JVM's options: the class archive, the log settings, and the optimizing compiler
left out where the JVM moves no records (importer/spark.py)."""

from __future__ import annotations

import pytest

from lagless.importer.spark import QUICK_START_JIT, driver_java_options
from lagless.importer.spec import ImportSpec
from lagless.importer.write_path import table_writer
from lagless.kafka.config import KafkaConfig
from lagless.sinks import sink_from_url


def test_the_optimizing_compiler_is_left_out_only_when_no_record_passes_the_jvm() -> None:
    assert QUICK_START_JIT in driver_java_options(records_in_jvm=False).split()
    assert QUICK_START_JIT not in driver_java_options(records_in_jvm=True).split()
    # The log settings stay either way.
    assert "-Dlog4j2.configurationFile=" in driver_java_options(records_in_jvm=False)


@pytest.mark.parametrize(
    ("options", "tasks_write"),
    [
        ({}, True),  # raw values appended: the source's tasks write them
        ({"value_format": "json", "value_schema": "seq BIGINT"}, False),  # typed: from_json
        ({"write": "upsert"}, False),  # newest per key: Spark's windows
        ({"max_record_bytes": 10}, False),  # rejections: Spark's rows
    ],
)
def test_the_import_says_whether_its_records_pass_the_jvm(
    tmp_path, options: dict[str, object], tasks_write: bool
) -> None:
    spec = ImportSpec(
        kafka=KafkaConfig("localhost:9092"),
        topics=("t",),
        sink_url=f"parquet:///{tmp_path}/out",
        checkpoint=str(tmp_path / "ck"),
        **options,  # type: ignore[arg-type]
    )
    sink = sink_from_url(spec.sink_url)
    assert (table_writer(spec.write_options, sink, spec.target(sink)) is not None) is tasks_write


class _Started(Exception):
    """Raised where Spark would start: how it was asked to."""

    def __init__(self, records_in_jvm: bool) -> None:
        self.records_in_jvm = records_in_jvm


@pytest.mark.parametrize(
    ("options", "records_in_jvm"),
    [
        ({"value_format": "debezium", "write": "upsert"}, False),  # the tasks' change files
        ({"value_format": "debezium", "write": "upsert", "deletes": "soft"}, True),  # Spark's rows
        ({"value_format": "debezium", "write": "upsert", "max_record_bytes": 10}, True),
        ({"value_format": "json"}, True),  # typed: from_json
    ],
)
def test_spark_started_to_parse_a_value_schema_starts_as_the_import_wants_it(
    tmp_path, monkeypatch: pytest.MonkeyPatch, options: dict[str, object], records_in_jvm: bool
) -> None:
    """The session that parses --value-schema is the one the import's batches use: its JVM's
    options are set once, at its start."""
    import lagless.importer.spark as spark
    from lagless.importer.value_schema import resolve

    def started(*args: object, records_in_jvm: bool = True, **kwargs: object) -> None:
        raise _Started(records_in_jvm)

    monkeypatch.setattr(spark, "spark_session", started)
    spec = ImportSpec(
        kafka=KafkaConfig("localhost:9092"),
        topics=("db.public.accounts",),
        sink_url=f"delta:///{tmp_path}/lake",
        checkpoint=str(tmp_path / "ck"),
        value_schema="id INT, owner STRING",
        **options,  # type: ignore[arg-type]
    )
    with pytest.raises(_Started) as start:
        resolve(spec, sink_from_url(spec.sink_url), [("db.public.accounts", 0)])
    assert start.value.records_in_jvm is records_in_jvm
