"""The README's first hour, as a new user runs it: its ```sh blocks, read from README.md itself,
pasted in order into one bash session (tests/harness/shell.py) in a folder standing for a fresh
clone, and what each step should show checked against the broker, the table and the dashboard
(in headless Chromium).

Left out, and why: the setup (`./scripts/demo` installs ~2 GB; this uses the venv already
installed, linked as the clone's `.venv`, and tests/integration/test_demo.py runs the demo).
The checks are facts (exit statuses, offsets, rows, the group's commits, the dashboard's row),
not the commands' wording, which may change.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from playwright.sync_api import Browser

from tests.harness.docs import first_hour
from tests.harness.serve import chromium, get_json, wait_for
from tests.harness.shell import Shell

pytestmark = pytest.mark.spark  # the CLI's imports start Spark

GROUP = "orders-import"
SEED_000 = 134_614  # gen --profile seed-000: the first failure's lag, a thousandth of it
SEED_000_PARTITIONS = 16  # of 24: 8 are empty
UNIFORM = 24 * 10_000  # gen --profile uniform: 10,000 records on every partition
# The first word of each step's commands: the walkthrough these checks were written for.
STEPS = ["broker", "gen", "import", "python", "gen", "lag", "doctor", "serve", "import", "lag",
         "kill"]  # fmt: skip


class Walkthrough:
    """What the steps left behind, as the checks read it."""

    def __init__(self, shell: Shell, folder: Path, browser: Browser) -> None:
        self.shell = shell
        self.folder = folder  # the clone's first-hour/
        self.browser = browser

    def variable(self, name: str) -> str:
        status, printed = self.shell.run(f'echo "${name}"', timeout_s=10)
        assert status == 0 and printed.strip(), f"${name} is not set"
        return printed.strip()

    def jobs(self) -> list[int]:
        _, printed = self.shell.run("jobs -p", timeout_s=10)
        return [int(pid) for pid in printed.split()]

    def log(self) -> dict[int, tuple[int, int]]:
        """Each partition of orders: (log start, log end)."""
        consumer = Consumer({"bootstrap.servers": self.variable("B"), "group.id": "first-hour"})
        try:
            return {
                p: consumer.get_watermark_offsets(TopicPartition("orders", p), timeout=10)
                for p in range(24)
            }
        finally:
            consumer.close()

    def committed(self) -> dict[int, int]:
        consumer = Consumer({"bootstrap.servers": self.variable("B"), "group.id": GROUP})
        try:
            found = consumer.committed([TopicPartition("orders", p) for p in range(24)], 10)
            return {tp.partition: tp.offset for tp in found}
        finally:
            consumer.close()

    def rows(self) -> dict[int, tuple[int, int, int]]:
        """Per partition of the table: rows, distinct offsets, the highest offset."""
        with sqlite3.connect(self.folder / "orders.db") as db:
            found = db.execute(
                "SELECT partition, count(*), count(DISTINCT offset), max(offset) FROM orders "
                "GROUP BY partition"
            ).fetchall()
        return {p: (rows, distinct, highest) for p, rows, distinct, highest in found}

    def assert_the_table_holds_the_log(self) -> None:
        log = self.log()
        assert all(start == 0 for start, _ in log.values()), f"records deleted unread: {log}"
        held = {p: end for p, (_, end) in log.items() if end}
        assert {p: (end, end, end - 1) for p, end in held.items()} == self.rows()


def _broker(walk: Walkthrough, printed: str) -> None:
    bootstrap = walk.variable("B")
    assert re.fullmatch(r"127\.0\.0\.1:\d+", bootstrap)
    assert f"broker at {bootstrap}" in printed
    assert walk.log() == dict.fromkeys(range(24), (0, 0))  # orders, 24 partitions, empty


def _gen_backlog(walk: Walkthrough, printed: str) -> None:
    ends = [end for _, end in walk.log().values()]
    assert sum(ends) == SEED_000
    assert sum(1 for end in ends if end) == SEED_000_PARTITIONS


def _import_backlog(walk: Walkthrough, printed: str) -> None:
    walk.assert_the_table_holds_the_log()
    assert walk.committed() == {p: end for p, (_, end) in walk.log().items()}
    assert "  held before     nothing" in printed.splitlines()


def _look(walk: Walkthrough, printed: str) -> None:
    assert f"({SEED_000}, {SEED_000_PARTITIONS})" in printed
    assert len(re.findall(r"^\(\d+, \d+, '[^']*', \d+\)$", printed, re.MULTILINE)) == 3


def _gen_more(walk: Walkthrough, printed: str) -> None:
    assert sum(end for _, end in walk.log().values()) == SEED_000 + UNIFORM


def _lag(walk: Walkthrough, printed: str) -> None:
    assert re.search(r"\b240,?000\b", printed), "the group's total lag"
    assert "STALL" in printed
    # Printed to a pipe: the title on one line, no "sampling" line (that is for a terminal).
    assert printed.splitlines()[0].strip() == f"group {GROUP} on orders"


def _doctor(walk: Walkthrough, printed: str) -> None:
    """The import of step 3 ended: said so, with the fix, as the README's step 7 says; not a
    consumer stuck on a record, and nothing of DescribeGroups (an import has no members)."""
    assert GROUP in printed
    assert f"no lagless import is committing group {GROUP}" in printed
    assert "fix: run the same import again" in printed
    assert "stuck" not in printed and "DescribeGroups" not in printed


def _serve(walk: Walkthrough, printed: str) -> None:
    url = walk.variable("S")
    assert f"dashboard at {url}" in printed
    (answer,) = (line for line in printed.splitlines() if line.startswith('{"error"'))
    (listed,) = json.loads(answer)["groups"]
    assert (listed["group"], listed["totallag"]) == (GROUP, UNIFORM)
    page = walk.browser.new_page()
    page.goto(url)
    row = page.locator(f'#groups tr[data-group="{GROUP}"]')
    row.locator("td.lag", has_text=re.compile(r"240,?000")).wait_for(timeout=15_000)
    walk.dashboard = page  # type: ignore[attr-defined]


def _catch_up(walk: Walkthrough, printed: str) -> None:
    held = [line for line in printed.splitlines() if line.startswith("  held before ")]
    assert held and "orders[0] up to offset" in held[0] and "12 more partitions" in held[0]
    walk.assert_the_table_holds_the_log()
    assert sum(rows for rows, _, _ in walk.rows().values()) == SEED_000 + UNIFORM
    assert walk.committed() == {p: end for p, (_, end) in walk.log().items()}


def _table_lag(walk: Walkthrough, printed: str) -> None:
    assert "orders" in printed
    url = walk.variable("S")
    # "The dashboard turns to OK within a few seconds."
    wait_for("the group at lag 0", lambda: get_json(url + "/api/groups")["groups"][0]["totallag"]
             == 0, timeout_s=30)  # fmt: skip
    page = walk.dashboard  # type: ignore[attr-defined]
    page.locator(f'#groups tr[data-group="{GROUP}"][data-status="OK"]').wait_for(timeout=15_000)
    walk.jobs_before_kill = walk.jobs()  # type: ignore[attr-defined]


def _kill(walk: Walkthrough, printed: str) -> None:
    jobs = walk.jobs_before_kill  # type: ignore[attr-defined]
    assert len(jobs) == 2  # the broker and the server
    wait_for("the broker and the server to end", lambda: not any(_alive(p) for p in jobs), 30)


CHECKS: list[Callable[[Walkthrough, str], None]] = [
    _broker, _gen_backlog, _import_backlog, _look, _gen_more, _lag, _doctor, _serve, _catch_up,
    _table_lag, _kill,
]  # fmt: skip


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _first_word(block: str) -> str:
    lagless = re.search(r"^\s*lagless (\w+)", block, re.MULTILINE)
    if lagless:
        return lagless.group(1)
    lines = [line for line in block.splitlines() if line.strip() and not line.startswith(".")]
    return lines[0].split()[0]


@pytest.fixture
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


# The bound for a new user's first hour from the README, the setup aside.
@pytest.mark.timeout(15 * 60)
def test_a_new_user_reaches_an_import_a_lag_view_and_the_dashboard_from_the_readme(
    tmp_path: Path, browser: Browser
) -> None:
    steps = first_hour()
    assert [_first_word(step.text) for step in steps] == STEPS, (
        "the README's first hour changed: update STEPS and CHECKS to what it now shows"
    )
    clone = tmp_path / "clone"
    clone.mkdir()
    (clone / ".venv").symlink_to(sys.prefix)  # the installed venv, as scripts/setup leaves it
    venv_bin = str(Path(sys.prefix) / "bin")
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    # Only the README's `. .venv/bin/activate` may put lagless on the PATH.
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if p != venv_bin)
    env["LAGLESS_LOG_FILE"] = str(tmp_path / "lagless.log")
    shell = Shell(clone, env, scripts=tmp_path / "steps")
    walk = Walkthrough(shell, clone / "first-hour", browser)
    started = time.monotonic()
    try:
        for number, (step, check) in enumerate(zip(steps, CHECKS, strict=True), start=1):
            status, printed = shell.run(step.text, timeout_s=600)
            assert status == 0, f"step {number} ({step.where}) exited {status}:\n{printed}"
            check(walk, printed)
    finally:
        shell.close()
    print(f"the first hour's steps took {time.monotonic() - started:.0f} s")
