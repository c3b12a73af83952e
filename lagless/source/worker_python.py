"""Spark runs the source in Python workers of their own interpreter (PYSPARK_PYTHON, else
`python3` from PATH). One that cannot import lagless fails in the worker, thirty lines deep:
checked once on the driver instead, when the source is registered."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys

from lagless.exceptions import BadInput

CHECK_TIMEOUT_S = 60


def check_worker_python() -> None:
    """On the driver: the interpreter Spark gives its Python workers imports lagless. Does
    nothing in a worker (no SparkContext there) or when it is this interpreter."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is None:
        return
    configured = context.getConf().get("spark.pyspark.python")
    check_imports_lagless(configured or context.pythonExec)


@functools.cache
def check_imports_lagless(executable: str) -> None:
    """BadInput, in one line, when `executable` cannot import lagless."""
    found = shutil.which(executable)
    if found is not None and os.path.abspath(found) == os.path.abspath(sys.executable):
        return
    fix = f"set PYSPARK_PYTHON to a Python that has lagless installed (e.g. {sys.executable})"
    try:
        result = subprocess.run(
            [executable, "-c", "import lagless"], capture_output=True, timeout=CHECK_TIMEOUT_S
        )
    except OSError as exc:
        raise BadInput(
            f"Spark's Python workers would run {executable!r}: {exc.strerror}; {fix}"
        ) from None
    if result.returncode != 0:
        raise BadInput(
            f"Spark's Python workers run {executable!r}, which cannot import lagless; {fix}"
        )
