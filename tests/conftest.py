"""Shared fixtures: the embedded broker over TCP and one local Spark session per test run (per
worker under pytest-xdist: tests/harness/schedule.py splits the run)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest
from hypothesis import settings

from lagless.broker import EmbeddedBroker
from lagless.kafka.config import KafkaConfig
from tests.harness import schedule

# No per-example deadline: on a loaded 2-core machine an example can take a second without any
# fault of the code; the properties, not their speed, are what the tests assert.
settings.register_profile("lagless", deadline=None)
settings.load_profile("lagless")

_names = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    schedule.configure(config)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Groups for pytest-xdist and the slowest work first, when workers share the run
    (tests/harness/schedule.py); a run without workers keeps the collection's order."""
    schedule.assign_groups(items)
    if hasattr(config, "workerinput"):
        items[:] = schedule.slowest_first(items, schedule.recorded())
        schedule.write_groups(config, items)


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture
def kafka(broker: EmbeddedBroker) -> KafkaConfig:
    return KafkaConfig(broker.bootstrap)


@pytest.fixture
def topic_name() -> str:
    return f"topic_{next(_names)}"


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    from lagless.importer.spark import spark_session

    session = spark_session("local[2]", parallelism=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def postgres():  # type: ignore[no-untyped-def]
    from tests.harness.postgres import PostgresServer

    server = PostgresServer.start_new()
    yield server
    server.destroy()


@pytest.fixture(scope="session")
def noida():  # type: ignore[no-untyped-def]
    """noida-db's Kafka, a broker with a real group coordinator (tests/harness/noida.py)."""
    from tests.harness.noida import NoidaKafka

    server = NoidaKafka.start_new()
    yield server
    server.destroy()


@pytest.fixture(scope="session")
def connect_server():  # type: ignore[no-untyped-def]
    """pyspark's Spark Connect server on a free port (tests/harness/connect.py)."""
    from tests.harness.connect import ConnectServer

    server = ConnectServer.start_new()
    yield server
    server.destroy()


@pytest.fixture(scope="session")
def s3():  # type: ignore[no-untyped-def]
    """A real S3 server, SeaweedFS on loopback (tests/harness/s3.py): `.endpoint`, `.bucket`,
    `.env()` (the AWS variables a client needs), `.url(store, prefix)`."""
    from tests.harness.s3 import SeaweedS3

    with SeaweedS3.start_new() as server:
        yield server


@pytest.fixture
def s3_env(s3, monkeypatch):  # type: ignore[no-untyped-def]
    """The S3 server's AWS variables set for this test (and the imports it starts)."""
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    return s3
