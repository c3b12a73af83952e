"""A batch's rows as Arrow, in the order Spark's tasks finish, for stores written on the driver.

DataFrame.toArrow() returns once every task has finished. Its JVM side
(Dataset.collectAsArrowToPython) already sends each task's rows as soon as that task is done,
out of order, followed by the order they belong in; toArrow only waits in order to reorder them.
Every store lagless writes is order-proof (append rows unique on offsets, upserts newest-wins),
so a driver-side store can take the rows in arrival order and write them while later tasks
still run. This leans on PySpark internals (collectAsArrowToPython and its stream framing, as
pyspark.sql.pandas.conversion._collect_as_arrow reads them); without them it falls back to
toArrow().
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@contextmanager
def arrow_batches(frame: DataFrame) -> Iterator[pa.RecordBatchReader]:
    """The frame's rows as they arrive; an error of any task is raised by the reader."""
    try:
        from pyspark.errors.exceptions.captured import unwrap_spark_exception
        from pyspark.serializers import UTF8Deserializer, read_int
        from pyspark.util import _create_local_socket

        serve = frame._jdf.collectAsArrowToPython
    except (ImportError, AttributeError):  # pragma: no cover - another PySpark
        yield frame.toArrow().to_reader()
        return
    port, secret, server = serve()
    sockfile, sock = _create_local_socket((port, secret))
    try:
        stream = pa.ipc.open_stream(sockfile)

        def batches() -> Iterator[pa.RecordBatch]:
            yield from stream
            # Then the JVM sends how many batches it sent and their order, or -1 and an error.
            count = read_int(sockfile)
            if count == -1:
                raise RuntimeError(UTF8Deserializer().loads(sockfile))
            for _ in range(count):
                read_int(sockfile)

        yield pa.RecordBatchReader.from_batches(stream.schema, batches())
    finally:
        sockfile.close()
        sock.close()
        with unwrap_spark_exception():
            server.getResult()
