"""Where lagless logs: one file (or stderr on request), plain or JSON lines, configured here only.

stderr belongs to the one-line error (cli/main.py) and the progress display, so the log goes to
a file by default: $LAGLESS_LOG_FILE, else, for an import, a file of its checkpoint's,
$XDG_STATE_HOME/lagless/imports/<checkpoint's name>-<digest of its path>.log (every run of
that import, and no other's), else $XDG_STATE_HOME/lagless/lagless.log (by default under
~/.local/state). Spark's own log (log4j, importer/log4j2.properties) goes to
the same file at ERROR, or WARN at --log-level debug. The settings travel in the environment to
the processes Spark starts (Python workers, the stream source's runner): code there calls
`configure_from_environment()` before it logs, so a retry in a task lands in the same file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LEVEL_ENV = "LAGLESS_LOG_LEVEL"
FILE_ENV = "LAGLESS_LOG_FILE"
JSON_ENV = "LAGLESS_LOG_JSON"
LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LEVEL = "info"
# --log-file -: the log on stderr.
STDERR = "-"

_ROOT = "lagless"
_configured_file: str | None = None
_handler: logging.Handler | None = None


def default_log_file(checkpoint: str | None = None) -> str:
    """$LAGLESS_LOG_FILE; else the import's own file when it has a checkpoint (checkpoint_log);
    else the user's lagless.log."""
    if os.environ.get(FILE_ENV):
        return os.environ[FILE_ENV]
    if checkpoint:
        return checkpoint_log(checkpoint)
    return str(_state() / "lagless.log")


def checkpoint_log(checkpoint: str) -> str:
    """The log of every run of the import whose checkpoint is `checkpoint`: kept beside the
    user's other lagless state, not in the checkpoint (a refused import leaves no checkpoint),
    named by the checkpoint's folder and a digest of its absolute path (ImportSpec.run_id's)."""
    path = os.path.abspath(checkpoint)
    digest = hashlib.sha256(path.encode()).hexdigest()[:12]
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in os.path.basename(path))
    return str(_state() / "imports" / f"{name or 'checkpoint'}-{digest}.log")


def _state() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "lagless"


def log_file() -> str | None:
    """The file this process logs to; None before configure() or when the log is on stderr."""
    return _configured_file


def configure(
    level: str = DEFAULT_LEVEL,
    file: str | None = None,
    as_json: bool = False,
    checkpoint: str | None = None,
) -> str:
    """Log lagless's records at `level` to `file` (default_log_file(checkpoint); "-": stderr);
    the file is also exported to the processes Spark starts. Returns where the log goes."""
    global _configured_file
    where = file or default_log_file(checkpoint)
    handler: logging.Handler
    if where == STDERR:
        handler = logging.StreamHandler(sys.stderr)
        _configured_file = None
    else:
        try:
            Path(where).parent.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(where, encoding="utf-8")
            _configured_file = where
        except OSError:
            # A log that cannot be written must not stop the import: keep quiet instead.
            handler = logging.NullHandler()
            _configured_file = None
    handler.setFormatter(JsonFormatter() if as_json else _plain())
    # On the root logger: what libraries log (py4j and PySpark log errors on the root logger,
    # which would otherwise print them on stderr) lands in the same place, from WARNING up.
    global _handler
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
        _handler.close()
    _handler = handler
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logger = logging.getLogger(_ROOT)
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.setLevel(level.upper())
    logger.propagate = True
    # py4j logs every callback it serves at INFO: its warnings and errors are enough.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    os.environ[LEVEL_ENV] = level
    os.environ[FILE_ENV] = where
    os.environ[JSON_ENV] = "1" if as_json else ""
    return where


def settings() -> str:
    """This process's log settings as one text (JSON), for a process that does not inherit its
    environment: a Spark Connect server's Python workers (`configure_from_environment`)."""
    return json.dumps(
        {
            "level": os.environ.get(LEVEL_ENV) or DEFAULT_LEVEL,
            "file": os.path.abspath(_configured_file) if _configured_file else None,
            "json": bool(os.environ.get(JSON_ENV)),
        }
    )


def configure_from_environment(sent: str | None = None) -> None:
    """In a process Spark started: the driver's settings, once; without them, records are
    dropped rather than printed on the console (Python's last-resort handler would). `sent`
    (`settings()` of the import's process) wins: a Spark Connect server's workers serve
    imports of other processes in turn, so they log into the file of the one they serve."""
    logger = logging.getLogger(_ROOT)
    if sent:
        wanted = json.loads(sent)
        if wanted["file"] and wanted["file"] != _configured_file:
            configure(wanted["level"], wanted["file"], wanted["json"])
        return
    if logger.handlers or _handler is not None:
        return
    if os.environ.get(FILE_ENV):
        configure(
            os.environ.get(LEVEL_ENV) or DEFAULT_LEVEL,
            os.environ[FILE_ENV],
            bool(os.environ.get(JSON_ENV)),
        )
    else:
        logger.addHandler(logging.NullHandler())
        logger.propagate = False


@contextmanager
def child_output_to_log() -> Iterator[None]:
    """Processes started inside (Spark's JVM, and the Python workers it starts) write their
    stdout and stderr into the log file, not over the one-line error: the JVM prints notices
    before log4j is set up, and a worker's stray output would land on the console."""
    where = log_file()
    if where is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    target = os.open(where, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.dup2(target, 1)
        os.dup2(target, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


def spark_log_level() -> str:
    """Spark's log level: quiet unless lagless's own log is at debug."""
    return "warn" if os.environ.get(LEVEL_ENV) == "debug" else "error"


def _plain() -> logging.Formatter:
    return logging.Formatter(
        "%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S"
    )


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time, level, logger, pid, message, and the trace when there is
    one; fields given with `extra=` are kept."""

    _STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in self._STANDARD and not key.startswith("_"):
                entry[key] = value if isinstance(value, int | float | str | bool) else str(value)
        if record.exc_info:
            entry["trace"] = self.formatException(record.exc_info)
        return json.dumps(entry)
