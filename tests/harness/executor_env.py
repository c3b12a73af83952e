"""The README's "Cluster deployment" recipe, as a test runs it: a virtual environment with
lagless installed (from this source tree, not in place: an editable install would point the
executors back at the driver's tree), packed by venv-pack into the archive that
`--spark-conf spark.archives=ARCHIVE#ALIAS` ships to the executors.

Its interpreter is the system's Python of this minor version, not the driver's: what a worker
machine would have, and, unlike a Python under /root, one the executors' user can run. pyspark
is left out of the archive, as the recipe says: the cluster's Spark puts its own pyspark on its
Python workers' path."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
ALIAS = "lagless-env"
PACK_TIMEOUT_S = 600


def build_executor_env(folder: Path) -> Path:
    """The packed environment's archive (a .tar.gz in `folder`)."""
    if not Path(SYSTEM_PYTHON).is_file():
        raise AssertionError(f"the executors' Python {SYSTEM_PYTHON} is missing: apt-get install")
    source = folder / "source"
    shutil.copytree(
        REPO / "lagless", source / "lagless", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    env = folder / ALIAS
    run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(env)])
    # This venv's pip installs into the new one (it has none of its own: Debian's venv lacks
    # ensurepip); the wheels come from pip's cache after the first run.
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(env / "bin" / "python"),
            "install",
            "--quiet",
            "venv-pack",
            f"{source}[postgresql]",
        ]
    )
    archive = folder / f"{ALIAS}.tar.gz"
    run(
        [
            str(env / "bin" / "venv-pack"),
            "--prefix",
            str(env),
            "--output",
            str(archive),
            "--compress-level",
            "1",
            "--quiet",
            "--exclude",
            "lib/python*/site-packages/pyspark/*",
        ]
    )
    return archive


def run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=PACK_TIMEOUT_S)
    if done.returncode != 0:
        raise AssertionError(f"{command[:4]} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
