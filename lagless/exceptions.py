"""Every error lagless raises on purpose derives from LaglessError, and keeps its class across
Spark's boundary.

The CLI maps the class to an exit code (cli/main.py): BadInput 2, TransientError 75, any other
failure 1. A TransientError may succeed when retried (a broker or a database away longer than
the retry budget); a TerminalError will not.

Code that Spark runs in another process (a task on an executor, the Python runner of the
stream source's planning) can only send text back: Spark wraps the Python error, with its
message, into a JVM exception. `crossing_spark` writes the error's class and message into that
message as one structured marker, and `from_spark` reads it back out of any exception Spark
raises: one writer, one parser, no matching of class names or message text. Any other error a
worker raised (a full disk: OSError) is known by the traceback Spark hands back, whose innermost
error `worker_error` names as Python printed it: its class and message.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


class LaglessError(Exception):
    """Root of lagless's own errors."""


class BadInput(LaglessError):
    """The user asked for something that cannot work: exit code 2, one line, nothing written."""


class SchemaChangeRefused(BadInput):
    """A Debezium mirror's change events changed a column in a way its table cannot follow (a
    type neither the table's nor a widening of it, a widening the store cannot make): one
    line, with the true direction and a remedy (cdc/schema_change.py). `table`: the table's
    name, by which --schema-changes stops only that table."""

    def __init__(self, message: str, table: str = "") -> None:
        super().__init__(message)
        self.table = table


class TerminalError(LaglessError):
    """A failure that retrying will not cure."""


class TransientError(LaglessError):
    """A failure that may pass: something was away for longer than the retry budget."""


class DataLossError(TerminalError):
    """Offsets the plan needs are gone from the broker (retention ran ahead of the import)."""


class NewTopics(TransientError):
    """A batch reads topics a routed import has no table for yet (they appeared while it ran):
    nothing of the batch is written; the import prepares their tables and replays it
    (importer/job.py). Should it reach the user, a rerun resumes."""


class ConcurrentImport(TransientError):
    """Another import committed offsets of this batch meanwhile: a rerun resumes after them
    (sinks/ledger.py's rule)."""


class ConcurrentMaintenance(TransientError):
    """Another writer changed the table under a maintenance round (a commit refused, a file or
    snapshot the round read gone): the round is tried again on the table as it is now."""


class UnreadDeletes(TerminalError):
    """An Iceberg table's delete files are of a kind lagless does not apply."""


class Stopped(LaglessError):
    """SIGINT or SIGTERM stopped the import between batches (or abandoned the batch in flight,
    which the checkpoint replays): a rerun resumes. Exit code 128 + the signal's number."""

    def __init__(self, signal_number: int, signal_name: str) -> None:
        super().__init__(f"stopped by {signal_name}; nothing is half-written, a rerun resumes")
        self.signal_number = signal_number


# The classes a marker may name: every error of this module that is built from its message
# alone. An error of another class crosses as its nearest named base (marker); a name this
# lagless does not know (a newer lagless's) reads as a TerminalError.
_BY_NAME: dict[str, type[LaglessError]] = {
    cls.__name__: cls
    for cls in (
        BadInput,
        SchemaChangeRefused,
        TerminalError,
        TransientError,
        DataLossError,
        NewTopics,
        ConcurrentImport,
        ConcurrentMaintenance,
        UnreadDeletes,
    )
}
MARKER = "@lagless-error:"


def crossing_name(cls: type[LaglessError]) -> str:
    """The name `cls` crosses Spark under: its own if a marker may name it, else its nearest
    base's that may (a subclass defined elsewhere keeps its exit code)."""
    for base in cls.__mro__:
        if base.__name__ in _BY_NAME and _BY_NAME[base.__name__] is base:
            return base.__name__
    return "TerminalError"


def marker(error: LaglessError) -> str:
    """The error as one line of text that survives Spark's wrapping."""
    return MARKER + json.dumps({"class": crossing_name(type(error)), "message": str(error)})


def parse_marker(text: str) -> LaglessError | None:
    """The first error marked in `text` (a Spark error's message, a traceback), as the class
    it was raised as; None when there is none."""
    start = text.find(MARKER)
    while start >= 0:
        try:
            found, _ = json.JSONDecoder().raw_decode(text, start + len(MARKER))
            cls = _BY_NAME.get(str(found["class"]), TerminalError)
            return cls(str(found["message"]))
        except (ValueError, KeyError, TypeError):
            start = text.find(MARKER, start + 1)
    return None


@contextmanager
def crossing_spark() -> Iterator[None]:
    """Around code Spark runs in another process: a LaglessError leaves with its marker as a
    note, which the traceback text Spark hands back carries (Python prints an exception's
    notes); a caller in this process still gets the error as it was raised."""
    try:
        yield
    except LaglessError as exc:
        note = marker(exc)
        if note not in getattr(exc, "__notes__", ()):
            exc.add_note(note)
        raise


def crosses_spark(func: F) -> F:
    """`crossing_spark` around a function (not a generator: use the context manager inside)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with crossing_spark():
            return func(*args, **kwargs)

    return cast(F, wrapper)


def from_spark(exc: BaseException) -> LaglessError | None:
    """The LaglessError a Spark (or py4j) error carries in its message or its causes; None
    when it carries none."""
    for current in chain(exc):
        if isinstance(current, LaglessError):
            return current
        found = parse_marker(text_of(current))
        if found is not None:
            return found
    return None


_TRACEBACK = "Traceback (most recent call last):"
# Spark's and py4j's wrappers of a worker's error, which name no cause of their own.
_WRAPPERS = ("pyspark.", "py4j.", "org.apache.spark.", "java.")


def worker_error(exc: BaseException) -> str | None:
    """The innermost error a Python worker of Spark raised, as its traceback's last line
    names it (`OSError: [Errno 28] No space left on device`), from the text of a Spark (or
    py4j) error or of its causes; None when none carries a Python traceback.

    Spark nests tracebacks: foreachBatch's, which ends in pyspark's PythonException, whose
    message holds the worker's. Their errors are read in the order printed, Spark's and
    py4j's wrappers passed over: the first left is the worker's own (Python prints a chained
    error's cause first, so a cause comes before what was raised while handling it)."""
    for current in chain(exc):
        for line in _raised(text_of(current)):
            if not line.startswith(_WRAPPERS):
                return line
    return None


def _raised(text: str) -> Iterator[str]:
    """The error line of each traceback in `text`: the first line after its frames (which
    Python indents)."""
    lines = text.splitlines()
    for number, line in enumerate(lines):
        if line.strip() != _TRACEBACK:
            continue
        for after in lines[number + 1 :]:
            if after and not after[0].isspace():
                yield after.strip()
                break


def chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then its causes (or the errors it was raised while handling), each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def text_of(exc: BaseException) -> str:
    """What `exc` says; the args of one whose JVM is gone."""
    # A py4j Java error's str() asks the JVM for the Java trace, which holds the task's text.
    try:
        return str(exc)
    except Exception:  # a JVM that is gone cannot describe its error
        return repr(exc.args)
