"""The class archives' cache does not grow without end (importer/class_archive.py)."""

from __future__ import annotations

import os
import time

from lagless.importer.class_archive import UNUSED_FOR_S, remove_unused


def test_archives_no_session_mapped_for_weeks_are_removed_the_others_kept(tmp_path) -> None:
    now = time.time()
    kept = tmp_path / "spark-driver-current.jsa"
    stale = tmp_path / "spark-driver-old-venv.jsa"
    recent = tmp_path / "spark-driver-other-venv.jsa"
    unrelated = tmp_path / "notes.txt"
    for path in (kept, stale, recent, unrelated):
        path.write_bytes(b"x")
        os.utime(path, (now - 2 * UNUSED_FOR_S,) * 2)
    os.utime(recent, (now - UNUSED_FOR_S / 2,) * 2)

    assert remove_unused(kept, now) == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [kept.name, recent.name, unrelated.name]
    )


def test_one_build_at_a_time_the_others_skip_it(tmp_path, monkeypatch) -> None:
    """Issue 34.5: imports that end together start one build; a second finds it under way."""
    import fcntl

    from lagless.importer import class_archive

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(class_archive.SWITCH, raising=False)
    path = class_archive.archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    with open(path.parent / class_archive.BUILD_LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process is building
        assert class_archive.build() is None
    assert not path.exists() and not list(path.parent.glob("*.partial"))


def test_a_background_build_starts_only_where_there_is_no_archive(tmp_path, monkeypatch) -> None:
    from lagless.importer import class_archive

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv(class_archive.SWITCH, "off")
    assert class_archive.build_in_background() is False
    monkeypatch.delenv(class_archive.SWITCH)
    path = class_archive.archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")  # there already
    assert class_archive.build_in_background() is False


def test_a_background_build_that_cannot_start_leaves_the_import_done(
    tmp_path, monkeypatch, caplog
) -> None:
    """It follows an import that succeeded: a process that cannot be started is said, not
    raised (which would end that import with exit 1)."""
    import sys

    from lagless.importer import class_archive

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(class_archive.SWITCH, raising=False)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    assert class_archive.build_in_background() is False
    assert "the class archive's build did not start" in caplog.text
