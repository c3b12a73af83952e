"""The README's "Cluster deployment" recipe, as a test runs it: a virtual environment with
lagless installed (from this source tree, not in place: an editable install would point the
executors back at the driver's tree), packed by venv-pack into the archive that
`spark.archives=ARCHIVE#ALIAS` ships to the executors.

Its interpreter is the system's Python of this minor version, not the driver's: what a worker
machine would have, and, unlike a Python under /root, one the executors' user can run. pyspark
is left out of the archive, as the recipe says: the cluster's Spark puts its own pyspark on its
Python workers' path.

Installing lagless's dependencies takes a minute or two on a loaded machine, so the environment
is kept in this checkout's .venv, one per pyproject.toml; lagless's package (pure Python) is
copied anew into it for every archive, so the archive always holds the code under test. The
archive is a .tar.gz without compression: on one machine, gzip's CPU buys nothing (a plain .tar
Spark unpacks itself, refusing the environment's link to its Python outside it)."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"
ALIAS = "lagless-env"
KEPT = REPO / ".venv" / "executor-env"
PACK_TIMEOUT_S = 600


def build_executor_env(folder: Path) -> Path:
    """The packed environment's archive (a .tar.gz in `folder`)."""
    if not Path(SYSTEM_PYTHON).is_file():
        raise AssertionError(f"the executors' Python {SYSTEM_PYTHON} is missing: apt-get install")
    source = folder / "source"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "lagless", source / "lagless", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    pyproject = (REPO / "pyproject.toml").read_bytes() + SYSTEM_PYTHON.encode()
    env = KEPT / hashlib.sha256(pyproject).hexdigest()[:12] / ALIAS
    env.parent.mkdir(parents=True, exist_ok=True)
    archive = folder / f"{ALIAS}.tar.gz"
    with (env.parent / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test session of this checkout waits
        python = str(env / "bin" / "python")
        if not (env / "bin" / "venv-pack").exists():
            # A new pyproject.toml: the environments of earlier ones (1.4 GB each) go.
            for old in KEPT.iterdir():
                if old != env.parent:
                    shutil.rmtree(old, ignore_errors=True)
            shutil.rmtree(env, ignore_errors=True)
            run([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(env)])
            # This venv's pip installs into the new one (Debian's venv lacks ensurepip).
            run([*pip(python), "venv-pack", f"{source}[postgresql]"])
        installed = next((env / "lib").glob("python*/site-packages/lagless"))
        shutil.rmtree(installed)
        shutil.copytree(source / "lagless", installed)
        run(
            [
                *(str(env / "bin" / "venv-pack"), "--prefix", str(env)),
                *("--output", str(archive), "--compress-level", "0", "--quiet"),
                *("--exclude", "lib/python*/site-packages/pyspark/*"),
            ]
        )
    return archive


def pip(python: str) -> list[str]:
    return [sys.executable, "-m", "pip", "--python", python, "install", "--quiet"]


def run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=PACK_TIMEOUT_S)
    if done.returncode != 0:
        raise AssertionError(f"{command[:4]} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
