"""What a Spark task reports of the Python it runs in: where it imports lagless from.

Pickled by value (worker_python.py registers it so), so that a worker without lagless can still
unpickle and run it; hence it imports nothing of lagless at module level."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

FOUND = "found:"
MISSING = "missing:"
SCHEMA = "place string"


def where_lagless(batches: Iterable[Any]) -> Iterator[Any]:
    """For mapInArrow: one row per task, FOUND and lagless's file, or MISSING and why it cannot
    be imported."""
    import pyarrow as pa

    for _ in batches:
        pass
    try:
        import lagless

        place = f"{FOUND}{lagless.__file__}"
    except ImportError as exc:
        place = f"{MISSING}{exc}"
    yield pa.RecordBatch.from_pydict({"place": [place]})
