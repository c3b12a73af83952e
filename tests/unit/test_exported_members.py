"""The public API: every exported name resolves, and nothing else is exported."""

from __future__ import annotations

import subprocess
import sys

import pytest

import lagless


@pytest.mark.parametrize("name", lagless.__all__)
def test_every_exported_name_resolves_to_an_object_defined_in_lagless(name: str) -> None:
    member = getattr(lagless, name)
    assert member is not None
    if hasattr(member, "__module__"):
        assert member.__module__.startswith("lagless.")


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = lagless.nope  # type: ignore[attr-defined]


def test_dir_lists_the_exported_names() -> None:
    assert set(lagless.__all__) <= set(dir(lagless))


def test_a_spark_worker_importing_the_source_does_not_load_the_importer_or_the_sinks() -> None:
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, lagless.source.datasource; "
            "print(sorted(m for m in sys.modules if m.startswith(('lagless.importer', "
            "'lagless.sinks', 'lagless.cli', 'rich'))))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"


def test_every_exported_name_has_a_home_and_every_home_is_exported() -> None:
    assert sorted(lagless.__all__) == sorted(lagless._HOMES)
