"""The field reports lagless was built from (the failures README's table names: blocked
threads, out-of-order commits, large records, rebalances, auto-commit loss) reproduced on a
live broker: `lagless demo --scenario NAME`."""

from __future__ import annotations

from lagless.scenarios.autocommit import AutoCommit
from lagless.scenarios.base import Scenario
from lagless.scenarios.churn import Churn
from lagless.scenarios.large_records import LargeRecords
from lagless.scenarios.rewind import Rewind
from lagless.scenarios.unbalanced import Unbalanced

SCENARIOS: dict[str, type[Scenario]] = {
    cls.name: cls for cls in (Unbalanced, Rewind, LargeRecords, Churn, AutoCommit)
}

__all__ = ["SCENARIOS", "Scenario"]
