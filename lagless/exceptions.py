"""Every error lagless raises on purpose derives from LaglessError.

The CLI turns a BadInput into a one-line message and exit code 2; a TransientError
may succeed when retried (a broker or a database briefly away); a TerminalError will not.
"""


class LaglessError(Exception):
    """Root of lagless's own errors."""


class BadInput(LaglessError):
    """The user asked for something that cannot work: exit code 2, one line, nothing written."""


class TerminalError(LaglessError):
    """A failure that retrying will not cure."""


class TransientError(LaglessError):
    """A failure that may pass: the caller may retry."""


class DataLossError(TerminalError):
    """Offsets the plan needs are gone from the broker (retention ran ahead of the import)."""
