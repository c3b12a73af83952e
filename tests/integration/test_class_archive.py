"""The driver JVM's class archive: built once, checked before it is installed, then used."""

from __future__ import annotations

import os
import subprocess
import sys
import time

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


@pytest.mark.matrix
def test_the_first_import_builds_the_archive_in_the_background_the_next_maps_it(tmp_path):
    """Issue 34.5: an installation scripts/setup never ran gets the fast start from its
    second import: the first, finding no archive, starts building it as it ends; the second
    maps it (and marks it used: its mtime)."""
    from lagless.broker import EmbeddedBroker
    from lagless.gen import explicit, produce_profile
    from lagless.kafka.config import KafkaConfig

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop(class_archive.SWITCH, None)
    with EmbeddedBroker(topics={"orders": 2}) as broker:
        produce_profile(KafkaConfig(broker.bootstrap), "orders", explicit([50, 50]))

        def lagless_import(name: str) -> None:
            done = subprocess.run(
                [
                    *(sys.executable, "-m", "lagless", "import", "--bootstrap", broker.bootstrap),
                    *("--topic", "orders", "--sink", f"sqlite:///{tmp_path}/{name}.db"),
                    *("--checkpoint", str(tmp_path / name), "--json"),
                ],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stderr

        lagless_import("first")
        deadline = time.monotonic() + 600
        while not list((tmp_path / "cache" / "lagless").glob("spark-driver-*.jsa")):
            assert time.monotonic() < deadline, "no archive was built in the background"
            time.sleep(1)
        (built,) = (tmp_path / "cache" / "lagless").glob("spark-driver-*.jsa")
        os.utime(built, (1.0, 1.0))

        lagless_import("second")

    assert built.stat().st_mtime > 1.0  # the second import's session mapped it
