"""The driver's check that executors running a Python shipped in spark.archives import lagless:
a real job on the test's local session asks its Python workers."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

import lagless
from lagless.exceptions import BadInput
from lagless.source.worker_python import EXECUTOR_PYTHON, check_executors_import_lagless

pytestmark = pytest.mark.spark


def test_the_executors_tell_where_they_import_lagless_from(spark, caplog) -> None:  # type: ignore[no-untyped-def]
    with caplog.at_level(logging.INFO, logger="lagless.source.worker_python"):
        check_executors_import_lagless(spark.sparkContext.applicationId, sys.executable)
    assert f"imports lagless from {lagless.__file__}" in caplog.text


def test_executors_that_cannot_run_the_python_are_one_line(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    missing = str(tmp_path / "env" / "bin" / "python")
    spark.conf.set(EXECUTOR_PYTHON, missing)
    try:
        with pytest.raises(BadInput, match="could not run") as raised:
            check_executors_import_lagless(spark.sparkContext.applicationId, missing)
    finally:
        spark.conf.unset(EXECUTOR_PYTHON)
    assert "\n" not in str(raised.value)
