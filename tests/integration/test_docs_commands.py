"""Every guide's shell blocks run, in the page's order, as a reader would paste them: each with
bash's errexit, in one folder per page, the venv's `lagless` on the PATH and `$B` naming an
embedded broker with the topics the guides name (their marked broker block, started here
in-process). A block marked `<!-- not run: REASON -->` is left out (tests/harness/docs.py);
tests/unit/test_docs.py checks the marks, tests/integration/test_first_hour.py the README.

Several Spark imports per page: under `matrix` (scripts/test), not in CI.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lagless.broker import EmbeddedBroker
from tests.harness.docs import DOCS, Block, sh_blocks

pytestmark = pytest.mark.spark  # the CLI's imports start Spark

TOPICS = {"orders": 24, "deals": 12, "deals-avro": 12}  # docs/imports.md's broker block
# The pages with a block to run (a page whose blocks are all marked has nothing to test here).
GUIDES = [
    page
    for page in sorted(DOCS.glob("*.md"))
    if any(block.not_run is None for block in sh_blocks(page))
]


def _run(block: Block, folder: Path, env: dict[str, str]) -> tuple[int, str]:
    """The block's exit status and output. The output goes through a file: a job the block
    left in the background would hold a pipe open after the block ended."""
    output = folder.parent / "output.txt"
    with output.open("w") as printed:
        process = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", block.text],
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=printed,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            status = process.wait(timeout=900)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)  # what the block left in the background
    return status, output.read_text()


@pytest.mark.matrix
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("page", GUIDES, ids=[page.stem for page in GUIDES])
def test_a_guide_s_commands_run_in_order(page: Path, tmp_path: Path) -> None:
    blocks = [block for block in sh_blocks(page) if block.not_run is None]
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.prefix) / "bin"), env["PATH"]])
    env["LAGLESS_LOG_FILE"] = str(tmp_path / "lagless.log")
    folder = tmp_path / "reader"
    folder.mkdir()
    with EmbeddedBroker(topics=TOPICS) as broker:
        env["B"] = broker.bootstrap
        for block in blocks:
            status, printed = _run(block, folder, env)
            assert status == 0, f"{block.where} exited {status}:\n{printed}"
