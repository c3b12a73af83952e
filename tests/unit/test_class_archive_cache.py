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
