"""The import on a real Spark standalone cluster: a master and two workers on loopback.

The cluster is started through pyspark's own `spark-class`, and the import runs as a
`lagless import --master spark://...` subprocess: this test process already holds the local
session of the other Spark tests, and a JVM has one SparkContext.

Two clusters. `cluster` shares everything with the driver (its disk, its Python: the workers
run this venv's python, lagless installed), as workers on the driver's machine would.
`isolated_cluster` is as close to workers on other machines as one machine gets: the workers
and their executors run as another user (nobody) in work folders of their own, so no path the
driver wrote (under pytest's tmp_path, mode 0700: the checkpoint, the driver's temp files) is
readable by them, and their Python is a packed environment shipped through spark.archives
(tests/harness/executor_env.py, the README's recipe) over Spark's own file server, unpacked
into each executor's folder. What one machine cannot give: another kernel, another network
(everything is on loopback), or a Spark install of the workers' own (they run this venv's
pyspark, which on a real cluster each worker machine has).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.parquet as pq
import pyspark
import pytest

from lagless.broker import EmbeddedBroker
from lagless.gen import explicit, produce_profile
from lagless.gen.produce import ProducedSummary
from lagless.kafka.config import KafkaConfig
from lagless.sinks.postgresql import TASK_APPLICATION
from tests.harness.executor_env import ALIAS, build_executor_env
from tests.harness.postgres import PostgresServer
from tests.integration.test_crash_safety import stored

pytestmark = pytest.mark.spark

SPARK_HOME = Path(pyspark.__file__).parent
PYTHON = sys.executable
WORKERS = 2
STARTUP_TIMEOUT_S = 90.0
IMPORT_TIMEOUT_S = 300.0  # a loaded 2-core machine took 90 s; unpacking the archive adds
# The executors' user on `isolated_cluster`: not the driver's (root), so it cannot read
# what the driver wrote under tmp_path.
NOBODY = 65534
AS_NOBODY = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")


@dataclass
class Cluster:
    master_url: str
    web_url: str
    worker_dirs: list[Path]
    logs: Path
    # What `lagless import` adds to its command and environment for this cluster.
    import_options: list[str] = field(default_factory=list)
    import_env: dict[str, str] = field(default_factory=dict)

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as response:
            state: dict[str, Any] = json.load(response)
            return state

    def log_tails(self) -> str:
        return "\n".join(
            f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            for log in sorted(self.logs.glob("*.log"))
        )


def spark_env(tmp: Path) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(tmp),
        "SPARK_CONF_DIR": str(tmp),  # an empty one: no spark-defaults.conf from elsewhere
        # No REST submission server: it would take the fixed port 6066.
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "PYSPARK_PYTHON": PYTHON,
        "PYSPARK_DRIVER_PYTHON": PYTHON,
    }


def spawn(
    args: list[str], env: dict[str, str], log: Path, as_user: tuple[str, ...] = ()
) -> subprocess.Popen[bytes]:
    """`spark-class` in its own process group, so teardown reaches the JVM it execs."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [*as_user, str(SPARK_HOME / "bin" / "spark-class"), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=15)


def wait_for_workers(cluster: Cluster, processes: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            raise AssertionError(f"a Spark daemon exited at startup\n{cluster.log_tails()}")
        try:
            if cluster.state()["aliveworkers"] == WORKERS:
                return
        except OSError:
            pass  # the master's web UI is not listening yet
        time.sleep(0.5)
    raise AssertionError(f"{WORKERS} workers did not register in time\n{cluster.log_tails()}")


def wait_for_completed_app(cluster: Cluster) -> list[dict[str, Any]]:
    """The master marks an application completed once its driver has gone; give it a moment."""
    deadline = time.monotonic() + 15
    while True:
        completed: list[dict[str, Any]] = cluster.state()["completedapps"]
        if completed or time.monotonic() > deadline:
            return completed
        time.sleep(0.5)


MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
MASTER_WEB_PORT = re.compile(r"Bound MasterWebUI to .* started at http://\S+:(\d+)")


def wait_for_master(log: Path, master: subprocess.Popen[bytes]) -> tuple[str, str]:
    """The addresses the master bound; every port is the kernel's choice (port 0), so no
    other process on the machine can hold one between our choosing and Spark's binding."""
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        url, web_port = MASTER_URL.search(text), MASTER_WEB_PORT.search(text)
        if url and web_port:
            return url.group(1), f"http://127.0.0.1:{web_port.group(1)}"
        if master.poll() is not None:
            break
        time.sleep(0.25)
    raise AssertionError(f"the master did not start\n{log.read_text(errors='replace')[-3000:]}")


@contextmanager
def running_cluster(
    tmp_path: Path,
    worker_root: Path,
    as_user: tuple[str, ...] = (),
    worker_env: dict[str, str] | None = None,
) -> Iterator[Cluster]:
    logs = tmp_path / "spark-logs"
    logs.mkdir()
    env = spark_env(logs)
    any_port = ("--port", "0", "--webui-port", "0")
    started = [
        spawn(
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", *any_port],
            env,
            logs / "master.log",
        )
    ]
    worker_dirs = [worker_root / f"worker-{n}" for n in range(WORKERS)]
    try:
        master_url, web_url = wait_for_master(logs / "master.log", started[0])
        for n, work_dir in enumerate(worker_dirs):
            work_dir.mkdir()
            if as_user:
                os.chown(work_dir, NOBODY, NOBODY)
            started.append(
                spawn(
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        *("--host", "127.0.0.1", *any_port),
                        *("--cores", "1", "--memory", "1g", "--work-dir", str(work_dir)),
                        master_url,
                    ],
                    {**env, **(worker_env or {}), "SPARK_WORKER_DIR": str(work_dir)},
                    logs / f"worker-{n}.log",
                    as_user,
                )
            )
        running = Cluster(master_url, web_url, worker_dirs, logs)
        wait_for_workers(running, started)
        yield running
    finally:
        for process in reversed(started):
            stop(process)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Workers that share the driver's disk and Python."""
    with running_cluster(tmp_path, tmp_path) as running:
        running.import_options = ["--shared-disk"]
        yield running


@pytest.fixture(scope="session")
def executor_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packed environment the isolated cluster's executors run (built once per session:
    about 40 s here, most of it pip installing from its cache)."""
    return build_executor_env(tmp_path_factory.mktemp("executor-env"))


@pytest.fixture
def isolated_cluster(tmp_path: Path, executor_env: Path) -> Iterator[Cluster]:
    """Workers that share neither the driver's disk nor its Python (see the module's doc)."""
    assert os.geteuid() == 0, "the workers run as nobody: the test runs as root (CI does)"
    # Outside tmp_path, whose 0700 parent keeps nobody out; the executors' folders are theirs.
    worker_root = Path(tempfile.mkdtemp(prefix="lagless-workers-"))
    worker_root.chmod(0o755)
    home = worker_root / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    try:
        with running_cluster(
            tmp_path, worker_root, AS_NOBODY, {"HOME": str(home), "SPARK_CONF_DIR": str(home)}
        ) as running:
            running.import_options = [
                "--spark-conf",
                f"spark.archives={executor_env}#{ALIAS}",
            ]
            running.import_env = {"PYSPARK_PYTHON": f"./{ALIAS}/bin/python"}
            yield running
    finally:
        shutil.rmtree(worker_root, ignore_errors=True)


def import_on_cluster(
    cluster: Cluster, topic: str, sink_url: str, tmp_path: Path, *options: str
) -> tuple[ProducedSummary, dict[str, Any]]:
    """`lagless import --master spark://...` of a fresh 4-partition topic: (produced, summary)."""
    with EmbeddedBroker(topics={topic: 4}) as broker:
        produced = produce_profile(
            KafkaConfig(broker.bootstrap), topic, explicit([1500, 0, 900, 2200]), keys=40
        )
        imported = subprocess.run(
            [
                *(PYTHON, "-m", "lagless", "import", "--master", cluster.master_url),
                *("--bootstrap", broker.bootstrap, "--topic", topic),
                *("--sink", sink_url, "--checkpoint", str(tmp_path / "ckpt")),
                *options,
                *cluster.import_options,
                "--json",
            ],
            env={
                **spark_env(cluster.logs),
                **cluster.import_env,
                "LAGLESS_LOG_FILE": str(tmp_path / "lagless.log"),
            },
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT_S,
        )
    assert imported.returncode == 0, f"{imported.stderr[-3000:]}\n{cluster.log_tails()}"
    summary = json.loads(imported.stdout.strip().splitlines()[-1])
    return produced, summary


def every_record_once(produced: ProducedSummary, pairs: list[tuple[int, int]]) -> None:
    assert len(pairs) == len(set(pairs)) == produced.records
    assert set(pairs) == {
        (p, offset) for p, (start, end) in produced.offsets.items() for offset in range(start, end)
    }


def ran_on_both_workers(cluster: Cluster) -> None:
    """The master lists the finished application, and both workers launched an executor for it
    (each keeps a folder per application it served)."""
    completed = wait_for_completed_app(cluster)
    assert [app["name"] for app in completed] == ["lagless"]
    app_id = completed[0]["id"]
    assert all((work_dir / app_id).is_dir() for work_dir in cluster.worker_dirs)


def test_bulk_import_on_a_standalone_cluster_lands_every_record_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    topic = "on_cluster"
    produced, summary = import_on_cluster(cluster, topic, f"parquet:///{tmp_path}/lake", tmp_path)

    assert summary["records"] == produced.records
    table = pq.read_table(tmp_path / "lake" / topic)
    every_record_once(
        produced,
        list(zip(table["partition"].to_pylist(), table["offset"].to_pylist(), strict=True)),
    )
    ran_on_both_workers(cluster)


@pytest.mark.matrix  # as the isolated cluster's PostgreSQL case, without its isolation
def test_postgresql_written_by_the_executors_on_a_standalone_cluster_lands_every_record_once(
    cluster: Cluster, tmp_path: Path, postgres: PostgresServer
) -> None:
    topic = "pg_on_cluster"
    with psycopg.connect(postgres.url, autocommit=True) as conn:
        # Every session's application name in the server's log: the tasks name theirs.
        conn.execute("ALTER SYSTEM SET log_connections = on")
        conn.execute("SELECT pg_reload_conf()")
    log = Path(postgres.folder) / "log"
    logged_before = log.stat().st_size
    try:
        # Batches of 1000 records: several staging tables, each filled by several tasks.
        produced, summary = import_on_cluster(
            cluster, topic, postgres.url, tmp_path, "--max-records-per-batch", "1000"
        )
    finally:
        with psycopg.connect(postgres.url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET log_connections")
            conn.execute("SELECT pg_reload_conf()")
        with log.open("rb") as handle:
            handle.seek(logged_before)
            logged = handle.read().decode(errors="replace")

    assert summary["records"] == summary["written"] == produced.records
    with psycopg.connect(postgres.url) as conn:
        pairs = conn.execute(f'SELECT "partition", "offset" FROM {topic}').fetchall()
        left = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE tablename LIKE %s", (f"{topic}_stage_%",)
        ).fetchone()
    every_record_once(produced, [(p, o) for p, o in pairs])
    assert left == (0,)  # each batch's staging table dropped with its merge
    # The rows reached the server through the Spark tasks' own sessions: on a cluster a task
    # runs in an executor of a worker, never in the driver.
    task_sessions = logged.count(f"application_name={TASK_APPLICATION}")
    assert task_sessions >= summary["batches"] >= 4, logged[-3000:]
    ran_on_both_workers(cluster)


@dataclass(frozen=True)
class Store:
    """A store the isolated cluster imports into: the fixtures it needs (its server) and its
    sink URL; its rows are read back by the store's own reader (test_crash_safety.stored)."""

    fixtures: tuple[str, ...]
    url: Callable[[dict[str, Any], Path], str]


def on_s3(kind: str) -> pytest.ParameterSet:
    """A table on the `s3_env` server (SeaweedFS), whose AWS variables the import's driver gets
    and the workers, started before, do not: the tasks' access travels with the job."""

    def url(servers: dict[str, Any], tmp_path: Path) -> str:
        found = servers["s3_env"].url(kind, f"cluster-{tmp_path.name}")
        return f"{found}?catalog={tmp_path}/catalog.db" if kind == "iceberg" else found

    return pytest.param(Store(("s3_env",), url), id=f"{kind}+s3", marks=pytest.mark.matrix)


# Stores the executors reach without the driver's disk; adding one is one entry here. All in
# the matrix: the executors' environment alone takes ~90 s to build here, and CI's run imports
# on a cluster with test_bulk_import_on_a_standalone_cluster_lands_every_record_once.
STORES_WITHOUT_THE_DRIVERS_DISK = [
    pytest.param(
        Store(("postgres",), lambda servers, _: servers["postgres"].url),
        id="postgresql",
        marks=pytest.mark.matrix,
    ),
    on_s3("parquet"),
    on_s3("delta"),
    on_s3("iceberg"),
]


def executors_lagless(log: Path) -> list[str]:
    """Where the executors' Python imported lagless from, as lagless's driver logged it
    (source/worker_python.py asks them before the import starts)."""
    found = re.findall(r"imports lagless from (.+)$", log.read_text(errors="replace"), re.M)
    assert len(found) == 1, log.read_text(errors="replace")[-3000:]
    return found[0].split(", ")


@pytest.mark.parametrize("store", STORES_WITHOUT_THE_DRIVERS_DISK)
def test_a_cluster_without_the_drivers_disk_or_lagless_imports_every_record_once(
    isolated_cluster: Cluster, tmp_path: Path, store: Store, request: pytest.FixtureRequest
) -> None:
    servers = {name: request.getfixturevalue(name) for name in store.fixtures}
    topic = "isolated_" + re.sub(r"\W", "_", request.node.callspec.id)
    sink_url = store.url(servers, tmp_path)
    produced, summary = import_on_cluster(
        isolated_cluster,
        topic,
        sink_url,
        tmp_path,
        "--max-records-per-batch",
        "1000",
    )

    assert summary["records"] == produced.records
    every_record_once(produced, stored(sink_url, topic, ("partition", "offset")))
    ran_on_both_workers(isolated_cluster)
    # The executors ran lagless from the archive Spark unpacked into their own folders, not
    # from this source tree or this venv...
    places = executors_lagless(tmp_path / "lagless.log")
    for place in places:
        inside = [d for d in isolated_cluster.worker_dirs if Path(place).is_relative_to(d)]
        assert inside and f"/{ALIAS}/lib/" in place, place
    # ...and, as another user, could not have read what the driver wrote.
    unreadable = subprocess.run([*AS_NOBODY, "test", "-r", str(tmp_path / "ckpt")])
    assert unreadable.returncode == 1
