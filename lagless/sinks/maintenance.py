"""Table maintenance: what keeps a table a continuous import feeds healthy for days.

Every batch adds a small file and a version (a Delta log entry, an Iceberg snapshot, a Parquet
batch folder); an upsert rewrites the files it touches. Left alone, readers slow with the file
count and the disk fills with files only old versions read. Each folder store implements
`StoreMaintenance` (`sinks/<store>/maintenance.py`):

- **compaction**: files smaller than the policy's target are merged (`plan`, below), in one
  commit that changes no row and keeps the table's ledger (sinks/ledger.py): Delta keeps its
  application transactions, Iceberg's compaction snapshot carries `lagless.held`, a merged
  Parquet folder lists every range of the folders it replaced;
- **expiry**: versions older than the history window are dropped, and files only they read
  are removed; never a file a version inside the window reads, never what the ledger needs;
- **health**: what `lag --sink` shows of a table's files.

The importer calls them between batches (importer/maintenance.py), `lagless maintain` once.
Neither changes what a reader of the table's current version sees.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from lagless.exceptions import ConcurrentMaintenance
from lagless.first_line import first_line

# A reader opens, plans and decodes each file: past this size more files cost nothing more.
DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024
# Versions a reader that started an hour ago may still be reading, and time travel within it.
DEFAULT_KEEP_HISTORY_S = 3600.0
# The compaction tiers: small files by size, RATIO apart (so each byte is rewritten about once
# per tier on its way to the target), from the target down to LOWEST_RUNG.
RATIO = 4
LOWEST_RUNG = 64 * 1024
# Past this many small files, the lowest tiers are merged whatever they hold.
MOST_SMALL_FILES = 12
# While the small files add up to less than target / ALL_BELOW (8 MiB of 128 MiB), RATIO of
# them are merged all together: a reader then opens one file, at most that much rewritten a
# round.
ALL_BELOW = 16


@contextmanager
def beside_others(what: str, *errors: type[BaseException]) -> Iterator[None]:
    """`errors` (a store library's conflicts, and a file gone: another writer's expiry or log
    cleanup removed what the round read) raised as ConcurrentMaintenance about `what`."""
    caught: tuple[type[BaseException], ...] = (FileNotFoundError, *errors)
    try:
        yield
    except caught as exc:
        raise ConcurrentMaintenance(
            f"{what}: another writer changed it during maintenance ({first_line(exc)})"
        ) from exc


@dataclass(frozen=True)
class Policy:
    """What maintenance aims at: files of up to `target_file_size` bytes, versions kept for
    `keep_history_s` seconds."""

    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    keep_history_s: float = DEFAULT_KEEP_HISTORY_S
    # Every small file merged into files of up to the target at once, as OPTIMIZE does
    # (`lagless maintain`); else step by step up the ladder (`plan`), as an import does.
    thorough: bool = False
    # The history window is one number a table keeps (Delta's retention properties, Iceberg's
    # history.expire.max-snapshot-age-ms): the import that maintains a table sets it to
    # `keep_history_s`; `lagless maintain` applies the table's, and sets `keep_history_s` only
    # on a table that keeps none.
    sets_window: bool = True


@dataclass(frozen=True)
class DataFile:
    """A data file of the table's current version: its path as the store names it, its
    bytes, and its rows where the table's metadata counts them (None: it does not)."""

    path: str
    size: int
    records: int | None = None


@dataclass
class Round:
    """What one maintenance round did to one table (the import's log says it)."""

    table: str
    compacted_files: int = 0
    written_files: int = 0
    rewritten_bytes: int = 0
    # Iceberg's position delete files merged into one, or folded into the files they name.
    merged_deletes: int = 0
    expired_versions: int = 0
    removed_files: int = 0
    removed_bytes: int = 0
    # The data bytes of the version expiry left, where it knows them at no cost (Delta);
    # 0: not known.
    live_bytes: int = 0
    seconds: float = 0.0
    # Why compaction left the table alone (a protocol lagless does not write, a lost race).
    skipped: str | None = None
    # The history window the table keeps, where it is not the one asked (`lagless maintain`).
    window_s: float | None = None
    # The round gave up to other writers that kept changing the table (ConcurrentMaintenance).
    conflicted: bool = False

    @property
    def did_something(self) -> bool:
        return bool(
            self.compacted_files
            or self.merged_deletes
            or self.expired_versions
            or self.removed_files
        )

    def text(self) -> str:
        done = []
        if self.compacted_files:
            done.append(
                f"{self.compacted_files} files compacted into {self.written_files} "
                f"({_mb(self.rewritten_bytes)})"
            )
        if self.merged_deletes:
            done.append(f"{self.merged_deletes} delete files merged")
        if self.expired_versions:
            done.append(f"{self.expired_versions} versions expired")
        if self.removed_files:
            done.append(f"{self.removed_files} files removed ({_mb(self.removed_bytes)})")
        if self.skipped:
            done.append(f"{'skipped' if self.conflicted else 'compaction skipped'}: {self.skipped}")
        if self.window_s is not None:
            done.append(f"the table's history window of {self.window_s:g} s applied")
        return f"{self.table}: {', '.join(done) or 'nothing to do'} in {self.seconds:.2f} s"

    def as_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Health:
    """A table's files as `lag --sink` shows them."""

    table: str
    # Data files of the current version, and those smaller than the target.
    data_files: int
    small_files: int
    # Versions (Delta log entries, Iceberg snapshots, Parquet folders merged away) kept.
    versions: int
    # Every file under the table's folder, against the data files of the current version.
    bytes_on_disk: int
    live_bytes: int
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def small_file_share(self) -> float:
        return self.small_files / self.data_files if self.data_files else 0.0

    def as_json(self) -> dict[str, object]:
        shown = asdict(self)
        shown["small_file_share"] = round(self.small_file_share, 3)
        return shown


class StoreMaintenance(ABC):
    """A folder store's maintenance of one table at a time. Each call reads the table as it is
    now, and is safe to run again after a crash at any point: a commit is all or nothing, and
    a file is removed only once no version inside the window reads it."""

    @abstractmethod
    def tables(self, table: str | None) -> list[str]:
        """The tables to maintain: `table` and the tables lagless keeps beside it (`_dlq`,
        `_tombstones`, `_moves`) that exist; None: every table of the store."""

    @abstractmethod
    def compact(self, table: str, policy: Policy, deadline: float, done: Round) -> None:
        """Merge the table's small files (plan), group after group while time.monotonic() is
        before `deadline` (the first group always runs); each group one commit that changes
        no row. Counts into `done`."""

    @abstractmethod
    def expire(self, table: str, policy: Policy, done: Round) -> None:
        """Drop versions older than the history window and remove the files only they read.
        Counts into `done`."""

    @abstractmethod
    def health(self, table: str, policy: Policy) -> Health | None:
        """The table's files now; None when there is no such table."""

    # Whether compaction may leave its long work (Iceberg's folds) running beside the import's
    # batches, for a later call to commit: set by the import's schedule. Else it is done in
    # the call (`lagless maintain`, a store without such work).
    aside = False

    def finished_aside(self) -> list[str]:
        """The tables whose work run aside has ended and waits for `settle` to commit it."""
        return []

    def aside_under_way(self) -> bool:
        """Whether work run aside has not ended yet."""
        return False

    def settle(self, table: str, done: Round) -> None:
        """The table's work run aside committed once it ended, the first step of every
        compaction. Counts into `done`."""
        return None  # a store with no work aside has none to commit


def plan(files: Sequence[DataFile], target: int, thorough: bool = False) -> list[list[DataFile]]:
    """Which files to merge, each group into one file: groups of at least two files, each file
    smaller than `target`, a group's bytes at most `target`, no file in two groups, smallest
    groups first.

    Small files fall into tiers by size, RATIO apart (`_tier`). A tier holding RATIO files or
    more is merged into files of the tier above, so each byte is rewritten about once per tier
    on its way to the target; while more than MOST_SMALL_FILES small files would remain, the
    lowest tiers are merged together (they are the cheapest). While all small files add up to
    less than target / ALL_BELOW, RATIO of them are merged all together (a small table stays
    one file). `thorough`: every small file at once, into files of up to the target
    (`lagless maintain`). Files are packed in the table's order."""
    small = [f for f in files if f.size < target]
    if thorough or (len(small) >= RATIO and sum(f.size for f in small) <= target // ALL_BELOW):
        return _packed(small, target)
    tiers: dict[int, list[DataFile]] = {}
    for each in small:
        tiers.setdefault(_tier(each.size, target), []).append(each)
    groups: list[list[DataFile]] = []
    merged: set[int] = set()
    for tier, members in tiers.items():
        if len(members) >= RATIO:
            groups += _packed(members, min(target, _top(tier, target) * RATIO))
            merged.add(tier)
    # The tiers left, smallest first: merged together (into one file, give or take) while too
    # many small files would remain.
    left = [tier for tier in sorted(tiers, reverse=True) if tier not in merged]
    untouched = sum(len(tiers[tier]) for tier in left)
    after_merges = len(small) - untouched - sum(len(g) - 1 for g in groups)
    chosen: set[str] = set()
    while left and after_merges + untouched + (1 if chosen else 0) > MOST_SMALL_FILES:
        tier = left.pop(0)
        chosen.update(f.path for f in tiers[tier])
        untouched -= len(tiers[tier])
    if len(chosen) > 1:
        groups += _packed([f for f in small if f.path in chosen], target)
    return sorted((g for g in groups if len(g) > 1), key=lambda g: sum(f.size for f in g))


def _tier(size: int, target: int) -> int:
    """0 for [target / RATIO, target), 1 for the next RATIO below, ...; the lowest tier holds
    everything below LOWEST_RUNG."""
    tier, top = 0, target
    while size < top // RATIO and top // RATIO >= LOWEST_RUNG:
        tier, top = tier + 1, top // RATIO
    return tier


def _top(tier: int, target: int) -> int:
    """The size a tier's files stay below."""
    return target // RATIO**tier


def _packed(files: Sequence[DataFile], most: int) -> list[list[DataFile]]:
    """Files in order, into groups of at most `most` bytes (a file alone is no group)."""
    groups: list[list[DataFile]] = []
    current: list[DataFile] = []
    filled = 0
    for each in files:
        if current and filled + each.size > most:
            groups.append(current)
            current, filled = [], 0
        current.append(each)
        filled += each.size
    groups.append(current)
    return [g for g in groups if len(g) > 1]


def parse_size(text: str) -> int:
    """`--target-file-size`: bytes, or a number with K, M, G (powers of 1024; `MiB`, `MB` and
    `M` alike). ValueError when it is none of these, or below 1 KiB."""
    units = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
    cleaned = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = cleaned, ""
    if cleaned and cleaned[-1] in units:
        number, unit = cleaned[:-1], cleaned[-1]
    size = int(float(number) * units[unit])
    if size < 1024:
        raise ValueError(f"{text!r} is below 1 KiB")
    return size


def _mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"
