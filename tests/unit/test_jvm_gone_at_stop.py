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
from py4j.protocol import Py4JError, Py4JNetworkError

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


class JvmEnding(JvmGone):
    """A query whose JVM is ending: it still answers, but no longer knows py4j's own classes,
    so pyspark's reading of a Java error fails as py4j fails (seen in CI: "py4j.reflection does
    not exist in the JVM", raised by `query.exception()` before any wait)."""

    def exception(self) -> None:
        raise Py4JError("py4j.reflection does not exist in the JVM")


@pytest.mark.parametrize("query", [JvmGone, JvmEnding])
def test_the_jvm_gone_or_ending_after_a_stop_request_ends_the_wait(query, tmp_path) -> None:
    stop = StopRequest()
    stop.record(signal.SIGTERM)
    _await(query(), stop, Writer(), StopFile(tmp_path / "stop"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("query", "raised"), [(JvmGone, Py4JNetworkError), (JvmEnding, Py4JError)])
def test_the_jvm_gone_or_ending_without_a_stop_request_is_raised(query, raised, tmp_path) -> None:
    with pytest.raises(raised):
        _await(query(), StopRequest(), Writer(), StopFile(tmp_path / "stop"))  # type: ignore[arg-type]


def test_only_py4j_losing_the_jvm_counts_as_gone() -> None:
    assert jvm_gone(Py4JNetworkError("gone"))
    assert jvm_gone(ConnectionRefusedError(111, "refused"))
    assert not jvm_gone(ValueError("a bug"))


def test_a_java_error_is_an_answer_not_a_jvm_gone() -> None:
    from py4j.protocol import Py4JJavaError

    assert jvm_gone(Py4JError("py4j.reflection does not exist in the JVM"))
    answered = Py4JJavaError.__new__(Py4JJavaError)  # its __init__ asks a JVM for the error
    assert not jvm_gone(answered)
