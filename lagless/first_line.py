"""An error told in one line: what a message, a log line or a task's receipt shows of it."""

from __future__ import annotations

# A JVM error's first line can hold a whole query plan: a message keeps this much of it.
LONGEST = 500


def first_line(error: BaseException | str) -> str:
    """The first line of the error's text that is not blank, stripped; the error's type when
    its text is blank (a str stays as it is then)."""
    text = str(error)
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:LONGEST]
    return type(error).__name__ if isinstance(error, BaseException) else text
