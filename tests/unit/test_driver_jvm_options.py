"""The driver JVM's options: the class archive, the log settings, and the optimizing compiler
left out where the JVM moves no records (importer/spark.py)."""

from __future__ import annotations

import pytest

from lagless.importer.spark import QUICK_START_JIT, driver_java_options
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig


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
    assert (spec.executor_writer() is not None) is tasks_write
