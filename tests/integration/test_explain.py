"""`lagless import --explain` prints the next batch's plan and imports nothing."""

from __future__ import annotations

import json
import subprocess
import sys

from lagless.gen import explicit, produce_profile


def test_explain_json_covers_the_backlog_and_writes_nothing(broker, kafka, tmp_path):
    broker.create_topic("skewed", 4)
    produce_profile(kafka, "skewed", explicit([9000, 0, 300, 2700]), keys=10)
    args = [
        *("--bootstrap", broker.bootstrap, "--topic", "skewed", "--slots", "3"),
        *("--sink", f"sqlite:///{tmp_path}/out.db", "--checkpoint", str(tmp_path / "ckpt")),
    ]

    result = subprocess.run(
        [sys.executable, "-m", "lagless", "import", *args, "--explain", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["slots"] == 3
    pieces = [p for task in plan["tasks"] for p in task["pieces"]]
    covered = sorted((p["partition"], o) for p in pieces for o in range(p["from"], p["until"]))
    expected = [(p, o) for p, n in ((0, 9000), (2, 300), (3, 2700)) for o in range(n)]
    assert covered == expected
    assert all(p["records"] == p["until"] - p["from"] > 0 for p in pieces)
    assert all(p["bytes"] > p["records"] * 50 for p in pieces)  # ~100 B values plus keys
    # Weighed by bytes, and value sizes differ slightly between partitions.
    assert max(p["records"] for p in pieces) <= 12000 / 3 * 1.05
    # 1.2 MB in all is less than one task's minimum (8 MiB): one task reads every piece.
    assert len(plan["tasks"]) == 1
    assert plan["tasks"][0]["records"] == 12000
    assert list(tmp_path.iterdir()) == []
