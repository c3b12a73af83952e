"""lagless's errors keep their class across Spark's boundary (one marker, one parser), and the
CLI maps each class to its exit code and one line."""

from __future__ import annotations

import logging
import signal
import traceback

import pytest

from lagless import logs
from lagless.cli import main as cli
from lagless.exceptions import (
    _BY_NAME,
    MARKER,
    BadInput,
    ConcurrentImport,
    DataLossError,
    LaglessError,
    Stopped,
    TerminalError,
    TransientError,
    crosses_spark,
    crossing_spark,
    from_spark,
    marker,
    parse_marker,
    worker_error,
)
from lagless.importer.job import stopped_by
from lagless.signals import Interrupted


@pytest.mark.parametrize("cls", [BadInput, TransientError, TerminalError, DataLossError])
def test_the_marker_round_trips_class_and_message(cls: type[LaglessError]) -> None:
    message = 'topic "a\'b" [1]: {not json} \\ é'
    found = parse_marker(f"py4j noise\n  ... {marker(cls(message))} SQLSTATE: 38000\nmore")
    assert type(found) is cls
    assert str(found) == message


def test_text_without_a_marker_or_with_a_broken_one_carries_nothing() -> None:
    assert parse_marker("lagless.exceptions.TransientError: looks like one, is not") is None
    assert parse_marker(f"{MARKER}{{broken") is None
    # A broken marker before a good one: the good one is found.
    good = marker(TransientError("away"))
    assert isinstance(parse_marker(f"{MARKER}{{broken {good}"), TransientError)


def test_an_unknown_class_reads_as_terminal() -> None:
    found = parse_marker(MARKER + '{"class": "FutureError", "message": "m"}')
    assert type(found) is TerminalError and str(found) == "m"


def test_crossing_spark_marks_lagless_errors_only() -> None:
    @crosses_spark
    def planning() -> None:
        raise TransientError("the broker is away")

    with pytest.raises(TransientError) as crossed:
        planning()
    assert str(crossed.value) == "the broker is away"  # as raised, for a caller in-process
    # Its text as Spark hands it back (the worker's traceback) carries the class.
    assert isinstance(parse_marker(traceback_text(crossed.value)), TransientError)
    with pytest.raises(ValueError), crossing_spark():
        raise ValueError("not lagless's: left as it is")


def test_crossing_spark_inside_a_generator() -> None:
    def read() -> object:
        with crossing_spark():
            yield 1
            raise BadInput("bad option")

    reading = read()
    assert next(reading) == 1  # type: ignore[call-overload]
    with pytest.raises(BadInput) as crossed:
        next(reading)  # type: ignore[call-overload]
    assert isinstance(parse_marker(traceback_text(crossed.value)), BadInput)


def test_from_spark_finds_the_error_in_a_wrapping_exception_and_in_causes() -> None:
    """As Spark wraps a worker's error: its traceback text inside a JVM error's message."""
    try:
        with crossing_spark():
            raise DataLossError("offsets 0..5 were deleted")
    except DataLossError:
        worker_trace = traceback.format_exc()
    wrapped = RuntimeError(f"[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] {worker_trace}")
    assert isinstance(from_spark(wrapped), DataLossError)
    outer = RuntimeError("query failed")
    outer.__cause__ = wrapped
    assert isinstance(from_spark(outer), DataLossError)
    # foreachBatch runs in the driver: its exception object is kept as it is.
    kept = TransientError("PostgreSQL away")
    assert from_spark(kept) is kept
    assert from_spark(RuntimeError("java.lang.OutOfMemoryError")) is None


@pytest.mark.parametrize(
    ("error", "code", "starts"),
    [
        (BadInput("no such topic"), 2, "lagless: error: no such topic"),
        (TransientError("broker away"), 75, "lagless: failed, may pass on a rerun: broker away"),
        (TerminalError("broken"), 1, "lagless: failed: broken"),
        (DataLossError("deleted"), 1, "lagless: failed: deleted"),
        (
            RuntimeError(f"worker failed: {marker(TransientError('away'))}"),
            75,
            "lagless: failed, may pass",
        ),
        (RuntimeError(f"Py4JJavaError: {marker(BadInput('x'))}"), 2, "lagless: error: x"),
        (Stopped(signal.SIGINT, "SIGINT"), 130, "lagless: stopped by SIGINT"),
        (Stopped(signal.SIGTERM, "SIGTERM"), 143, "lagless: stopped by SIGTERM"),
        (KeyboardInterrupt(), 130, "lagless: stopped by SIGINT"),
        (Interrupted(signal.SIGTERM), 143, "lagless: stopped by SIGTERM"),
        (ZeroDivisionError("division by zero\nsecond line"), 1, "lagless: failed unexpectedly"),
    ],
)
def test_exit_code_and_one_line(error: BaseException, code: int, starts: str) -> None:
    assert cli.exit_code(error) == code
    line = cli.one_line(error)
    assert line.startswith(starts) and "\n" not in line


def test_main_prints_one_line_and_logs_the_trace(
    tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected exception: exit 1, one line naming the log, the trace in the log."""

    def explode(args: object) -> int:
        raise ZeroDivisionError("boom")

    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda command=None: parser)
    real_parse = parser.parse_args

    def parse(argv: object = None) -> object:
        args = real_parse(argv)  # type: ignore[arg-type]
        args.func = explode
        return args

    monkeypatch.setattr(parser, "parse_args", parse)
    log_file = tmp_path / "lagless.log"
    # main() configures the process's logging: restored after the test.
    for name in (logs.FILE_ENV, logs.LEVEL_ENV, logs.JSON_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(logs, "_handler", None)
    monkeypatch.setattr(logs, "_configured_file", None)
    try:
        code = cli.main(["--log-file", str(log_file), "--log-json", "broker"])
    finally:
        if logs._handler is not None:
            logging.getLogger().removeHandler(logs._handler)
            logs._handler.close()
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines() == [
        f"lagless: failed unexpectedly: ZeroDivisionError: boom (details: {log_file})"
    ]
    logged = log_file.read_text()
    assert '"level": "error"' in logged and "ZeroDivisionError: boom" in logged
    assert '"trace": "Traceback' in logged


def traceback_text(error: BaseException) -> str:
    """What a Spark worker writes back for an error (pyspark.util.handle_worker_exception)."""
    return "".join(traceback.format_exception_only(type(error), error))


# As Spark hands back a worker's failure through foreachBatch (abridged from a real import
# into a full disk): pyspark's PythonException, whose message holds the worker's traceback.
WORKER_TRACEBACK = """An exception was thrown from the Python worker:
Traceback (most recent call last):
  File "/lagless/source/datasource.py", line 300, in read
    yield from write_task(writer, partition.pieces, self._read)
  File "/lagless/sinks/task_files.py", line 84, in write
    writer.close()
  File "pyarrow/error.pxi", line 92, in pyarrow.lib.check_status
OSError: [Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device
"""
FOREACH_BATCH_TRACEBACK = f"""Traceback (most recent call last):
  File "/pyspark/sql/utils.py", line 163, in call
    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)
  File "/pyspark/errors/exceptions/captured.py", line 285, in unwrap_spark_exception
    raise converted from None
    ^^^^^^^^^^^^^^^^^
pyspark.errors.exceptions.captured.PythonException: {WORKER_TRACEBACK}
\tat py4j.Protocol.getReturnValue(Protocol.java:476)
\t... 34 more
"""
CHAINED = """Traceback (most recent call last):
  File "w.py", line 3, in write
ValueError: the first thing that went wrong

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "w.py", line 5, in write
RuntimeError: cleaning up after it
"""


def test_a_workers_innermost_error_is_named_as_python_printed_it() -> None:
    disk_full = (
        "OSError: [Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on "
        "device"
    )
    assert worker_error(RuntimeError(WORKER_TRACEBACK)) == disk_full
    assert worker_error(RuntimeError(FOREACH_BATCH_TRACEBACK)) == disk_full  # wrappers passed
    try:
        try:
            raise RuntimeError("py4j: the query failed")
        except RuntimeError:
            raise ValueError("wrapped") from Exception(FOREACH_BATCH_TRACEBACK)
    except ValueError as wrapped:
        assert worker_error(wrapped) == disk_full  # found in a cause
    assert worker_error(RuntimeError(CHAINED)) == "ValueError: the first thing that went wrong"
    assert worker_error(RuntimeError("An exception was thrown from the Python worker:")) is None


def test_a_failure_without_a_marker_ends_as_the_workers_error() -> None:
    """The one line says the cause (a full disk), not Spark's wrapping."""
    stopped = stopped_by(RuntimeError(FOREACH_BATCH_TRACEBACK))
    assert type(stopped) is TerminalError
    assert str(stopped) == (
        "import stopped: OSError: [Errno 28] Error writing bytes to file. Detail: [errno 28] "
        "No space left on device"
    )
    assert str(stopped_by(RuntimeError("query gone\nmore"))) == "import stopped: query gone"


@pytest.mark.parametrize("cls", list(_BY_NAME.values()))
def test_every_named_class_round_trips(cls: type[LaglessError]) -> None:
    found = parse_marker(marker(cls("m")))
    assert type(found) is cls and str(found) == "m"


def test_a_subclass_no_marker_names_crosses_as_its_nearest_named_base() -> None:
    class AwayAWhile(ConcurrentImport):
        pass

    class Odd(BadInput):
        pass

    assert type(parse_marker(marker(AwayAWhile("a")))) is ConcurrentImport
    assert cli.exit_code(parse_marker(marker(AwayAWhile("a")))) == 75  # type: ignore[arg-type]
    assert type(parse_marker(marker(Odd("b")))) is BadInput


def test_every_lagless_error_class_is_defined_in_exceptions() -> None:
    """One home for error classes: any LaglessError subclass in lagless is exceptions.py's."""
    import importlib
    import pkgutil

    import lagless

    for module in pkgutil.walk_packages(lagless.__path__, "lagless."):
        if module.name.endswith("__main__"):
            continue
        importlib.import_module(module.name)

    def subclasses(cls: type) -> list[type]:
        return [c for sub in cls.__subclasses__() for c in (sub, *subclasses(sub))]

    outside = [
        f"{c.__module__}.{c.__qualname__}"
        for c in subclasses(LaglessError)
        if c.__module__.startswith("lagless.") and c.__module__ != "lagless.exceptions"
    ]
    assert outside == []
