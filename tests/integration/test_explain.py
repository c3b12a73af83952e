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
    tasks = plan["tasks"]
    covered = sorted((t["partition"], o) for t in tasks for o in range(t["from"], t["until"]))
    expected = [(p, o) for p, n in ((0, 9000), (2, 300), (3, 2700)) for o in range(n)]
    assert covered == expected
    assert all(t["records"] == t["until"] - t["from"] > 0 for t in tasks)
    assert all(t["bytes"] > t["records"] * 50 for t in tasks)  # ~100 B values plus keys
    # Weighed by bytes, and value sizes differ slightly between partitions.
    assert max(t["records"] for t in tasks) <= 12000 / 3 * 1.05
    assert [t["records"] for t in tasks] == sorted((t["records"] for t in tasks), reverse=True)
    assert list(tmp_path.iterdir()) == []
