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


def test_executors_whose_python_lacks_lagless_are_one_line(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A worker Python with this venv's packages but not lagless, as an archive packed without
    it: no site processing (-S: not the editable install's finder, which would find this tree),
    no current folder on the path (-P), site-packages only through PYTHONPATH."""
    site_packages = next(p for p in sys.path if p.endswith("site-packages"))
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\nPYTHONPATH="$PYTHONPATH:{site_packages}" exec {sys.executable} -S -P "$@"\n'
    )
    python.chmod(0o755)
    spark.conf.set(EXECUTOR_PYTHON, str(python))
    try:
        with pytest.raises(BadInput) as raised:
            check_executors_import_lagless(spark.sparkContext.applicationId, str(python))
    finally:
        spark.conf.unset(EXECUTOR_PYTHON)
    assert str(raised.value) == (
        f"Spark's Python workers run {str(python)!r} from spark.archives, which cannot import "
        "lagless (No module named 'lagless'); pack an environment with lagless installed "
        "(README, Cluster deployment)"
    )
