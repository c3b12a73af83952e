"""An error told in one line: what a message, a log line or a task's receipt shows of it."""

from __future__ import annotations

import re

# A JVM error's first line can hold a whole query plan: a message keeps this much of it.
LONGEST = 500
# How delta-rs and object_store set a cause under its error, in colour.
CAUSE = "\u21b3"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_line(error: BaseException | str) -> str:
    """The first line of the error's text that is not blank, stripped, with the causes listed
    right under it (delta-rs and object_store print each on a line of its own, after `↳`:
    "Generic LocalFileSystem error" alone does not say which file, nor why); the error's type
    when its text is blank (a str stays as it is then)."""
    text = _ANSI.sub("", str(error))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return type(error).__name__ if isinstance(error, BaseException) else text
    said = [lines[0]]
    for line in lines[1:]:
        if not line.startswith(CAUSE):
            break
        said.append(line.removeprefix(CAUSE).strip())
    return ": ".join(said)[:LONGEST]
