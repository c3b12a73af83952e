"""Which stores a cluster master's executors can write without the driver's disk, and how the
executors' Python is found in spark.archives."""

from __future__ import annotations

import pytest

from lagless.cli.import_ import spark_setting
from lagless.exceptions import BadInput
from lagless.importer.cluster import check_tasks_reach_store, executors_share_disk
from lagless.sinks import Target, sink_from_url
from lagless.source.worker_python import archive_alias

APPEND = Target("t", "append", "raw")
CLUSTER = "spark://10.0.0.5:7077"


@pytest.mark.parametrize(
    "master", ["local", "local[*]", "local[2]", "local[2,3]", "sc://127.0.0.1:15002"]
)
def test_a_local_master_shares_the_drivers_disk(master: str) -> None:
    assert executors_share_disk(master, shared_disk=False)


@pytest.mark.parametrize(
    "master", [CLUSTER, "yarn", "k8s://https://api:6443", "localhost", "sc://spark-host:15002"]
)
def test_any_other_master_does_not_unless_told(master: str) -> None:
    assert not executors_share_disk(master, shared_disk=False)
    assert executors_share_disk(master, shared_disk=True)


@pytest.mark.parametrize(
    "url", ["sqlite:///db.sqlite", "parquet:///lake", "delta:///lake", "iceberg:///lake"]
)
def test_stores_written_into_the_drivers_folders_are_refused_on_a_cluster(url: str) -> None:
    with pytest.raises(BadInput, match="may not see") as raised:
        check_tasks_reach_store(CLUSTER, False, sink_from_url(url), APPEND, tasks_write=True)
    assert "\n" not in str(raised.value)
    check_tasks_reach_store(CLUSTER, True, sink_from_url(url), APPEND, tasks_write=True)
    check_tasks_reach_store("local[*]", False, sink_from_url(url), APPEND, tasks_write=True)


def test_sqlite_is_refused_only_when_the_tasks_stage_for_it() -> None:
    sqlite = sink_from_url("sqlite:///db.sqlite")
    check_tasks_reach_store(CLUSTER, False, sqlite, APPEND, tasks_write=False)  # JSON, upsert


def test_postgresql_is_written_over_the_network_from_any_cluster() -> None:
    postgres = sink_from_url("postgresql://u@db:5432/x")
    check_tasks_reach_store(CLUSTER, False, postgres, APPEND, tasks_write=True)


@pytest.mark.parametrize(
    ("executable", "archives", "alias"),
    [
        ("./env/bin/python", "/tmp/env.tar.gz#env", "env"),
        ("env/bin/python", "hdfs:///a.zip#x, /tmp/env.tar.gz#env", "env"),
        ("./env.tar.gz/bin/python", "/tmp/env.tar.gz", "env.tar.gz"),  # no alias: its name
        ("./other/bin/python", "/tmp/env.tar.gz#env", None),
        ("/opt/env/bin/python", "/tmp/env.tar.gz#env", None),
        ("./env/bin/python", None, None),
        ("python3", "/tmp/env.tar.gz#env", None),
    ],
)
def test_a_worker_python_inside_an_archive(
    executable: str, archives: str | None, alias: str | None
) -> None:
    assert archive_alias(executable, archives) == alias


def test_spark_settings_are_key_value_pairs() -> None:
    assert spark_setting("spark.archives=a.tar.gz#env") == ("spark.archives", "a.tar.gz#env")
    assert spark_setting("spark.x=a=b") == ("spark.x", "a=b")
    for bad in ("archives=a", "spark.archives", "=x"):
        with pytest.raises(BadInput):
            spark_setting(bad)


@pytest.mark.parametrize(
    "url",
    [
        "parquet+s3://bucket/lake",
        "delta+s3://bucket/lake",
        "iceberg+s3://bucket/warehouse?catalog=/tmp/catalog.db",  # the catalog: the driver's
        "iceberg+rest://catalog:8181/warehouse",
    ],
)
def test_tables_on_s3_are_written_from_any_cluster(url: str) -> None:
    check_tasks_reach_store(CLUSTER, False, sink_from_url(url), APPEND, tasks_write=True)
