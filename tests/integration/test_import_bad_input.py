"""`lagless import` refuses bad input with one line and exit code 2, writing nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
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
        ({"--topic": "ordrs"}, "topic 'ordrs' does not exist on 127.0.0.1:"),
        ({"--topic": "ordrs"}, "; its topics: orders"),  # issue 34.6: what there is
        ({"--sink": "mysql://db/x"}, "sink URL scheme 'mysql' is not one of"),
        ({"--sink": "sqlite://"}, "has no path"),
        ({"--table": "1bad;drop"}, "table name '1bad;drop' is not a valid identifier"),
        ({"--sink": "sqlite:///{tmp}/a_file/db.sqlite"}, "is not a directory"),
        ({"--checkpoint": "{tmp}/a_file/ckpt"}, "is not a directory"),
        ({"--sink": "parquet:///{tmp}/lake", "--write": "upsert"}, "append only"),
        ({"--sink": "delta://"}, "has no path"),
        ({"--sink": "delta:///{tmp}/a_file/lake"}, "is not a directory"),
        ({"--max-records-per-batch": "0"}, "--max-records-per-batch: must be at least 1, not 0"),
        # Issue 31.7: every option checked before anything is written.
        (
            {"--trigger-seconds": "-1", "--mode": "continuous"},
            "argument --trigger-seconds: must be a number of seconds above 0, not -1",
        ),
        ({"--trigger-seconds": "0"}, "--trigger-seconds: must be a number of seconds above 0"),
        ({"--trigger-seconds": "nan"}, "--trigger-seconds: must be a finite number, not nan"),
        ({"--retry-seconds": "-5"}, "--retry-seconds: must be a number of seconds, 0 or more"),
        ({"--topic": ""}, "argument --topic: must not be empty"),
        ({"--table": ""}, "argument --table: must not be empty"),
        ({"--group": ""}, "argument --group: must not be empty"),
        ({"--group": " g"}, "argument --group: ' g' has spaces around it"),
        ({"--key-field": "id,,kind", "--write": "upsert"}, "--key-field 'id,,kind' names an empty"),
        (
            {"--sink": "iceberg:///{tmp}/lake", "--table": "a.b.c"},
            "Iceberg table 'a.b.c' has 2 dots: lagless takes TABLE or NAMESPACE.TABLE",
        ),
        ({"--sink": "sqlite:///%ff.db"}, "a percent-escape of its path is not UTF-8"),
        ({"--kafka-option": "novalue"}, "is not KEY=VALUE"),
        ({"--dead-letter-topic": "nowhere"}, "topic 'nowhere' does not exist"),
        ({"--dead-letter-topic": "orders"}, "--dead-letter-topic 'orders' is being imported"),
        ({"--spark-conf": "archives=x.tar.gz"}, "is not KEY=VALUE with a key starting spark."),
        # A cluster master, nothing listening: refused before Spark or the broker is asked.
        *(
            ({"--master": "spark://127.0.0.1:1", "--sink": sink}, says)
            for sink, says in [
                ("sqlite:///{tmp}/db.sqlite", "?write_from=driver to the sink URL, or pass"),
                ("parquet:///{tmp}/lake", "which the executors of --master spark://127.0.0.1:1"),
                ("delta:///{tmp}/lake", "pass --shared-disk if every executor sees"),
                (
                    "iceberg:///{tmp}/lake",
                    "may not see; import into PostgreSQL or a table on S3, or pass",
                ),
            ]
        ),
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


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["import", "--bootstrp", "x:1", "--topic", "t"], "--bootstrp (did you mean --bootstrap?)"),
        (["lag", "--bootstrap", "x:1", "--grup", "g"], "--grup (did you mean --group?)"),
        (["--log-levl=debug", "lag"], "--log-levl (did you mean --log-level?)"),
    ],
)
def test_a_misspelt_option_is_told_with_the_one_meant(argv, says):
    """Issue 34.6: before argparse's "required: --bootstrap", which would hide the typo."""
    result = run_cli(*argv)
    assert result.returncode == 2
    assert result.stderr == f"lagless: error: unrecognized option {says}\n"


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
        (["--starting-timestamp", "-1"], "--starting-timestamp: must be milliseconds since"),
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


# Each case is one CLI run that fails before Spark starts (~1.5 s, most of it imports): the
# cases of a test run side by side, each in a folder of its own.
UNWRITABLE = ("/sys/lagless-test", "/proc/lagless-test", "{tmp}/a_file")
STORES = {
    "sqlite": "sqlite:///{place}/db.sqlite",
    "parquet": "parquet:///{place}/lake",
    "delta": "delta:///{place}/lake",
    # No server: the checkpoint is refused before the sink is asked.
    "postgresql": "postgresql://me:secret@127.0.0.1:1/db",
}


def snapshot(folder: Path) -> list[tuple[str, int]]:
    return sorted((str(p), p.stat().st_size) for p in folder.rglob("*"))


def refusals(bootstrap: str, root: Path, cases: list[tuple[dict[str, str], str]]) -> list[str]:
    """Run each case (options over import_args, with {tmp} its folder; what stderr says) and
    return what went wrong: anything but exit 2, one line saying it, nothing written."""

    def run(number: int, over: dict[str, str], says: str) -> str | None:
        tmp = root / f"case{number}"
        tmp.mkdir()
        (tmp / "a_file").write_text("not a folder")
        if any("/out" in value for value in over.values()):
            (tmp / "out").mkdir()
            (tmp / "out" / "orders").write_text("in the way")
            (tmp / "out" / "db.sqlite-lagless-staging").write_text("in the way")
        over = {k: v.replace("{tmp}", str(tmp)) for k, v in over.items()}
        says = says.replace("{tmp}", str(tmp))
        before = snapshot(tmp)
        result = run_cli(*import_args(bootstrap, tmp, **over))
        lines = result.stderr.strip().splitlines()
        if (
            result.returncode == 2
            and len(lines) == 1
            and lines[0].startswith("lagless: error:")
            and says in lines[0]
            and "secret" not in result.stderr
            and snapshot(tmp) == before
            and not any(os.path.exists(p) for p in UNWRITABLE[:2])
        ):
            return None
        return f"{over}: exit {result.returncode}, {result.stderr!r}, {snapshot(tmp)}"

    with ThreadPoolExecutor(max_workers=4) as pool:
        found = pool.map(lambda case: run(case[0], *case[1]), enumerate(cases))
        return [failure for failure in found if failure is not None]


def test_an_unwritable_checkpoint_is_one_line_exit_2_for_every_store(orders_broker, tmp_path):
    cases = [
        (
            {"--sink": STORES[store].replace("{place}", "{tmp}/out"), "--checkpoint": place},
            f"checkpoint directory path '{place}' "
            + ("is a file" if place.endswith("a_file") else "is not writable: nothing can be"),
        )
        for store in sorted(STORES)
        for place in UNWRITABLE
    ]
    assert refusals(orders_broker.bootstrap, tmp_path, cases) == []


def test_an_unwritable_sink_is_one_line_exit_2_for_every_store(orders_broker, tmp_path):
    cases = [
        ({"--sink": STORES[store].replace("{place}", place)}, "is not writable: nothing can be")
        for store in ("sqlite", "parquet", "delta")
        for place in UNWRITABLE[:2]
    ]
    cases += [
        ({"--sink": "sqlite:///{tmp}/a_file/db.sqlite"}, "'{tmp}/a_file' is not a directory"),
        ({"--sink": "sqlite:///{tmp}"}, "file path '{tmp}' is a directory"),
        ({"--sink": "parquet:///{tmp}/a_file"}, "directory path '{tmp}/a_file' is a file"),
        ({"--sink": "delta:///{tmp}/a_file"}, "directory path '{tmp}/a_file' is a file"),
        # A file where the store keeps a table or stages files:
        ({"--sink": "parquet:///{tmp}/out"}, "path '{tmp}/out/orders' is a file"),
        ({"--sink": "delta:///{tmp}/out"}, "path '{tmp}/out/orders' is a file"),
        ({"--sink": "sqlite:///{tmp}/out/db.sqlite"}, "staging directory path"),
    ]
    assert refusals(orders_broker.bootstrap, tmp_path, cases) == []
