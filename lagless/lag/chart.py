"""The simulator's PNG: records left over time, one line per strategy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and in tests

import matplotlib.pyplot as plt

from lagless.exceptions import BadInput
from lagless.lag.simulate import Drain


def write_chart(drains: Sequence[Drain], ideal_s: float, path: Path, title: str) -> None:
    figure, axes = plt.subplots(figsize=(10, 6))
    try:
        for drain in drains:
            hours = [t / 3600 for t, _ in drain.curve]
            millions = [left / 1e6 for _, left in drain.curve]
            axes.plot(hours, millions, label=drain.name)
        axes.axvline(ideal_s / 3600, color="grey", linestyle=":", label="ideal")
        axes.set_xlabel("hours")
        axes.set_ylabel("records left (millions)")
        axes.set_title(title)
        axes.legend()
        try:
            figure.savefig(path, dpi=100)
        except OSError as exc:
            raise BadInput(f"cannot write {path}: {exc.strerror}") from None
    finally:
        plt.close(figure)
