"""Lakehouse tables other writers made or changed (issue 61): lagless either writes them by
their format's rules, read back by two independent readers (deltalake and polars; pyiceberg
and polars), or refuses them before anything is written, one line, exit 2. A Delta table's
CHECK constraints and invariants are kept: a record whose row breaks one is dead-lettered
alone, the others land.

The tables are made by delta-rs and pyiceberg, each with one feature, in a local folder or
under a prefix of a real S3 server (SeaweedFS, tests/harness/s3.py; an Iceberg warehouse there
keeps its SQLite catalog on the driver, as `iceberg+s3://...?catalog=PATH` says), imported
into from the embedded broker. A refusal before Spark starts is a real `lagless import` run
(its exit 2 and one line; ~2 s each, run side by side; that nothing was written is checked on
disk and in the bucket). The imports that need Spark (the tables written, and a rule Spark
cannot read, refused at the first batch) run in-process on the test run's shared session
(tests/conftest.py), as the CLI runs them: their tables and their error are what is judged.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pytest
from confluent_kafka import Producer

from lagless.broker import EmbeddedBroker
from lagless.exceptions import BadInput
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from tests.harness.s3 import SeaweedS3, reader_filesystem, reader_options

PARTITIONS = 2
RECORDS = 40  # per topic
# The columns of a raw append (sinks/base.py's Target.schema), as delta-rs and pyiceberg take
# them; topic, partition and offset are its key, so not nullable.
RAW = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", pa.int64()),
    ]
)
APPEND = "lagless --write append"  # what lagless's Delta tables are described as


@dataclass(frozen=True)
class Lake:
    """Where tables go: the local folder `folder`, or with `s3` (the server) the prefix `prefix`
    of its bucket, `folder` then holding only what stays on the driver (an Iceberg warehouse's
    SQLite catalog). Made, imported into, read and snapshot the same way in both places."""

    folder: Path
    s3: SeaweedS3 | None = None
    prefix: str = ""

    def below(self, name: str) -> Lake:
        """A lake of its own inside this one."""
        return Lake(self.folder / name, self.s3, f"{self.prefix}/{name}")

    @property
    def root(self) -> str:
        """The tables' folder: a local path or `s3://bucket/prefix`."""
        return str(self.folder) if self.s3 is None else f"s3://{self.s3.bucket}/{self.prefix}"

    def path(self, table: str) -> str:
        return f"{self.root}/{table}"

    @property
    def catalog_file(self) -> Path:
        """An Iceberg warehouse's SQL catalog: in the warehouse, or on the driver beside it."""
        return self.folder / "catalog.db"

    def sink(self, store: str) -> str:
        """lagless's sink URL for the tables of `store` (delta, iceberg) here."""
        if self.s3 is None:
            return f"{store}:///{self.folder}"
        catalog = f"?catalog={self.catalog_file}" if store == "iceberg" else ""
        return self.s3.url(store, self.prefix) + catalog

    @property
    def options(self) -> dict[str, str] | None:
        """deltalake's and polars' storage options."""
        return None if self.s3 is None else reader_options()

    def iceberg_properties(self) -> dict[str, str]:
        """pyiceberg's SqlCatalog, as lagless opens it (sinks/iceberg/): its warehouse, FileIO."""
        if self.s3 is None:
            return {"warehouse": f"file://{self.folder}"}
        options = reader_options()
        return {
            "warehouse": self.root,
            "s3.endpoint": options["endpoint"],
            "s3.access-key-id": options["access_key_id"],
            "s3.secret-access-key": options["secret_access_key"],
            "s3.region": options["region"],
        }

    def snapshot(self) -> list[tuple[str, int]]:
        """Every file and object stored here, with its size."""
        stored = [(str(p), p.stat().st_size) for p in self.folder.rglob("*")]
        if self.s3 is not None:
            from pyarrow.fs import FileSelector

            under = FileSelector(f"{self.s3.bucket}/{self.prefix}", True, recursive=True)
            found = reader_filesystem().get_file_info(under)
            stored += [(f"s3://{info.path}", info.size or 0) for info in found]
        return sorted(stored)


def lake_at(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> Lake:
    """The test's lake: `tmp_path`, or on S3 a prefix of its own (the catalog in `tmp_path`)."""
    if where == "local":
        return Lake(tmp_path)
    s3 = request.getfixturevalue("s3_env")  # its AWS variables reach the imports started
    return Lake(tmp_path, s3, tmp_path.name)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lagless", *args], capture_output=True, text=True, timeout=300
    )


def import_in_process(spark: Any, bootstrap: str, sink: str, ckpt: Path, *topics: str) -> None:
    """What `imported` asks the CLI for, run on the shared session."""
    spec = ImportSpec(
        kafka=KafkaConfig(bootstrap),
        topics=(),
        topic_pattern="|".join(topics),
        sink_url=sink,
        checkpoint=str(ckpt),
        table="{topic}",
    )
    run_import(spec, spark=spark)


def imported(bootstrap: str, sink: str, ckpt: Path, *topics: str) -> list[str]:
    """`lagless import` of the topics (a pattern), each into the table named after it."""
    return [
        "import",
        "--bootstrap",
        bootstrap,
        "--topic-pattern",
        "|".join(topics),
        "--table",
        "{topic}",
        "--sink",
        sink,
        "--checkpoint",
        str(ckpt),
    ]


@pytest.fixture(scope="module")
def corpus_broker():
    topics = ["refused", "d_extra", "d_part", "d_checked", "i_sorted", "i_v1"]
    with EmbeddedBroker(topics=dict.fromkeys(topics, PARTITIONS)) as running:
        producer = Producer({"bootstrap.servers": running.bootstrap})
        for topic in topics:
            for n in range(RECORDS):
                producer.produce(
                    topic, key=f"k{n}".encode(), value=f"v{n}".encode(), partition=n % 2
                )
        producer.flush(30)
        yield running


def expected() -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of each record of a topic, once."""
    per = [0] * PARTITIONS
    rows = []
    for n in range(RECORDS):
        rows.append((n % 2, per[n % 2], f"v{n}".encode()))
        per[n % 2] += 1
    return sorted(rows)


def refused(
    bootstrap: str, root: Lake, store: str, cases: dict[str, tuple[Callable, str]]
) -> list[str]:
    """Each case's table made by `make(lake)` in a lake of its own, then imported into: what
    went wrong, where the import did not refuse it in one line (saying `says`, exit 2) with
    nothing written (the lake and the checkpoint as they were)."""

    def run(name: str, make: Callable, says: str) -> str | None:
        case = root.below(name)
        lake = case.below("lake")
        lake.folder.mkdir(parents=True)
        make(lake)
        before = case.snapshot()
        args = imported(bootstrap, lake.sink(store), case.folder / "ckpt", "refused")
        args[args.index("{topic}")] = name
        result = run_cli(*args)
        lines = result.stderr.strip().splitlines()
        if result.returncode == 2 and len(lines) == 1 and says in lines[0]:
            return None if case.snapshot() == before else f"{name}: written to"
        return f"{name}: exit {result.returncode}, {result.stderr!r}"

    with ThreadPoolExecutor(max_workers=3) as pool:
        found = pool.map(lambda item: run(item[0], *item[1]), cases.items())
        return [failure for failure in found if failure is not None]


def delta(lake: Lake, name: str):
    """A Delta table of the lake, through deltalake."""
    from deltalake import DeltaTable

    return DeltaTable(lake.path(name), storage_options=lake.options)


def delta_table(lake: Lake, name: str, schema: Any = RAW, **options: Any) -> str:
    from deltalake import DeltaTable

    path = lake.path(name)
    DeltaTable.create(
        path, schema=schema, description=APPEND, storage_options=lake.options, **options
    )
    return path


def with_rules(lake: Lake, name: str) -> str:
    """A lagless-described table with a CHECK constraint (offset < 10) and an invariant
    (partition 0 or 1, on the column), as delta-rs makes them."""
    from deltalake import Field, Schema

    fields = [
        Field(
            f.name,
            f.type,
            nullable=f.nullable,
            metadata={"delta.invariants": INVARIANT} if f.name == "partition" else None,
        )
        for f in Schema.from_arrow(RAW).fields
    ]
    path = delta_table(lake, name, Schema(fields))
    delta(lake, name).alter.add_constraint({"off_small": "offset < 10"})
    return path


INVARIANT = '{"expression": {"expression": "partition IN (0, 1)"}}'
BROKEN = "breaks the table's rule off_small: offset < 10"


def with_generated(lake: Lake) -> None:
    from deltalake import Field, Schema
    from deltalake.schema import PrimitiveType

    fields = Schema.from_arrow(RAW).fields
    doubled = Field(
        "doubled", PrimitiveType("long"), metadata={"delta.generationExpression": "offset * 2"}
    )
    delta_table(lake, "generated", Schema([*fields, doubled]))


def with_deletion_vectors(lake: Lake) -> None:
    from deltalake.table import TableFeatures

    delta_table(lake, "vectors")
    delta(lake, "vectors").alter.add_feature(
        TableFeatures.DeletionVectors, allow_protocol_versions_increase=True
    )


DELTA_REFUSED: dict[str, tuple[Callable, str]] = {
    "by_topic": (
        lambda lake: delta_table(lake, "by_topic", partition_by=["topic"]),
        "it is partitioned by topic, of a type lagless does not split by",
    ),
    "generated": (with_generated, "generated columns (doubled)"),
    "mapped": (
        lambda lake: delta_table(
            lake, "mapped", configuration={"delta.columnMapping.mode": "name"}
        ),
        "it maps column names (delta.columnMapping.mode=name)",
    ),
    "required": (
        lambda lake: delta_table(
            lake, "required", RAW.append(pa.field("note", pa.string(), False))
        ),
        "its columns note are not nullable",
    ),
    "vectors": (with_deletion_vectors, "deletionVectors"),
}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_delta_tables_of_other_writers_refused_up_front_or_written_by_their_rules(
    corpus_broker, tmp_path, request, where, spark
):
    root = lake_at(where, tmp_path, request)
    failures = refused(corpus_broker.bootstrap, root, "delta", DELTA_REFUSED)
    assert not failures, failures

    # A nullable column lagless's rows lack: NULL in the rows it appends. A table partitioned
    # by an integer column: each file under its partition's folder, its value in the log.
    lake = root.below("written")
    extra = delta_table(lake, "d_extra", RAW.append(pa.field("note", pa.string())))
    part = delta_table(lake, "d_part", partition_by=["partition"])
    checked = with_rules(lake, "d_checked")
    topics = ("d_extra", "d_part", "d_checked")
    import_in_process(spark, corpus_broker.bootstrap, lake.sink("delta"), tmp_path / "c", *topics)

    # Rules kept: the records of offset 10 and above are dead letters, each with its reason;
    # the others are the table's rows, as both readers read them.
    kept = [row for row in expected() if row[1] < 10]
    by_both = (
        pl.from_arrow(delta(lake, "d_checked").to_pyarrow_table()),
        pl.read_delta(checked, storage_options=lake.options),
    )
    for frame in by_both:
        assert isinstance(frame, pl.DataFrame)
        assert sorted(frame.select("partition", "offset", "value").iter_rows()) == kept
    dead = pl.read_delta(lake.path("d_checked_dlq"), storage_options=lake.options)
    assert sorted(dead.select("partition", "offset").iter_rows()) == [
        (p, o) for p, o, _ in expected() if o >= 10
    ]
    assert set(dead["error"]) == {BROKEN}
    rules = delta(lake, "d_checked").metadata().configuration
    assert rules["delta.constraints.off_small"] == "offset < 10"  # still the table's rule

    # A rule in words Spark has not (a DataFusion function): refused at the first batch, as
    # bad input (the CLI's exit 2) in one line, the table as it was.
    odd = root.below("odd")
    delta_table(odd, "refused")
    delta(odd, "refused").alter.add_constraint({"typed": "arrow_typeof(offset) = 'Int64'"})
    before = odd.snapshot()
    with pytest.raises(BadInput) as refusal:
        import_in_process(
            spark, corpus_broker.bootstrap, odd.sink("delta"), tmp_path / "c2", "refused"
        )
    told = str(refusal.value)
    assert "\n" not in told, told
    assert "sets the rule typed (arrow_typeof(offset) = 'Int64') on its rows" in told
    assert odd.snapshot() == before

    for name, path in (("d_extra", extra), ("d_part", part)):
        by_deltalake = pl.from_arrow(delta(lake, name).to_pyarrow_table())
        by_polars = pl.read_delta(path, storage_options=lake.options)
        for frame in (by_deltalake, by_polars):
            assert isinstance(frame, pl.DataFrame)
            assert sorted(frame.select("partition", "offset", "value").iter_rows()) == expected()
        assert path == part or by_polars["note"].null_count() == RECORDS
    added = pl.from_arrow(pa.table(delta(lake, "d_part").get_add_actions(flatten=True)))
    assert isinstance(added, pl.DataFrame)
    for path, value in added.select("path", "partition.partition").iter_rows():
        assert path.startswith(f"partition={value}/"), (path, value)


def iceberg_catalog(lake: Lake):
    """The lake's warehouse as lagless opens it: pyiceberg's SQL catalog `lagless` in the
    lake's catalog file, its tables in the namespace `default`."""
    from pyiceberg.catalog.sql import SqlCatalog

    lake.folder.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{lake.catalog_file}"
    catalog = SqlCatalog("lagless", uri=uri, **lake.iceberg_properties())
    catalog.create_namespace_if_not_exists("default")
    return catalog


def iceberg_table(lake: Lake, name: str, properties: dict[str, str] | None = None):
    """A table lagless would take as its own (its write mode, a raw append's columns)."""
    properties = {"lagless.write": "append", **(properties or {})}
    return iceberg_catalog(lake).create_table(("default", name), schema=RAW, properties=properties)


def partitioned_iceberg(lake: Lake) -> None:
    from pyiceberg.transforms import IdentityTransform

    table = iceberg_table(lake, "partitioned")
    with table.update_spec() as spec:
        spec.add_field("partition", IdentityTransform(), "partition")


def identified(lake: Lake, name: str, fields: list[str]):
    table = iceberg_table(lake, name)
    with table.update_schema() as update:
        update.set_identifier_fields(*fields)
    return table


ICEBERG_REFUSED: dict[str, tuple[Callable, str]] = {
    "partitioned": (partitioned_iceberg, "it is partitioned (partition: identity)"),
    "identified": (
        lambda lake: identified(lake, "identified", ["topic", "partition", "offset"]),
        "it has identifier fields (offset, partition, topic), which must be required",
    ),
}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_iceberg_tables_of_other_writers_refused_up_front_or_written_by_their_rules(
    corpus_broker, tmp_path, request, where, spark
):
    from pyiceberg.transforms import IdentityTransform

    root = lake_at(where, tmp_path, request)
    failures = refused(corpus_broker.bootstrap, root, "iceberg", ICEBERG_REFUSED)
    assert not failures, failures

    # Written: a sort order (files may be written unsorted, and say so), format version 1.
    lake = root.below("written")
    sorted_table = iceberg_table(lake, "i_sorted")
    with sorted_table.update_sort_order() as order:
        order.asc("offset", IdentityTransform())
    iceberg_table(lake, "i_v1", properties={"format-version": "1"})
    topics = ("i_sorted", "i_v1")
    import_in_process(spark, corpus_broker.bootstrap, lake.sink("iceberg"), tmp_path / "c", *topics)

    catalog = iceberg_catalog(lake)
    for name in topics:
        table = catalog.load_table(("default", name))
        by_pyiceberg = pl.from_arrow(table.scan().to_arrow())
        by_polars = pl.scan_iceberg(table, storage_options=lake.options).collect()
        for frame in (by_pyiceberg, by_polars):
            assert isinstance(frame, pl.DataFrame)
            assert sorted(frame.select("partition", "offset", "value").iter_rows()) == expected(), (
                name
            )
        files = [task.file for task in table.scan().plan_files()]
        assert files and all(f.sort_order_id in (None, 0) for f in files), name  # unsorted
    assert catalog.load_table(("default", "i_v1")).metadata.format_version == 1
