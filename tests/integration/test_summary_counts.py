"""The summary counts what the table gained (issue 31.5): "written" is the rows the table
gained or replaced, the same in every store; a batch the ledger held already is counted apart
("already in the table"), not as imported."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from lagless.gen import explicit, produce_profile
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.progress import Summary
from tests.integration.test_crash_safety import stored

pytestmark = pytest.mark.spark

KEYS = 10


# SQLite (the default store) in CI; the others with the matrix (scripts/test).
@pytest.mark.parametrize(
    "store",
    [
        "sqlite",
        *(pytest.param(s, marks=pytest.mark.matrix) for s in ("delta", "iceberg", "postgresql")),
    ],
)
def test_an_upsert_writes_the_same_count_in_every_store(
    broker, kafka, topic_name, tmp_path, spark, store, request
):
    """30 records over (up to) 10 keys in one batch: a row gained per key, whatever the store
    (SQLite said 10, Delta and Iceberg 30). One record a batch: each replaces its key's row
    or is a new one, 30."""
    broker.create_topic(topic_name, 1)
    keys = len(produce_profile(kafka, topic_name, explicit([30]), keys=KEYS).newest_by_key())
    url = f"{store}:///{tmp_path}/{'out.db' if store == 'sqlite' else 'lake'}"
    if store == "postgresql":
        url = request.getfixturevalue("postgres").url

    def imported(name: str, **options: object) -> tuple[int, int]:
        summary = run_import(
            ImportSpec(
                kafka=kafka,
                topics=(topic_name,),
                sink_url=url,
                checkpoint=str(tmp_path / name),
                table=f"{topic_name}_{name}",
                write="upsert",
                **options,  # type: ignore[arg-type]
            ),
            spark=spark,
        )
        assert len(stored(url, f"{topic_name}_{name}", ("key",))) == keys
        return summary.imported, summary.written

    assert imported("whole") == (30, keys)
    if store in ("sqlite", "postgresql"):  # the batching measured (35 written for 30 read)
        assert imported("one_by_one", max_records_per_batch=1) == (30, 30)


def test_two_imports_of_the_same_records_count_each_record_imported_once(
    broker, kafka, topic_name, tmp_path, spark
):
    """Two imports into one table at once, each with its checkpoint (they read the table's
    ledger before either committed): every batch is committed by one and is a replay for the
    other, which counts it as already in the table. Before, both said imported and written 50
    for a table that gained 50."""
    broker.create_topic(topic_name, 2)
    produce_profile(kafka, topic_name, explicit([30, 20]))
    url = f"parquet:///{tmp_path}/lake"

    def imported(name: str) -> Summary:
        spec = ImportSpec(
            kafka=kafka,
            topics=(topic_name,),
            sink_url=url,
            checkpoint=str(tmp_path / name),
            max_records_per_batch=10,
        )
        return run_import(spec, spark=spark)

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(imported, ["a", "b"])

    assert a.imported + b.imported == 50  # the table gained 50, counted once
    assert a.written + b.written == 50
    # What each read beyond what it imported was in the table already (the other's).
    assert (a.already_in_table, b.already_in_table) == (
        a.records - a.imported,
        b.records - b.imported,
    )
    assert len(stored(url, topic_name, ("offset",))) == 50
