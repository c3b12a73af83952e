"""The source's check, on the driver, that Spark's Python workers can import lagless."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lagless.exceptions import BadInput
from lagless.source.worker_python import check_imports_lagless


def python_without_lagless(folder: Path) -> str:
    """This interpreter, isolated from site-packages (where lagless is installed) and the cwd:
    a real Python that cannot import lagless, as the system's python3 of a fresh machine."""
    script = folder / "python-without-lagless"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    script.chmod(0o755)
    return str(script)


def test_this_interpreter_passes() -> None:
    check_imports_lagless(sys.executable)


def test_a_python_without_lagless_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    python = python_without_lagless(tmp_path)
    with pytest.raises(BadInput) as raised:
        check_imports_lagless(python)
    message = str(raised.value)
    assert "\n" not in message
    assert f"run {python!r}, which cannot import lagless" in message
    assert f"set PYSPARK_PYTHON to a Python that has lagless installed (e.g. {sys.executable})" in (
        message
    )


def test_a_missing_python_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="No such file"):
        check_imports_lagless(str(tmp_path / "no-python"))
