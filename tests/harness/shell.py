"""One bash session, as a user's terminal: blocks of commands run in it in turn, sharing its
variables, its working folder and its background jobs.

Each block is written to a file and sourced with stdin from /dev/null (so a command cannot read
the next block as its input), then the session echoes a marker with the block's exit status.
`close` ends the session's whole process group: the background jobs a block left go with it.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from pathlib import Path

MARK = "__lagless_block_done__"


class Shell:
    def __init__(self, cwd: Path, env: dict[str, str], scripts: Path) -> None:
        self._scripts = scripts
        scripts.mkdir(parents=True, exist_ok=True)
        self._process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, background jobs included
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._count = 0

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def run(self, block: str, timeout_s: float) -> tuple[int, str]:
        """The block's exit status (its last command's) and everything it printed."""
        self._count += 1
        script = self._scripts / f"block_{self._count}.sh"
        script.write_text(block)
        assert self._process.stdin is not None
        self._process.stdin.write(f'source {script} </dev/null; echo "{MARK} $?"\n')
        self._process.stdin.flush()
        deadline = time.monotonic() + timeout_s
        printed: list[str] = []
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no end after {timeout_s:g} s:\n{''.join(printed)}") from None
            if line is None:
                raise RuntimeError(f"the shell ended:\n{''.join(printed)}")
            before, marked, after = line.partition(MARK)
            printed.append(before)  # output without a last line break ends where the mark starts
            if marked:
                return int(after.split()[0]), "".join(printed)

    def close(self) -> None:
        """SIGTERM to the session and its jobs; SIGKILL to what is left after 20 s."""
        group = self._process.pid
        deadline = time.monotonic() + 20
        try:
            os.killpg(group, signal.SIGTERM)
            while time.monotonic() < deadline:
                time.sleep(0.2)
                self._process.poll()  # reaps the shell itself, which would count
                os.killpg(group, 0)  # raises once the group is empty
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._process.wait(timeout=30)
