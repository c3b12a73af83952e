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


def test_the_causes_delta_rs_lists_under_its_error_are_kept() -> None:
    """delta-rs (object_store) says which file and why on lines of their own, in colour: a
    store that refused a write was told as "Generic LocalFileSystem error" alone."""
    said = (
        "Generic LocalFileSystem error\n"
        "          \x1b[31m\u21b3\x1b[0m Unable to open file "
        "/lake/t/_delta_log/00000000000000013579.json#1\n"
        "           \x1b[31m\u21b3\x1b[0m Operation not permitted (os error 1)\n"
        "\n"
        "Traceback (most recent call last):\n"
    )
    assert first_line(OSError(said)) == (
        "Generic LocalFileSystem error: Unable to open file "
        "/lake/t/_delta_log/00000000000000013579.json#1: Operation not permitted (os error 1)"
    )
