"""`lagless import` refuses bad input with one line and exit code 2, writing nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from lagless.broker import EmbeddedBroker
from lagless.kafka.config import REFUSED


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lagless", *args], capture_output=True, text=True, timeout=120
    )


def import_args(bootstrap: str, tmp_path: Path, **over: str) -> list[str]:
    values = {
        "--bootstrap": bootstrap,
        "--topic": "orders",
        "--sink": f"sqlite:///{tmp_path}/out/db.sqlite",
        "--checkpoint": str(tmp_path / "ckpt"),
    }
    values.update(over)
    return ["import", *[part for pair in values.items() for part in pair]]


@pytest.fixture(scope="module")
def orders_broker():  # type: ignore[no-untyped-def]
    with EmbeddedBroker(topics={"orders": 2}) as running:
        yield running


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"--topic": "missing"}, "topic 'missing' does not exist"),
        ({"--sink": "mysql://db/x"}, "sink URL scheme 'mysql' is not one of"),
        ({"--sink": "sqlite://"}, "has no path"),
        ({"--table": "1bad;drop"}, "table name '1bad;drop' is not a valid identifier"),
        ({"--sink": "sqlite:///{tmp}/a_file/db.sqlite"}, "is not a directory"),
        ({"--checkpoint": "{tmp}/a_file/ckpt"}, "is not a directory"),
        ({"--sink": "parquet:///{tmp}/lake", "--write": "upsert"}, "append only"),
        ({"--sink": "delta://"}, "has no path"),
        ({"--sink": "delta:///{tmp}/a_file/lake"}, "is not a directory"),
        ({"--max-records-per-batch": "0"}, "--max-records-per-batch must be at least 1"),
        ({"--kafka-option": "novalue"}, "is not KEY=VALUE"),
        ({"--dead-letter-topic": "nowhere"}, "topic 'nowhere' does not exist"),
        ({"--dead-letter-topic": "orders"}, "--dead-letter-topic 'orders' is being imported"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(orders_broker, tmp_path, over, says):
    (tmp_path / "a_file").write_text("not a folder")
    over = {k: v.replace("{tmp}", str(tmp_path)) for k, v in over.items()}

    result = run_cli(*import_args(orders_broker.bootstrap, tmp_path, **over))

    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lagless: error:"), result.stderr
    assert says in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_unknown_option_is_one_line(tmp_path):
    result = run_cli("import", "--no-such-flag")
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1


def test_unreachable_bootstrap_is_one_line_and_writes_nothing(tmp_path):
    result = run_cli(*import_args("127.0.0.1:1", tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        line for line in result.stderr.strip().splitlines() if line.startswith("lagless: error:")
    ]
    assert "cannot reach the broker at 127.0.0.1:1" in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        *[
            (["--kafka-option", f"{key}=x"], f"kafka option {key} cannot be set")
            for key in sorted(REFUSED)
        ],
        (
            ["--kafka-option", "security.protocol=bogus"],
            'kafka option security.protocol: Invalid value "bogus"',
        ),
        (["--kafka-option", "no.such.setting=1"], "kafka option no.such.setting: No such"),
        (["--kafka-option", "fetch.wait.max.ms=soon"], "kafka option fetch.wait.max.ms"),
        (["--mode", "continuous", "--ending-timestamp", "1"], "--ending-timestamp needs"),
        (["--starting-timestamp", "-1"], "--starting-timestamp must be milliseconds"),
    ],
)
def test_refused_kafka_settings_are_one_line_exit_2_and_write_nothing(
    orders_broker, tmp_path, extra, says
):
    result = run_cli(*import_args(orders_broker.bootstrap, tmp_path), *extra)

    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lagless: error:"), result.stderr
    assert says in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("existing", "write", "says"),
    [
        ("append", "upsert", "has another layout (lagless --write append)"),
        ("foreign", "append", "has another layout (not lagless)"),
        ("plain files", "append", "exists and is not a Delta table"),
    ],
)
def test_a_delta_folder_of_another_layout_is_one_line_exit_2_and_untouched(
    orders_broker, tmp_path, existing, write, says
):
    from deltalake import DeltaTable, write_deltalake

    table = tmp_path / "lake" / "orders"
    if existing == "plain files":
        table.mkdir(parents=True)
        (table / "data.csv").write_text("a,b\n")
    elif existing == "foreign":
        write_deltalake(str(table), pa.table({"a": [1]}))
    else:
        DeltaTable.create(
            str(table),
            schema=pa.schema(
                [("partition", pa.int32()), ("offset", pa.int64()), ("timestamp", pa.int64())]
            ),
            description="lagless --write append",
        )
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    sink = {"--sink": f"delta:///{tmp_path}/lake", "--write": write}

    result = run_cli(*import_args(orders_broker.bootstrap, tmp_path, **sink))

    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], result.stderr
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before
