"""Without noida-db the scenarios stop at once with one line saying how to get it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lagless.cli.main import main


def test_a_missing_noida_db_is_one_line_and_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # nothing beside it
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["demo", "--scenario", "000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "lagless: error: the scenarios need noida-db (a Kafka broker with a group coordinator): "
        "pip install noida-db, or run scripts/setup in a clone"
    ]


def test_json_without_a_scenario_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--json"]) == 2
    assert "--json goes with --scenario" in capsys.readouterr().err
