"""Whether this venv is scripts/setup's for this pyproject.toml: a test that runs the setup in a
clone sharing this venv must know, or the setup installs into it (the clone's editable lagless
then replaces this checkout's for every later run)."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def skip_unless_installed_by_setup() -> None:
    """Skip the test unless the venv holds scripts/setup's stamp of this pyproject.toml."""
    digest = hashlib.sha1((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:12]
    if not (Path(sys.prefix) / f".installed-{digest}").exists():
        pytest.skip("this venv's packages' stamp is not of this pyproject.toml (scripts/setup)")
