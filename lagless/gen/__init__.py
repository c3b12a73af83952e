"""Test data: profiles of per-partition record counts, and a fast producer for them."""

from lagless.gen.produce import NewestRecord, ProducedSummary, RecordKind, produce_profile
from lagless.gen.profiles import Profile, build_profile, explicit, parse_counts

__all__ = [
    "NewestRecord",
    "ProducedSummary",
    "Profile",
    "RecordKind",
    "build_profile",
    "explicit",
    "parse_counts",
    "produce_profile",
]
