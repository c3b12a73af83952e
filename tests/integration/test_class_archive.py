"""The driver JVM's class archive: built once, checked before it is installed, then used."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from lagless.importer import class_archive

pytestmark = pytest.mark.spark


def test_an_archive_is_built_checked_and_mapped_by_the_next_session(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(class_archive.SWITCH, raising=False)
    assert class_archive.java_options() == ""

    built = class_archive.build()

    assert built is not None and built.is_file()
    assert built.parent == tmp_path / "lagless"
    assert [p.name for p in built.parent.iterdir()] == [built.name]  # no partial left behind
    assert f"-XX:SharedArchiveFile={built}" in class_archive.java_options()
    # A session started by spark_session maps it (the JVM would refuse a broken one).
    probe = (
        "from lagless.importer.spark import spark_session\n"
        "s = spark_session('local[1]')\n"
        "args = s.sparkContext._jvm.java.lang.management.ManagementFactory"
        ".getRuntimeMXBean().getInputArguments()\n"
        "print(s.range(5).count(), any('SharedArchiveFile' in str(a) for a in args))\n"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split()[-2:] == ["5", "True"]


def test_off_switch_leaves_the_jvm_options_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = class_archive.archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    assert class_archive.java_options() != ""

    monkeypatch.setenv(class_archive.SWITCH, "off")

    assert class_archive.java_options() == ""
