"""How the command line ends when the world around it does: stdout's reader gone away
(`lagless lag --json | head`), a full disk, `--version`. Run as a user runs it: a process of
its own, its stdout a pipe."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from lagless.cli import main as cli

LAGLESS = str(Path(sys.executable).parent / "lagless")
SIMULATE = ["simulate", "--counts", "9497160,9478898,0,5352228", "--consumers", "2"]
# A command that prints with print() (the JSON and plain commands do), a page at a time, after
# the pipe's reader is gone; and one whose own child's pipe breaks (not stdout's: a failure).
PLAIN = """
import sys
from lagless.cli import main, simulate
def run(args):
    for _ in range(1000):
        print("x" * 100)
    return 0
simulate.run = run
sys.exit(main.main(sys.argv[1:]))
"""
CHILD_PIPE = """
import subprocess, sys
from lagless.cli import main, simulate
def run(args):
    child = subprocess.Popen(["true"], stdin=subprocess.PIPE)
    child.wait()
    child.stdin.write(b"x" * 1_000_000)
    child.stdin.flush()
    return 0
simulate.run = run
sys.exit(main.main(sys.argv[1:]))
"""


def _with_reader_gone(command: list[str]) -> tuple[int, str]:
    """Run `command` with stdout a pipe whose reader is closed before it writes."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    err = process.stderr.read()
    return process.wait(timeout=60), err


@pytest.mark.parametrize(
    "command",
    [
        pytest.param([LAGLESS, *SIMULATE], id="rich-table"),
        pytest.param([sys.executable, "-c", PLAIN, *SIMULATE], id="print"),
    ],
)
def test_a_reader_gone_away_ends_it_quietly(command: list[str]) -> None:
    code, err = _with_reader_gone(command)
    assert (code, err) == (cli.EXIT_BROKEN_PIPE, "")
    assert cli.EXIT_BROKEN_PIPE == 141  # what a shell shows for SIGPIPE


def test_piped_into_head_ends_quietly(tmp_path: Path) -> None:
    """The shell's way: `| head -c1`, with pipefail, so its exit status is lagless's."""
    script = f"set -o pipefail; {sys.executable} -c '{PLAIN}' {' '.join(SIMULATE)} | head -c1"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (141, "x", "")


def test_a_broken_pipe_of_its_own_child_is_a_failure() -> None:
    """Only stdout's reader going away is quiet: another pipe breaking is an error said."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD_PIPE, "--log-file", "-", *SIMULATE],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1].startswith("lagless: failed unexpectedly: BrokenPipeError")


def test_version() -> None:
    done = subprocess.run([LAGLESS, "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert done.stdout.strip() == f"lagless {cli.version()}"
    assert cli.version()[0].isdigit()


@pytest.mark.parametrize(
    ("error", "line"),
    [
        (
            OSError(errno.ENOSPC, "No space left on device", "/data/orders.db"),
            "lagless: failed: no space left on device: /data/orders.db",
        ),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "lagless: failed: disk quota exceeded"),
    ],
)
def test_a_full_disk_is_named(error: OSError, line: str) -> None:
    assert (cli.exit_code(error), cli.one_line(error)) == (1, line)
    try:  # raised while handling it: still the disk
        try:
            raise error
        except OSError as exc:
            raise RuntimeError("writing the batch failed") from exc
    except RuntimeError as wrapped:
        assert cli.one_line(wrapped) == line
