"""`lagless` command line: one module per command, each with `register(subparsers)`.

Every failure is one line on stderr and an exit code (`exit_code`); the full story, with the
trace, goes to the log (lagless/logs.py), which the line names.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import logging
import os
import select
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from lagless import logs
from lagless.exceptions import BadInput, Stopped, TransientError, from_spark
from lagless.first_line import first_line
from lagless.signals import interrupt_on_signals

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
# sysexits.h's EX_TEMPFAIL: something was away (a broker, a database); running the same command
# again resumes where it stopped, so a supervisor may retry on this code and alert on the others.
EXIT_TRANSIENT = 75
# A shell's code for a process a signal ended: 130 for SIGINT, 143 for SIGTERM.
EXIT_SIGNALLED = 128
# What a shell shows for a writer whose reader went away (`lagless lag --json | head`): SIGPIPE's.
EXIT_BROKEN_PIPE = EXIT_SIGNALLED + signal.SIGPIPE

log = logging.getLogger("lagless.cli")


class OneLineParser(argparse.ArgumentParser):
    """argparse prints usage plus an error; bad input gets one line instead."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"lagless: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; given the command about to run, its subparser only is real, the
    others are names (a command's module takes up to a second to import: Spark, pandas,
    matplotlib), so `lagless import` does not wait for `demo`'s imports."""
    from lagless.cli import COMMANDS, command_module

    parser = OneLineParser(
        prog="lagless",
        description="Import Kafka topics into stores with Spark, and see why a consumer lags.",
    )
    parser.add_argument(
        "--log-level",
        choices=logs.LEVELS,
        default=logs.DEFAULT_LEVEL,
        help="what lagless logs (default: %(default)s; debug also lets Spark's warnings through)",
    )
    parser.add_argument(
        "--log-file",
        metavar="PATH",
        help="where the log goes ('-': stderr; default: $LAGLESS_LOG_FILE, else an import's "
        "own file, one per --checkpoint, under $XDG_STATE_HOME/lagless/imports/, else "
        "$XDG_STATE_HOME/lagless/lagless.log; $XDG_STATE_HOME is ~/.local/state by default)",
    )
    parser.add_argument("--log-json", action="store_true", help="log JSON lines")
    parser.add_argument(
        "--version", action="version", version=f"lagless {version()}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    for name in COMMANDS:
        if command in (None, name):
            command_module(name).register(sub)
        else:
            sub.add_parser(name)
    return parser


def version() -> str:
    """lagless's installed version (pyproject.toml's)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("lagless")
    except PackageNotFoundError:  # run from a folder, not installed
        return "(not installed)"


def command_in(argv: Sequence[str]) -> str | None:
    """The command `argv` names: its first word that is neither an option of lagless's own
    nor an option's value. None when it names none lagless has (then every command is
    registered, for the help or the error)."""
    from lagless.cli import COMMANDS

    options = build_parser(command="")._option_string_actions
    words = iter(argv)
    for word in words:
        if word == "--":
            word = next(words, "")
        elif word.startswith("-"):
            option = options.get(word)
            if option is not None and option.nargs != 0:
                next(words, None)  # its value
            continue
        return word if word in COMMANDS else None
    return None


def misspelt(parser: argparse.ArgumentParser, argv: Sequence[str]) -> str | None:
    """The first `--option` of argv that neither lagless nor the command takes but that is
    close to one they do, said with it: `unrecognized option --bootstrp (did you mean
    --bootstrap?)`. None when there is none (argparse then says what else is wrong)."""
    known = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                known.update(command._option_string_actions)
    for word in argv:
        if word == "--":
            break
        option = word.split("=", 1)[0]
        if not option.startswith("--") or option in known:
            continue
        close = difflib.get_close_matches(option, sorted(known), n=1, cutoff=0.75)
        if close:
            return f"unrecognized option {option} (did you mean {close[0]}?)"
    return None


def full_disk(exc: BaseException) -> OSError | None:
    """The OSError of a full disk (or quota) that `exc` is or was raised from; None if none."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return current
        current = current.__cause__ or current.__context__
    return None


def exit_code(exc: BaseException) -> int:
    """BadInput 2, TransientError 75, stopped by a signal 128 + its number, anything else 1."""
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_SIGNALLED + getattr(exc, "signal_number", signal.SIGINT)
    found = from_spark(exc)  # what it is or carries across Spark's boundary
    if isinstance(found, Stopped):
        return EXIT_SIGNALLED + found.signal_number
    if isinstance(found, BadInput):
        return EXIT_BAD_INPUT
    if isinstance(found, TransientError):
        return EXIT_TRANSIENT
    return EXIT_FAILED


def one_line(exc: BaseException) -> str:
    """What stderr says about a failure: one line."""
    if isinstance(exc, KeyboardInterrupt):
        name = signal.Signals(getattr(exc, "signal_number", signal.SIGINT)).name
        return f"lagless: stopped by {name}; a rerun resumes"
    found = from_spark(exc)  # what it is or carries across Spark's boundary
    if isinstance(found, Stopped):
        return f"lagless: {found}"
    if isinstance(found, BadInput):
        return f"lagless: error: {_first_line(found)}"
    if isinstance(found, TransientError):
        return f"lagless: failed, may pass on a rerun: {_first_line(found)}"
    if found is not None:
        return f"lagless: failed: {_first_line(found)}"
    disk = full_disk(exc)
    if disk is not None:
        where = f": {disk.filename}" if disk.filename else ""
        return f"lagless: failed: {os.strerror(disk.errno or errno.ENOSPC).lower()}{where}"
    return f"lagless: failed unexpectedly: {type(exc).__name__}: {_first_line(exc)}"


def main(argv: Sequence[str] | None = None) -> int:
    # First: a stop asked for while the command's modules load is heard too (signals.py).
    interrupt_on_signals()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser(command_in(argv))
        wrong = misspelt(parser, argv)
        if wrong is not None:
            parser.error(wrong)
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, or bad input said in one line (OneLineParser)
        return _flushed(int(done.code or 0))
    except BrokenPipeError:  # `lagless import --help | head -1`
        return _reader_gone()
    except KeyboardInterrupt as stopped:  # before the command began
        print(one_line(stopped), file=sys.stderr, flush=True)
        return exit_code(stopped)
    checkpoint = getattr(args, "checkpoint", None)  # an import logs into its own file
    where = logs.configure(args.log_level, args.log_file, args.log_json, checkpoint)
    log.debug("lagless %s", " ".join(argv))
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a reader gone away is caught, not at the exit
        return code
    except SystemExit as done:
        # rich's console ends the process so when its stdout's reader went away
        if isinstance(done.__context__, BrokenPipeError):
            return _reader_gone()
        raise
    except (Exception, KeyboardInterrupt) as exc:
        if isinstance(exc, BrokenPipeError) and _stdout_closed():  # `lagless lag | head -1`
            return _reader_gone()
        code = exit_code(exc)
        line = one_line(exc)
        if code == EXIT_BAD_INPUT or code > EXIT_SIGNALLED:
            log.warning("%s (exit %d)", line, code)  # a refusal or a stop: no trace to tell
        else:
            log.error("%s (exit %d)", line, code, exc_info=exc)
        details = logs.log_file()
        if code != EXIT_BAD_INPUT and details and where != logs.STDERR:
            line = f"{line} (details: {details})"
        print(line, file=sys.stderr, flush=True)
        return code


def _flushed(code: int) -> int:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return _reader_gone()
    return code


def _stdout_closed() -> bool:
    """Whether stdout is a pipe its reader closed (a BrokenPipeError may be another pipe's: a
    child process's)."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (OSError, ValueError):  # stdout closed or replaced by an object with no descriptor
        return False


def _reader_gone() -> int:
    """stdout's reader went away (`lagless lag --json | head`): end quietly, as a command that
    SIGPIPE ended, with what is left unwritten dropped (Python would otherwise complain as it
    flushes stdout at its exit)."""
    log.debug("stdout's reader went away")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


def _first_line(exc: BaseException) -> str:
    try:
        str(exc)
    except Exception:  # a py4j error whose JVM is gone
        return first_line(repr(exc.args))
    return first_line(exc)


if __name__ == "__main__":
    sys.exit(main())
