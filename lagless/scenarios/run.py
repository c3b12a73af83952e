"""One scenario from start to cure: a noida-db broker, the backlog, the misbehaving group (in
a thread of this process; 004's consumer in processes of its own, which it crashes), the lag
and the doctor's diagnosis through the code `lagless lag` and `lagless doctor` run, then the
same backlog drained by `lagless import` into SQLite."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console

from lagless.exceptions import TerminalError
from lagless.importer.job import run_import
from lagless.importer.spec import ImportSpec
from lagless.kafka.config import KafkaConfig
from lagless.lag.doctor import DEFAULT_FETCH_BYTES, Examination, Finding, diagnose, examine, render
from lagless.lag.members import KafkaMembership
from lagless.lag.offsets import KafkaOffsetSource
from lagless.lag.report import History, build_report, collect, committed_records
from lagless.lag.table import rich_table
from lagless.progress import RichCollector
from lagless.scenarios.base import Scenario
from lagless.scenarios.noida import noida_kafka
from lagless.sinks.url import local_url

READY_TIMEOUT_S = 60.0
# After the import every partition is caught up: one sample says so (a status over time would
# need the doctor's window).
LAG_WINDOW_S = 0.0
# The doctor's own default watch and sampling (cli/doctor.py): the diagnosis a user gets.
DOCTOR_SECONDS = 10.0
DOCTOR_SAMPLES = 10


@dataclass
class Outcome:
    scenario: str
    group: str
    status: str = ""
    findings: list[Finding] = field(default_factory=list)
    produced: int = 0
    stored: int = 0
    lag_after_import: int = 0

    def as_json(self) -> dict[str, object]:
        return {
            "scenario": self.scenario,
            "group": self.group,
            "status": self.status,
            "findings": [f.as_json() for f in self.findings],
            "produced": self.produced,
            "stored": self.stored,
            "lag_after_import": self.lag_after_import,
        }


def run_scenario(
    scenario: Scenario, console: Console, out: str, doctor_seconds: float = DOCTOR_SECONDS
) -> Outcome:
    outcome = Outcome(scenario.name, scenario.group)
    console.rule(f"field report {scenario.name}")
    console.print(scenario.title)
    with noida_kafka() as bootstrap:
        config = KafkaConfig(bootstrap)
        outcome.produced = scenario.produce(config)
        console.print(
            f"noida-db at {bootstrap}; {outcome.produced:,} records in {scenario.topic!r}"
        )
        database = os.path.join(out, f"scenario-{scenario.name}.db")
        sink_url = local_url("sqlite", database)
        exam = _examine_misbehaving_group(scenario, console, config, sink_url, doctor_seconds)
        outcome.findings = _findings(scenario, exam, config, sink_url)
        outcome.status = exam.report.status.name
        console.print(render(exam, outcome.findings))
        console.rule("the cure")
        console.print(scenario.cure)
        spec = ImportSpec(
            kafka=config,
            topics=(scenario.topic,),
            sink_url=sink_url,
            checkpoint=os.path.join(out, f"checkpoint-{scenario.name}"),
            group=scenario.group,
        )
        run_import(spec, RichCollector(console))
        outcome.lag_after_import = _show_lag(
            console, config, scenario, f"lagless lag --group {scenario.group}, after the import"
        )
    with sqlite3.connect(database) as conn:
        outcome.stored = conn.execute(f'SELECT count(*) FROM "{scenario.topic}"').fetchone()[0]
    console.print(f"{outcome.stored:,} of {outcome.produced:,} records in {database}")
    if outcome.stored != outcome.produced or outcome.lag_after_import:
        raise TerminalError(
            f"scenario {scenario.name}: {outcome.stored} of {outcome.produced} records stored, "
            f"lag {outcome.lag_after_import} after the import"
        )
    return outcome


def _examine_misbehaving_group(
    scenario: Scenario, console: Console, config: KafkaConfig, sink_url: str, doctor_seconds: float
) -> Examination:
    """The doctor's examination, while the scenario's group misbehaves in a thread of its own;
    a TerminalError when the group does not start or fails."""
    failed: list[BaseException] = []
    ready, stop = threading.Event(), threading.Event()
    scenario.watching = threading.Event()

    def group_thread() -> None:
        try:
            scenario.misbehave(config, sink_url, ready, stop)
        except BaseException as exc:  # reported by the main thread
            failed.append(exc)
            ready.set()

    thread = threading.Thread(target=group_thread, name=f"group-{scenario.name}")
    thread.start()
    try:
        if not ready.wait(READY_TIMEOUT_S) or failed:
            raise TerminalError(f"scenario {scenario.name}'s group did not start: {failed}")
        exam = _examine(scenario, console, config, doctor_seconds)
    finally:
        stop.set()
        thread.join()
    if failed:
        raise TerminalError(f"scenario {scenario.name}'s group failed: {failed[0]}")
    return exam


def _examine(
    scenario: Scenario, console: Console, config: KafkaConfig, doctor_seconds: float
) -> Examination:
    """What `lagless doctor` looks at over `doctor_seconds`, and the lag over its samples."""
    console.print(
        f"lagless doctor --group {scenario.group} --seconds {doctor_seconds:g}"
        + (
            f" --fetch-bytes {scenario.fetch_bytes}"
            if scenario.fetch_bytes != DEFAULT_FETCH_BYTES
            else ""
        )
        + " (watching while the group goes on)"
    )
    source = KafkaOffsetSource(config, scenario.group, scenario.topic)
    membership = KafkaMembership(config)
    try:
        interval_s = doctor_seconds / DOCTOR_SAMPLES
        exam = examine(
            scenario.group,
            source,
            membership,
            doctor_seconds,
            interval_s,
            sleep=_telling(scenario.watching),
        )
    finally:
        source.close()
        membership.close()  # its DescribeGroups child process
    # The lag over the same samples and window as the doctor's: one verdict, the same
    # word in the table and in the doctor's status line (the field report's own table
    # watched one second and called partitions STALL that the doctor saw move).
    console.print(
        f"lagless lag --group {scenario.group} --window {doctor_seconds:g} (the doctor's samples)"
    )
    console.print(rich_table(exam.report, time.time()))
    return exam


def _findings(
    scenario: Scenario, exam: Examination, config: KafkaConfig, sink_url: str
) -> list[Finding]:
    """The doctor's findings, and those only the broker shows (the scenario's own)."""
    findings = diagnose(exam, scenario.fetch_bytes)
    seen_outside = scenario.broker_findings(config, sink_url)
    if seen_outside:
        # The group itself may look healthy (004's does): not next to a finding that it isn't.
        findings = [f for f in findings if f.kind != "healthy"]
    return findings + seen_outside


def _telling(watching: threading.Event) -> Callable[[float], None]:
    """The doctor's sleep between samples, which sets `watching` first: its first sample is
    taken by then."""

    def sleep(seconds: float) -> None:
        watching.set()
        time.sleep(seconds)

    return sleep


def _show_lag(console: Console, config: KafkaConfig, scenario: Scenario, title: str) -> int:
    """What `lagless lag` prints (cli/lag.py): a window of samples, the report, its table."""
    source = KafkaOffsetSource(config, scenario.group, scenario.topic)
    try:
        history = History(keep_s=LAG_WINDOW_S)
        collect(source, history, LAG_WINDOW_S, LAG_WINDOW_S / 4)
        found = committed_records(source, history)
        report = build_report(scenario.group, history, LAG_WINDOW_S, found)
    finally:
        source.close()
    console.print(title)
    console.print(rich_table(report, time.time()))
    return report.total_lag
