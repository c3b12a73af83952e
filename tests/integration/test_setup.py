"""scripts/setup says what it does (issue 60): a line per phase, and when another process holds
the class archive's build lock it says so and waits, instead of skipping the archive in silence.

Run on a clone standing for a fresh one: the script and pyproject.toml copied, `.venv` the
installed venv (as scripts/setup leaves it: its packages' stamp is there, so pip is not run
again: a real install takes minutes and ~2 GB, which tests/integration/test_demo.py's setup
pays). The archive's cache is a folder of the test's own (XDG_CACHE_HOME); the archive the
other process builds is stood for by a file the test puts in place, not a JVM's dump (~1 min).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lagless.importer import class_archive
from tests.harness.setup_stamp import skip_unless_installed_by_setup

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    skip_unless_installed_by_setup()  # the setup would install into this venv, shared
    folder = tmp_path / "clone"
    (folder / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup", folder / "scripts" / "setup")
    shutil.copy(ROOT / "pyproject.toml", folder / "pyproject.toml")
    (folder / ".venv").symlink_to(sys.prefix)
    return folder


def _environment(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != class_archive.SWITCH}
    return {**env, "XDG_CACHE_HOME": str(cache)}


def _archive(env: dict[str, str]) -> Path:
    """Where the setup looks for this installation's archive, under the test's cache."""
    probe = "from lagless.importer import class_archive as c; print(c.archive_path())"
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    return Path(done.stdout.strip())


def test_setup_says_each_phase_and_waits_for_an_archive_another_builds(
    clone: Path, tmp_path: Path
) -> None:
    env = _environment(tmp_path / "cache")
    archive = _archive(env)
    archive.parent.mkdir(parents=True)
    lock = open(archive.parent / class_archive.BUILD_LOCK, "a")  # noqa: SIM115 - held below
    fcntl.flock(lock, fcntl.LOCK_EX)  # another setup builds it
    setup = subprocess.Popen(
        [str(clone / "scripts" / "setup")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert setup.stderr is not None
        said = [setup.stderr.readline(), setup.stderr.readline()]
        assert said[0] == "setup: packages: installed already (pyproject.toml unchanged since)\n"
        assert said[1].startswith("setup: class archive: another process is building one")
        assert "waiting for it" in said[1]
        time.sleep(1.0)  # the setup waits on: nothing more is said, nothing built
        assert setup.poll() is None and not archive.exists()
        archive.write_bytes(b"stands for the archive the other process built")
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()
    out, rest = setup.communicate(timeout=60)
    assert setup.returncode == 0, rest
    assert rest == f"setup: class archive: built already ({archive})\n"
    assert out == ""  # stdout is the demo's


def test_setup_says_when_the_archive_is_turned_off(clone: Path, tmp_path: Path) -> None:
    env = {**_environment(tmp_path / "cache"), class_archive.SWITCH: "off"}
    done = subprocess.run(
        [str(clone / "scripts" / "setup")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert (
        done.stderr.splitlines()[-1]
        == "setup: class archive: turned off (LAGLESS_CLASS_ARCHIVE=off)"
    )
