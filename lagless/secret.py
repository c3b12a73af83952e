"""Passwords and keys as values that cannot leak by accident."""

from __future__ import annotations

from typing import Any


class Secret:
    """A string that prints as asterisks and cannot be used as a string: no concatenation,
    join, format or method leaks it. `reveal()` gives the plaintext to the one place that
    needs it (a client's configuration)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if isinstance(value, Secret):
            value = value.reveal()
        if not isinstance(value, str):
            raise TypeError(f"Secret holds a str, not {type(value).__name__}")
        self._value = value

    def __repr__(self) -> str:
        return "Secret('****')"

    def __str__(self) -> str:
        return "****"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __bool__(self) -> bool:
        return bool(self._value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Configurations travel to Spark's executors pickled, secrets with them.
        return (Secret, (self._value,))

    def reveal(self) -> str:
        return self._value


def reveal(value: str | Secret) -> str:
    return value.reveal() if isinstance(value, Secret) else str(value)
