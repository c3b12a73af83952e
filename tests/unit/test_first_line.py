"""first_line: the one line of an error a message shows."""

from __future__ import annotations

from lagless.first_line import LONGEST, first_line


def test_the_first_line_that_is_not_blank_stripped() -> None:
    assert first_line(ValueError("\n  \n  broker down  \n  at Foo.bar\n")) == "broker down"
    assert first_line("  Py4JJavaError: boom\nTraceback") == "Py4JJavaError: boom"


def test_a_blank_error_is_told_by_its_type() -> None:
    assert first_line(TimeoutError()) == "TimeoutError"
    assert first_line(OSError(" \n ")) == "OSError"
    assert first_line("") == ""


def test_a_long_line_is_cut() -> None:
    assert first_line("x" * (LONGEST * 3) + "\nmore") == "x" * LONGEST
