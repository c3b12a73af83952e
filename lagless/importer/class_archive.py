"""A class-data-sharing archive of what Spark's driver JVM loads, so a session starts sooner.

The JVM can map the classes an earlier JVM loaded from an archive instead of reading and
verifying them again (JDK 13+ dynamic AppCDS). On a 2-core machine a session started in 3.3 s
with the archive against 5.3 s without, and its first job took 1.0 s against 1.9 s.

A truncated archive stops the JVM from starting at all, so an archive is dumped by a JVM of its
own, checked by starting a session on it, and only then renamed into place: whatever lies at
the final path is whole. The name carries a digest of the Java binary and of Spark's jars and
their folder, so an upgrade or another installation never meets an archive of another.
`LAGLESS_CLASS_ARCHIVE=off` turns it off. A session that maps an archive marks it used (its
mtime); building one removes the archives no session mapped for UNUSED_FOR_S (~160 MB each:
every venv and every Spark upgrade makes one, and this machine's cache had grown to 3.6 GB).

    python -m lagless.importer.class_archive    # build it when missing (scripts/setup does)

Every installation gets it, however lagless was installed: an import that found none starts
the build in a process of its own as it ends (`build_in_background`), so its next import
starts sooner; one build at a time (a lock beside the archives), the others skip it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass

SWITCH = "LAGLESS_CLASS_ARCHIVE"
# The archive's own warnings (classes it cannot hold) are not the user's business.
SILENT = "-Xlog:cds=off -Xlog:cds+dynamic=off"
# The JVM writes the archive (~170 MB) as it exits: 60 s were not enough at load 17.
JVM_EXIT_WAIT_S = 180.0
# What the dump runs (_session): another recipe is another archive.
RECIPE = "2: batch read, mapInArrow, a stream through foreachBatch"
UNUSED_FOR_S = 14 * 24 * 3600.0
# Held by the process that builds the archive, beside the archives.
BUILD_LOCK = "spark-driver.build.lock"

log = logging.getLogger(__name__)


def enabled() -> bool:
    return os.environ.get(SWITCH, "on").lower() not in ("off", "0", "false", "no")


def archive_path() -> Path | None:
    """Where this Java and this Spark's archive lives; None when Java is not found."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    digest = hashlib.sha1(os.path.realpath(java).encode())
    digest.update(str(os.stat(os.path.realpath(java)).st_mtime_ns).encode())
    digest.update(pyspark.__version__.encode())
    digest.update(RECIPE.encode())
    # The JVM checks the archive against its class path, which names this Spark's folder: a
    # second installation (another venv) gets an archive of its own.
    digest.update(str(jars.resolve()).encode())
    for jar in sorted(jars.glob("*.jar")):
        digest.update(jar.name.encode())
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lagless"
    return cache / f"spark-driver-{digest.hexdigest()[:16]}.jsa"


def java_options() -> str:
    """Driver JVM options that map the archive, or nothing when there is none."""
    path = archive_path() if enabled() else None
    if path is None or not path.is_file():
        return ""
    with contextlib.suppress(OSError):  # a read-only cache keeps its archives
        os.utime(path)  # used now: see remove_unused
    return f"-XX:SharedArchiveFile={path} {SILENT}"


def remove_unused(kept: Path, now: float) -> list[Path]:
    """The other archives beside `kept` that no session mapped for UNUSED_FOR_S, removed."""
    removed = []
    for other in kept.parent.glob("spark-driver-*.jsa"):
        with contextlib.suppress(OSError):
            if other != kept and now - other.stat().st_mtime > UNUSED_FOR_S:
                other.unlink()
                removed.append(other)
    return removed


def build() -> Path | None:
    """Dump, check and install the archive unless it exists; None when it cannot be built,
    or another process is building it."""
    path = archive_path()
    if path is None:
        return None
    if path.parent.is_dir():
        remove_unused(path, time.time())
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / BUILD_LOCK, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # another process builds it
        if path.is_file():  # built while this one waited for the lock
            return path
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        try:
            if _run("dump", partial) and partial.is_file() and _run("check", partial):
                os.replace(partial, path)
                return path
            return None
        finally:
            partial.unlink(missing_ok=True)
            # None left beside the archive; a process that opened it meanwhile and then locks
            # it finds the archive built, or builds again (to a partial of its own: harmless).
            (path.parent / BUILD_LOCK).unlink(missing_ok=True)


def build_in_background() -> bool:
    """As an import ends: when this installation has no archive yet (and it is not off),
    start building it in a process of its own, which outlives this one (~1 min of a core);
    True when one was started. One that cannot start (no process to be had on a busy machine)
    is logged: the import it follows has succeeded, and its next import tries again."""
    path = archive_path() if enabled() else None
    if path is None or path.is_file():
        return False
    try:
        subprocess.Popen(
            [sys.executable, "-m", "lagless.importer.class_archive"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not the terminal's Ctrl-C, nor the import's end
        )
    except OSError as exc:
        log.warning("the class archive's build did not start: %s", exc)
        return False
    return True


def _run(step: str, archive: Path) -> bool:
    env = {**os.environ, SWITCH: "off"}
    child = subprocess.run(
        [sys.executable, "-m", "lagless.importer.class_archive_session", step, str(archive)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if child.returncode != 0:
        return False
    # The JVM writes the archive as it exits, which is after the Python process that ran it.
    jvm = int(child.stdout.split()[-1])
    deadline = time.monotonic() + JVM_EXIT_WAIT_S
    while os.path.exists(f"/proc/{jvm}") and time.monotonic() < deadline:
        time.sleep(0.1)
    return not os.path.exists(f"/proc/{jvm}")


def main(argv: list[str]) -> int:
    built = build()
    print(built if built else "no class archive (Java not found, or the dump failed)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
