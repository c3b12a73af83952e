"""The shell blocks of the README and of the guides in docs/, as the docs tests read them.

The convention (docs/index: README.md, "The first hour"; every page):
- a ```sh block between `<!-- first-hour -->` and `<!-- /first-hour -->` in README.md is a step
  of the first hour, run in order by tests/integration/test_first_hour.py;
- a block right after a line `<!-- not run: REASON -->` is not run by any test, for REASON;
- any other block of a page in docs/ is run, in order, by tests/integration/test_docs_commands.py.
"""

from __future__ import annotations

import re
import shlex
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
NOT_RUN = re.compile(r"<!-- not run: (?P<reason>\S.*?) -->$")
# A line that runs lagless, perhaps after VAR=value settings (lines of a quoted script do not).
INVOCATION = re.compile(r"^\s*(\w+=\S*\s+)*lagless\s")
FIRST_HOUR, FIRST_HOUR_END = "<!-- first-hour -->", "<!-- /first-hour -->"


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    text: str
    not_run: str | None  # the reason, when marked
    first_hour: bool

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def commands(self) -> list[list[str]]:
        """Each `lagless ...` invocation in the block, continuation lines joined, as words."""
        joined = self.text.replace("\\\n", " ")
        found = []
        for line in joined.splitlines():
            if INVOCATION.match(line):
                words = shlex.split(line, comments=True)
                found.append(words[words.index("lagless") + 1 :])
        return found


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def sh_blocks(page: Path) -> list[Block]:
    blocks = []
    lines = page.read_text().splitlines()
    in_first_hour = False
    before = ""
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.strip() == FIRST_HOUR:
            in_first_hour = True
        elif line.strip() == FIRST_HOUR_END:
            in_first_hour = False
        if line.strip() == "```sh":
            # A block in a list item is indented: its fence and lines alike.
            end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
            body = textwrap.dedent("\n".join(lines[index + 1 : end]))
            marked = NOT_RUN.match(before.strip())
            blocks.append(
                Block(
                    page=page,
                    line=index + 1,
                    text=body + "\n",
                    not_run=marked.group("reason") if marked else None,
                    first_hour=in_first_hour,
                )
            )
            index, before = end, "```"
        elif line.strip():
            before = line
        index += 1
    return blocks


def first_hour() -> list[Block]:
    return [block for block in sh_blocks(README) if block.first_hour]
