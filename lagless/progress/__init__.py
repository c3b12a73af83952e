"""Progress of an import, reported to a pluggable collector (a live bar, or nothing)."""

from lagless.progress.collector import Collector, RichCollector, Summary, unknown_text

__all__ = ["Collector", "RichCollector", "Summary", "unknown_text"]
