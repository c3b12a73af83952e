"""Each of lagless's errors, raised inside a real Spark task (local, and on a Spark Connect
server's executors), reaches the CLI as its class and exit code: exceptions.crossing_spark's
marker through Spark's wrapping, read by importer/job.py's stopped_by."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lagless.cli import main as cli
from lagless.exceptions import _BY_NAME, LaglessError, TransientError, crossing_spark
from lagless.importer.job import stopped_by

pytestmark = pytest.mark.spark

EXIT_CODES = {cls: cli.exit_code(cls("m")) for cls in _BY_NAME.values()}


def _failing_job(session: Any, raised: type[LaglessError]) -> BaseException:
    """Run a one-row job whose task raises `raised`; the exception the driver gets."""

    def task(batches: Iterator[Any]) -> Iterator[Any]:
        with crossing_spark():
            for _ in batches:
                raise raised("raised in a task")
        yield from ()

    frame = session.range(1, numPartitions=1)
    with pytest.raises(Exception) as failed:
        frame.mapInArrow(task, frame.schema).collect()
    return failed.value


def _subclass_elsewhere() -> type[LaglessError]:
    # A TransientError subclass no marker names (as a store's own class would be): defined in
    # a function so that cloudpickle sends it by value to the worker.
    class AwayAWhile(TransientError):
        pass

    return AwayAWhile


@pytest.mark.parametrize("cls", sorted(_BY_NAME.values(), key=lambda c: c.__name__))
def test_each_error_keeps_its_class_out_of_a_local_task(spark, cls: type[LaglessError]) -> None:
    found = stopped_by(_failing_job(spark, cls))
    assert type(found) is cls and "raised in a task" in str(found)
    assert cli.exit_code(found) == EXIT_CODES[cls]


def test_an_unnamed_subclass_crosses_as_its_nearest_base(spark) -> None:
    found = stopped_by(_failing_job(spark, _subclass_elsewhere()))
    assert type(found) is TransientError
    assert cli.exit_code(found) == 75


@pytest.fixture(scope="module")
def remote(connect_server):  # type: ignore[no-untyped-def]
    # Connect's own session class: pyspark's builder refuses a remote session beside the local
    # one the other tests of this process share.
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    session = RemoteSession.builder.remote(connect_server.url).getOrCreate()
    yield session
    session.stop()


@pytest.mark.parametrize("cls", sorted(_BY_NAME.values(), key=lambda c: c.__name__))
def test_each_error_keeps_its_class_out_of_a_connect_servers_task(
    remote, cls: type[LaglessError]
) -> None:
    found = stopped_by(_failing_job(remote, cls))
    assert type(found) is cls and "raised in a task" in str(found)
    assert cli.exit_code(found) == EXIT_CODES[cls]


def test_an_unnamed_subclass_crosses_a_connect_server_as_its_nearest_base(remote) -> None:
    found = stopped_by(_failing_job(remote, _subclass_elsewhere()))
    assert type(found) is TransientError and cli.exit_code(found) == 75
