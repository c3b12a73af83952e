"""The Sink contract (sinks/base.py): every store takes rows through Spark (Sink); a store the
source's tasks may write into is a TaskWrittenSink too, and the importer picks the task path by
that type and the target, nothing else."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pytest

from lagless.importer.spec import ImportSpec
from lagless.importer.write_path import Way
from lagless.kafka.config import KafkaConfig
from lagless.sinks import sink_from_url
from lagless.sinks.base import Sink, Target, TaskWrittenSink
from lagless.sinks.ledger import TP, Batch
from lagless.source.executor_write import TASK_WRITERS
from tests.harness.plans import offline_plan, tasks_writer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class RowsOnlySink(Sink):
    """A store with no task path: the smallest Sink there is."""

    scheme = "rows"

    def check(self, target: Target) -> None:
        pass

    def prepare(self, target: Target) -> None:
        pass

    def ledger(self, target: Target, partitions: list[TP]) -> dict[TP, int]:
        return {}

    def write(
        self, rows: DataFrame, target: Target, batch: Batch, before_commit: Callable[[], None]
    ) -> None:
        pass

    def write_dead_letters(self, rows: DataFrame, target: Target, batch: Batch) -> None:
        pass


def spec(sink_url: str, **options: Any) -> ImportSpec:
    return ImportSpec(KafkaConfig("127.0.0.1:9"), ("t",), sink_url, "/tmp/ckpt", **options)


@pytest.mark.parametrize(
    "url", ["sqlite:///x.db", "parquet:///lake", "delta:///lake", "iceberg:///lake"]
)
def test_the_tasks_write_a_raw_append_into_a_task_written_store(url: str) -> None:
    writer = tasks_writer(spec(url))
    assert writer is not None and writer.name in TASK_WRITERS  # the source loads it
    assert offline_plan(spec(url)).write_path.way is Way.TASK_FILES
    assert tasks_writer(spec(url, value_format="json")) is None
    assert tasks_writer(spec(url, max_record_bytes=10)) is None
    assert offline_plan(spec(url, max_record_bytes=10)).write_path.way is Way.ROWS


@pytest.mark.parametrize(
    "url", ["parquet:///lake", "delta:///lake", "iceberg:///lake", "sqlite:///x.db"]
)
def test_the_tasks_write_a_typed_append(url: str) -> None:
    """Where the tasks decode the value's fields (JSON as Spark would, Avro) into columns of
    Spark's own types (json_values.decodable): they write the rows, a dead-letter topic or not
    (what they cannot decode they leave to Spark's rows). Not an upsert, not a size limit, not
    other field types, not JSON text without a schema."""
    from pyspark.sql.types import (
        BooleanType,
        DateType,
        DoubleType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    sink = sink_from_url(url)
    types = [LongType(), StringType(), DoubleType(), BooleanType(), IntegerType()]
    plain = StructType([StructField(f"f{i}", t, i > 0) for i, t in enumerate(types)])
    typed = replace(spec(url).target(sink), value_format="json", fields=plain)
    json_spec = spec(url, value_format="json")

    def writes(options: ImportSpec, target: Target, store: Sink = sink) -> bool:
        return tasks_writer(options, target, store) is not None

    assert writes(json_spec, typed)
    assert writes(spec(url, value_format="json", dead_letter_topic="dlt"), typed)
    assert not writes(spec(url, value_format="json", max_record_bytes=10), typed)
    upsert = replace(typed, mode="upsert")
    assert not writes(spec(url, value_format="json", write="upsert"), upsert)
    dated = replace(typed, fields=StructType([*plain.fields, StructField("day", DateType())]))
    assert not writes(json_spec, dated)
    avro = replace(typed, value_format="avro")
    assert writes(spec(url, value_format="avro"), avro)
    dated_avro = replace(dated, value_format="avro")
    assert not writes(spec(url, value_format="avro"), dated_avro)
    assert not writes(spec(url, value_format="json"), replace(typed, fields=None))
    assert writes(json_spec, typed, sink_from_url("sqlite:///x.db"))
    assert not writes(json_spec, typed, sink_from_url("sqlite:///x.db?write_from=driver"))


def test_a_store_without_the_task_path_takes_every_batch_through_spark() -> None:
    rows_only = RowsOnlySink("rows:///x", "x")
    assert tasks_writer(spec("sqlite:///x.db"), sink=rows_only) is None


def test_a_task_written_store_that_gives_no_writer_takes_rows_through_spark() -> None:
    sink = sink_from_url("sqlite:///x.db?write_from=driver")
    assert isinstance(sink, TaskWrittenSink)
    assert tasks_writer(spec("sqlite:///x.db?write_from=driver"), sink=sink) is None
    assert offline_plan(spec("sqlite:///x.db?write_from=driver")).write_path.way is Way.ROWS


def test_a_task_written_store_must_commit_what_the_tasks_staged() -> None:
    """The task path's methods are abstract: a store missing one cannot be made."""

    class Half(RowsOnlySink, TaskWrittenSink):
        def executor_writer(self, target: Target, decoded: str | None = None) -> None:
            return None

        def discard_staged(self, target: Target) -> None:
            pass

    with pytest.raises(TypeError, match="commit_staged"):
        Half("rows:///x", "x")  # type: ignore[abstract]


def test_a_table_with_rules_on_rows_takes_them_through_spark() -> None:
    """Spark evaluates a table's rules on rows (rows.py): neither the tasks' files nor a
    mirror's change files carry them."""
    from lagless.importer.write_path import takes_change_files
    from lagless.sinks.base import RowRule

    url = "delta:///lake"
    sink = sink_from_url(url)
    target = spec(url).target(sink)
    ruled = replace(target, row_rules=(RowRule("small", "offset < 10"),))
    assert tasks_writer(spec(url), target, sink) is not None
    assert tasks_writer(spec(url), ruled, sink) is None
    upsert = replace(target, mode="upsert")
    assert takes_change_files(sink, upsert)
    assert not takes_change_files(sink, replace(upsert, row_rules=ruled.row_rules))
    assert ruled.row_rules[0].broken == "breaks the table's rule small: offset < 10"
