"""What every store does: check a target without touching it, prepare it, write one batch.

Writes are idempotent by construction, never by bookkeeping: append rows are unique on
(topic, partition, offset) and an upsert replaces a stored row only with a newer record,
so a batch replayed after a crash changes nothing it already wrote.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from lagless.exceptions import BadInput

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

WriteMode = Literal["append", "upsert"]
ValueFormat = Literal["raw", "json"]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

# Columns every sink stores, in this order. The timestamp is milliseconds since the epoch.
COLUMNS = ("topic", "partition", "offset", "key", "value", "timestamp")


def check_identifier(name: str, what: str = "table name") -> str:
    if not _IDENTIFIER.fullmatch(name):
        raise BadInput(
            f"{what} {name!r} is not a valid identifier "
            "(letters, digits and _, not starting with a digit, at most 63 characters)"
        )
    return name


def check_writable_path(path: str, what: str) -> None:
    """The path can be created or written, judged without creating anything."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if os.path.exists(path) and os.path.isdir(path) != (what != "file"):
        kind = "a directory" if os.path.isdir(path) else "a file"
        raise BadInput(f"{what} path {path!r} is {kind}")
    if not os.path.isdir(probe) and probe != os.path.abspath(path):
        raise BadInput(f"{what} path {path!r} cannot be created: {probe!r} is not a directory")
    if not os.access(probe, os.W_OK):
        raise BadInput(f"{what} path {path!r} is not writable")


@dataclass(frozen=True)
class Target:
    table: str
    mode: WriteMode
    value_format: ValueFormat

    @property
    def dead_letter_table(self) -> str:
        return f"{self.table}_dlq"


class Sink(ABC):
    scheme: ClassVar[str]
    #: True when write() needs the rows on the driver (a file path on an executor means nothing).
    on_driver: ClassVar[bool]

    def __init__(self, url: str, location: str) -> None:
        self.url = url
        self.location = location

    @abstractmethod
    def check(self, target: Target) -> None:
        """Raise BadInput if target cannot be written; write nothing."""

    @abstractmethod
    def prepare(self, target: Target) -> None:
        """Create what the target needs (tables, folders); safe to repeat."""

    @abstractmethod
    def write(self, rows: DataFrame, target: Target, batch_id: int) -> int:
        """Store rows (columns COLUMNS) idempotently; returns the number of rows written."""

    def close(self) -> None:  # noqa: B027 - most sinks hold nothing open
        """Release connections."""
