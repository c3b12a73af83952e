"""The simulator's PNG: records left over time, one line per strategy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on servers and in tests

import matplotlib.pyplot as plt
import numpy as np

from lagless.exceptions import BadInput
from lagless.lag.simulate import RECORD_UNITS, TIME_UNITS, Drain, scale_for

# Each strategy's line is drawn apart: its own dash pattern and marker, the markers of each
# line at points of their own, so lines that coincide (strategies that drain alike) all show.
STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
MARKS_PER_LINE = 8
SAMPLES = 16 * MARKS_PER_LINE


def write_chart(drains: Sequence[Drain], ideal_s: float, path: Path, title: str) -> None:
    """Records left over time, a line per strategy, the axes in units the backlog and the
    drain times ask for (simulate.scale_for)."""
    longest = max([ideal_s, *(t for drain in drains for t, _ in drain.curve)])
    most = max([1.0, *(left for drain in drains for _, left in drain.curve)])
    time_unit, seconds = scale_for(longest, TIME_UNITS)
    record_unit, records = scale_for(most, RECORD_UNITS)
    figure, axes = plt.subplots(figsize=(10, 6))
    try:
        for index, drain in enumerate(drains):
            # Between the curve's points the drain is linear (simulate.py): sampled evenly, a
            # line's markers fall where its own phase puts them, not on shared corners.
            times = np.linspace(0.0, drain.curve[-1][0], SAMPLES)
            at = np.array([t for t, _ in drain.curve], dtype=float)
            left = np.interp(times, at, np.array([n for _, n in drain.curve], dtype=float))
            step = SAMPLES // MARKS_PER_LINE
            axes.plot(
                times / seconds,
                left / records,
                label=drain.name,
                linestyle=STYLES[index % len(STYLES)],
                marker=MARKERS[index % len(MARKERS)],
                markevery=(index * step // max(1, len(drains)), step),
                markersize=6,
                alpha=0.85,
            )
        axes.axvline(ideal_s / seconds, color="grey", linestyle=":", label="ideal")
        axes.set_xlabel(time_unit)
        axes.set_ylabel(f"records left ({record_unit})" if record_unit else "records left")
        axes.set_xlim(left=0)
        axes.set_ylim(bottom=0)
        axes.set_title(title)
        axes.legend()
        try:
            figure.savefig(path, dpi=100)
        except OSError as exc:
            raise BadInput(f"cannot write {path}: {exc.strerror}") from None
    finally:
        plt.close(figure)
