"""A fold beside the import's batches: the data files that lost FOLD_SHARE of their rows to
position deletes written again without those rows, on a thread of its own, while batches go on
committing; a later round commits it (maintenance.py).

Folding a 1M-row table of random-key updates rewrites it every few batches (~0.8 s on a 2-core
machine): in the round, on the batch's thread, that held the next batch's commit and made the
mirror's lag peak. Beside, the batches meanwhile delete more rows of the files being folded,
by their positions in the old file; the commit moves them to the new file's positions (the
rows kept keep their order: a row moves up by the folded rows before it) and swaps the old
file and all its delete files for the new file and the moved deletes, in one snapshot.

A kill leaves the new files in no snapshot (expiry removes them), as a kill mid-compaction
does; the thread is a daemon: a process that ends does not wait for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from pyiceberg.manifest import DataFile as IcebergFile

# A fold stops starting files after this long (a file started finishes): a large table that
# crosses the share all at once is folded over several, and each commit moves fewer deletes.
FOLD_S = 5.0


@dataclass
class Folded:
    """One data file folded: the positions its deletes named when the fold read it (sorted),
    and the files its kept rows were written to (none: every row was deleted)."""

    source: IcebergFile
    positions: np.ndarray
    written: list[IcebergFile]


@dataclass
class Fold:
    """A fold under way or ended, of one table's files. `error`: what ended it early (the
    files it finished are committed all the same)."""

    table: str
    sources: list[IcebergFile]
    done: list[Folded] = field(default_factory=list)
    error: BaseException | None = None
    thread: threading.Thread | None = None
    # When it started, as files' modification times count (expiry leaves files written since).
    started_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    @property
    def paths(self) -> set[str]:
        return {f.file_path for f in self.sources}

    def start(
        self,
        deleted: dict[str, pa.Array],
        rewrite: Callable[[IcebergFile, pa.Array], list[IcebergFile]],
    ) -> None:
        """Each source rewritten by `rewrite` without the positions `deleted` names in it."""

        def run() -> None:
            started = time.monotonic()
            try:
                for each in self.sources:
                    if self.done and time.monotonic() - started >= FOLD_S:
                        break
                    gone = deleted[each.file_path]
                    written = rewrite(each, gone)
                    positions = np.sort(gone.to_numpy(zero_copy_only=False))
                    self.done.append(Folded(each, positions, written))
            except BaseException as exc:  # raised by the round that commits the fold
                self.error = exc

        self.thread = threading.Thread(target=run, name=f"lagless-fold-{self.table}", daemon=True)
        self.thread.start()

    def finished(self) -> bool:
        return self.thread is not None and not self.thread.is_alive()


def moved_positions(folded: np.ndarray, now: np.ndarray) -> np.ndarray | None:
    """The rows of a folded file deleted since the fold read it (in `now`, every position its
    delete files name, and not in `folded`, the sorted positions the fold left out), at their
    places in the file the fold wrote: each moves up by the folded rows before it. None when
    `now` lacks a position the fold left out: the file's deletes were replaced by others' the
    fold cannot follow."""
    now = np.unique(now)
    if len(folded) and not np.isin(folded, now, assume_unique=True).all():
        return None
    since = np.setdiff1d(now, folded, assume_unique=True)
    return since - np.searchsorted(folded, since)
