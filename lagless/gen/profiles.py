"""Test-data profiles: how many records each partition gets, and how big they are.

Pure: nothing here talks to Kafka. The embedded broker keeps about 5 MiB of (compressed)
batches per partition and silently drops older ones beyond that, so a profile that would not
fit is refused up front rather than producing a topic that is missing its start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lagless.exceptions import BadInput

DEFAULT_RECORD_BYTES = 100
LARGE_RECORD_BYTES = 50_000
MAX_RECORD_BYTES = 900_000  # librdkafka's default message.max.bytes is 1,000,000 with headers
COMPRESSIONS = ("none", "lz4", "zstd")

# What a partition may hold, in estimated stored bytes: below the embedded broker's 5 MiB so
# that a whole batch (up to ~1 MB) can land on top without the broker deleting the oldest one.
PARTITION_BYTES_LIMIT = 4_000_000
# Per-record cost beside the value in an uncompressed batch: key, varint lengths, deltas.
_RECORD_OVERHEAD_BYTES = 28
# Our values are mostly a run of one character, so compression shrinks them to a fixed part
# (key, seq digits) plus a sliver of the padding. Measured on the embedded broker (records kept
# of a 5 MiB partition, as `gen` writes them): lz4 16.9 B per 100 B record and 19.2 B per 300 B;
# zstd 8.6 B and 9.9 B, and under 262 B per 50 KB. The estimates below stay above those.
_COMPRESSED_BYTES = {"lz4": (24, 32), "zstd": (12, 100)}  # fixed part, padding divisor
# Values are never shorter than their JSON skeleton, whatever --record-bytes asks.
_MIN_VALUE_BYTES = 64
# The deals profile's documents compress far less than padding when each fills a batch alone:
# 800 KB documents kept ~19 KB each as JSON and ~27 KB as Avro under zstd, ~100 KB as JSON
# under lz4 (smaller ones, many near-identical versions per batch, compress much further).
# Divisors of record_bytes, kept below those:
_DOCUMENT_DIVISOR = {"lz4": 6, "zstd": 25}

# The lag column of the first table in seed 000: 12 partitions far behind, 4 half-way, 8 done.
SEED_000_LAG = (
    9497160, 9478898, 9460836, 9480060, 9494178, 9545021, 9418620, 9522299,
    9239384, 9324698, 9275058, 9314988, 5352228, 5406157, 5364081, 5441238,
    0, 0, 0, 0, 0, 0, 0, 0,
)  # fmt: skip
# At scale 1 a full partition holds ~9,400 records, ~1 MB of 100 B values: 1/1000 of the seed.
SEED_000_FRACTION = 0.001

# Seed 002: one partition (7, as in the report) plus two more carry a flood of large records,
# a few are idle, the rest get ordinary small records.
SEED_002_PARTITIONS = 24
SEED_002_LARGE = (7, 15, 23)
SEED_002_EMPTY = (5, 11, 17)
SEED_002_LARGE_COUNT = 60
SEED_002_SMALL_COUNT = 2_000

UNIFORM_COUNT = 10_000

# The deals profile (seed 002's field report, values in gen/deals.py): 12 partitions as after
# the report's upgrade; partition 7 carries the chatty deals' floods, the others a trickle.
DEALS_PARTITIONS = 12
DEALS_CHATTY = 7
DEALS_COUNT = 100
DEALS_CHATTY_COUNT = 600
# The report's deals were ~800 KB of JSON; smaller by default so that a partition of the
# embedded broker keeps thousands of them.
DEALS_RECORD_BYTES = 32_000

# Each profile in words a user choosing one can follow (gen --help).
PROFILES = {
    "seed-000": f"{len(SEED_000_LAG)} partitions, 12 far behind, 4 half-way, 8 empty (the first "
    "failure's lag, threads blocked on drained partitions, a thousandth of it)",
    "seed-002": f"{SEED_002_PARTITIONS} partitions, {len(SEED_002_LARGE)} flooded with "
    f"{LARGE_RECORD_BYTES // 1000} KB records among small-record and {len(SEED_002_EMPTY)} empty "
    "ones (the third failure: large records)",
    "uniform": f"{UNIFORM_COUNT:,} records on every partition of the topic",
    "deals": f"{DEALS_PARTITIONS} partitions of deal documents keyed by the deal id, partition "
    f"{DEALS_CHATTY} flooded with updates (the third failure: update floods)",
}
PROFILE_NAMES = tuple(PROFILES)


@dataclass(frozen=True)
class Profile:
    """Per-partition record counts and value sizes (index = partition number)."""

    name: str
    counts: tuple[int, ...]
    record_bytes: tuple[int, ...]
    # Values are documents (the deals profile), not padded probes: they compress less.
    documents: bool = False

    def __post_init__(self) -> None:
        if not self.counts:
            raise BadInput(f"profile {self.name!r} has no partitions")
        if len(self.counts) != len(self.record_bytes):
            raise BadInput(f"profile {self.name!r}: counts and record sizes differ in length")
        if any(count < 0 for count in self.counts):
            raise BadInput(f"profile {self.name!r}: record counts must not be negative")
        for size in self.record_bytes:
            _check_record_bytes(size)

    @property
    def partitions(self) -> int:
        return len(self.counts)

    @property
    def total_records(self) -> int:
        return sum(self.counts)

    def stored_bytes(self, partition: int, compression: str) -> int:
        """Estimated bytes the broker keeps for `partition` once all its records are in."""
        size = max(self.record_bytes[partition], _MIN_VALUE_BYTES)
        if compression == "none":
            per_record = size + _RECORD_OVERHEAD_BYTES
        elif self.documents:
            per_record = _COMPRESSED_BYTES[compression][0] + size // _DOCUMENT_DIVISOR[compression]
        else:
            fixed, divisor = _COMPRESSED_BYTES[compression]
            per_record = fixed + size // divisor
        return self.counts[partition] * per_record

    def check_fits(self, compression: str) -> None:
        """BadInput when some partition would overflow what the embedded broker keeps."""
        if compression not in COMPRESSIONS:
            raise BadInput(f"compression {compression!r} is not one of {', '.join(COMPRESSIONS)}")
        worst = max(range(self.partitions), key=lambda p: self.stored_bytes(p, compression))
        stored = self.stored_bytes(worst, compression)
        if stored > PARTITION_BYTES_LIMIT:
            hint = "use a smaller --scale" if compression != "none" else "use --compression lz4"
            raise BadInput(
                f"profile {self.name!r}: partition {worst} would hold ~{stored / 1e6:.1f} MB "
                f"(compression {compression}), over the {PARTITION_BYTES_LIMIT / 1e6:.0f} MB "
                "gen puts in a partition (the embedded broker keeps about 5 MB a partition, "
                f"the rest room for a batch on top); {hint} or fewer/smaller records"
            )


def _check_record_bytes(size: int) -> None:
    if not 1 <= size <= MAX_RECORD_BYTES:
        raise BadInput(f"record size {size} is not between 1 and {MAX_RECORD_BYTES} bytes")


def _check_scale(scale: float) -> None:
    if not scale > 0:
        raise BadInput(f"--scale {scale} must be greater than 0")


def _scaled(count: int, scale: float) -> int:
    """A non-empty partition stays non-empty however small the scale: the shape matters."""
    return max(1, round(count * scale)) if count else 0


def seed_000(scale: float = 1.0, record_bytes: int = DEFAULT_RECORD_BYTES) -> Profile:
    """The unbalanced import of seed 000: 12 full partitions, 4 half, 8 empty."""
    _check_scale(scale)
    counts = tuple(_scaled(lag, SEED_000_FRACTION * scale) for lag in SEED_000_LAG)
    return Profile("seed-000", counts, (record_bytes,) * len(counts))


def seed_002(scale: float = 1.0, record_bytes: int = DEFAULT_RECORD_BYTES) -> Profile:
    """Seed 002: a few partitions of 50 KB records among small-record and empty ones."""
    _check_scale(scale)
    counts: list[int] = []
    sizes: list[int] = []
    for partition in range(SEED_002_PARTITIONS):
        if partition in SEED_002_LARGE:
            counts.append(_scaled(SEED_002_LARGE_COUNT, scale))
            sizes.append(LARGE_RECORD_BYTES)
        else:
            empty = partition in SEED_002_EMPTY
            counts.append(0 if empty else _scaled(SEED_002_SMALL_COUNT, scale))
            sizes.append(record_bytes)
    return Profile("seed-002", tuple(counts), tuple(sizes))


def uniform(
    partitions: int, scale: float = 1.0, record_bytes: int = DEFAULT_RECORD_BYTES
) -> Profile:
    """Every partition gets the same count (UNIFORM_COUNT at scale 1)."""
    _check_scale(scale)
    if partitions < 1:
        raise BadInput(f"uniform profile needs at least 1 partition, got {partitions}")
    count = _scaled(UNIFORM_COUNT, scale)
    return Profile("uniform", (count,) * partitions, (record_bytes,) * partitions)


def deals(scale: float = 1.0, record_bytes: int = DEALS_RECORD_BYTES) -> Profile:
    """Field report 002's deals: large documents, one partition flooded with updates."""
    _check_scale(scale)
    counts = tuple(
        _scaled(DEALS_CHATTY_COUNT if p == DEALS_CHATTY else DEALS_COUNT, scale)
        for p in range(DEALS_PARTITIONS)
    )
    return Profile("deals", counts, (record_bytes,) * len(counts), documents=True)


def parse_counts(text: str) -> tuple[int, ...]:
    """`"100,200,0,50"` -> (100, 200, 0, 50): one count per partition, in partition order."""
    parts = [part.strip() for part in text.split(",")]
    try:
        counts = tuple(int(part) for part in parts)
    except ValueError:
        raise BadInput(f"--counts {text!r} is not a comma-separated list of integers") from None
    if any(count < 0 for count in counts):
        raise BadInput(f"--counts {text!r} has a negative count")
    return counts


def explicit(counts: Sequence[int], record_bytes: int = DEFAULT_RECORD_BYTES) -> Profile:
    return Profile("counts", tuple(counts), (record_bytes,) * len(counts))


def build_profile(
    name: str,
    *,
    partitions: int,
    scale: float = 1.0,
    record_bytes: int | None = None,
) -> Profile:
    """A named profile; `partitions` (the topic's) is used only by `uniform`; record_bytes
    None: the profile's own (DEALS_RECORD_BYTES for deals, else DEFAULT_RECORD_BYTES)."""
    if name == "deals":
        return deals(scale, DEALS_RECORD_BYTES if record_bytes is None else record_bytes)
    size = DEFAULT_RECORD_BYTES if record_bytes is None else record_bytes
    _check_record_bytes(size)
    if name == "seed-000":
        return seed_000(scale, size)
    if name == "seed-002":
        return seed_002(scale, size)
    if name == "uniform":
        return uniform(partitions, scale, size)
    raise BadInput(f"profile {name!r} is not one of {', '.join(PROFILE_NAMES)}")
