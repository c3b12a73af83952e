"""A task's staging folder made while another import's cleanup removes the empty folders it
shares (task_files.make_folder). The race itself is real in
tests/integration/test_concurrent_sqlite.py; here the cleanup is made to land exactly between
makedirs' steps, which a live race hits only now and then."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lagless.sinks import task_files


def test_a_folder_whose_parent_another_import_removed_meanwhile_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "d.db-lagless-staging" / "T"
    shared.mkdir(parents=True)
    folder = shared / "run-c"
    real_mkdir = os.mkdir
    removed: list[str] = []

    def mkdir(path: str | os.PathLike[str], mode: int = 0o777) -> None:
        if str(path) == str(folder) and not removed:
            os.rmdir(shared)  # the other import's cleanup: empty, so removed
            removed.append(str(shared))
        real_mkdir(path, mode)

    monkeypatch.setattr(os, "mkdir", mkdir)
    task_files.make_folder(str(folder))
    assert removed == [str(shared)] and folder.is_dir()
