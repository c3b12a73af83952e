"""A SIGTERM to an import's process group reaches Spark's JVM too, which may end before lagless
has finished its stop: py4j then cannot reach it. After a stop request that is the stop's
doing (the import ends as stopped, the batch in flight replayed by the next run); without one
it is a failure, raised. The query here is a stand-in for Spark's (its awaitTermination
raising what py4j raises with the JVM gone): the real case, a group signal racing the JVM's
end, is tests/integration/test_shared_tables.py's and test_mirror_service.py's."""

from __future__ import annotations

import signal
from typing import Any, ClassVar

import pytest
from py4j.protocol import Py4JNetworkError

from lagless.importer.job import _await, jvm_gone
from lagless.signals import StopFile, StopRequest


class JvmGone:
    """A query whose JVM has ended: every wait on it fails as py4j fails."""

    isActive = True
    status: ClassVar[dict[str, Any]] = {"isTriggerActive": True}

    def exception(self) -> None:
        return None

    def awaitTermination(self, _timeout: float) -> None:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError as refused:
            raise Py4JNetworkError("An error occurred while trying to connect") from refused


class Writer:
    failure = None
    done = 0
    tasks_running = False

    def refresh(self) -> None:
        pass


def test_the_jvm_gone_after_a_stop_request_ends_the_wait(tmp_path) -> None:
    stop = StopRequest()
    stop.record(signal.SIGTERM)
    _await(JvmGone(), stop, Writer(), StopFile(tmp_path / "stop"))  # type: ignore[arg-type]


def test_the_jvm_gone_without_a_stop_request_is_raised(tmp_path) -> None:
    with pytest.raises(Py4JNetworkError):
        _await(JvmGone(), StopRequest(), Writer(), StopFile(tmp_path / "stop"))  # type: ignore[arg-type]


def test_only_py4j_losing_the_jvm_counts_as_gone() -> None:
    assert jvm_gone(Py4JNetworkError("gone"))
    assert jvm_gone(ConnectionRefusedError(111, "refused"))
    assert not jvm_gone(ValueError("a bug"))
