"""Metrics text, time lag methods and retention arithmetic on hand-made views."""

from __future__ import annotations

import pytest

from lagless.lag.doctor import Examination, diagnose
from lagless.lag.offsets import PartitionSample, RecordInfo
from lagless.lag.report import History, PartitionLag, build_report
from lagless.lag.retention import retention_risk
from lagless.lag.status import Status
from lagless.serve import api, metrics
from lagless.serve.view import GroupView, Series
from tests.harness.serve import metric, parse_metrics


def partition(**overrides: object) -> PartitionLag:
    fields: dict[str, object] = {
        "topic": "t", "partition": 0, "committed": 4, "log_start": 0, "end": 10, "lag": 6,
        "status": Status.OK, "sampled_at": 100.0, "committed_record_at": None,
        "interpolated_age_s": None, "retention": None,
    }  # fmt: skip
    fields.update(overrides)
    return PartitionLag(**fields)  # type: ignore[arg-type]


def group(*partitions: PartitionLag, name: str = "g") -> GroupView:
    return GroupView(
        name, partitions, Status.OK, None, None, 100.0, None, None, None, Series(), 3600.0
    )


def test_time_lag_is_exact_from_the_record_else_interpolated_and_labelled_so() -> None:
    exact = partition(committed_record_at=40.0, interpolated_age_s=5.0)
    interpolated = partition(partition=1, interpolated_age_s=5.0)
    unknown = partition(partition=2)
    assert exact.lag_seconds(now=103.0) == (63.0, "exact")
    assert interpolated.lag_seconds(now=103.0) == (8.0, "interpolated")
    assert unknown.lag_seconds(now=103.0) == (None, None)
    samples = parse_metrics(metrics.render([group(exact, interpolated, unknown)], 103.0, "c"))
    name = "kafka_consumergroup_group_lag_seconds"
    assert metric(samples, name, partition=0, method="exact") == 63.0
    assert metric(samples, name, partition=1, method="interpolated") == 8.0
    assert metric(samples, name, partition=2) is None
    assert metric(samples, "kafka_consumergroup_group_max_lag_seconds", group="g") == 63.0


def test_label_values_are_escaped_and_every_line_parses() -> None:
    text = metrics.render([group(partition(), name='we"ird\\gr\noup')], 100.0, "c")
    assert 'group="we\\"ird\\\\gr\\noup"' in text
    samples = parse_metrics(text)
    assert metric(samples, "kafka_consumergroup_group_sum_lag") == 6
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            assert line.endswith(" gauge")


def samples_with_log_start(
    *points: tuple[float, int], committed: int = 50
) -> list[PartitionSample]:
    return [PartitionSample("t", 0, at, committed, low, 100) for at, low in points]


def test_retention_margin_by_the_log_starts_rate() -> None:
    risk = retention_risk(samples_with_log_start((0.0, 10), (10.0, 30)))
    assert risk is not None
    assert risk.records_left == 20 and risk.log_start_per_s == 2.0
    assert risk.seconds_by_rate == 10.0 and risk.at_risk(60) and not risk.at_risk(5)
    still = retention_risk(samples_with_log_start((0.0, 10), (10.0, 10)))
    assert still is not None and still.seconds_by_rate is None and not still.at_risk(1e9)
    caught_up = [PartitionSample("t", 0, 0.0, 100, 10, 100)]
    assert retention_risk(caught_up) is None
    at_the_log_start = retention_risk(samples_with_log_start((0.0, 50), (10.0, 50)))
    assert at_the_log_start is not None and at_the_log_start.records_left == 0
    assert not at_the_log_start.at_risk(3600), "a log start that does not move deletes nothing"
    moving = retention_risk(samples_with_log_start((0.0, 40), (10.0, 50)))
    assert moving is not None and moving.seconds_by_rate == 0.0 and moving.at_risk(1)


def test_retention_margin_by_retention_ms_counts_from_the_committed_records_time() -> None:
    risk = retention_risk(
        samples_with_log_start((0.0, 10)), retention_ms=60_000, committed_record_at=-30.0
    )
    assert risk is not None and risk.seconds_by_retention() == 30.0 and risk.seconds_left() == 30.0


@pytest.mark.parametrize(("low", "code", "words"), [
    (45, "retention-risk", "has 5 records between the log start"),
    (53, "records-lost", "retention deleted 3 records the group had not read"),
])  # fmt: skip
def test_doctor_findings_for_retention(low: int, code: str, words: str) -> None:
    history = History(keep_s=100)
    history.add(samples_with_log_start((0.0, 10)))
    history.add(samples_with_log_start((10.0, low)))
    exam = Examination(build_report("g", history, 5), history, {}, None, 10)
    findings = diagnose(exam)
    assert findings[0].kind == code and words in findings[0].text


def test_lag_json_and_the_serve_api_show_the_same_partition() -> None:
    """One model: a caught-up partition is 0 s behind (exactly) in both, a lagging one is now
    minus its committed record's time in both, whatever the record's timestamp says."""
    history = History(keep_s=100)
    for at in (0.0, 10.0):
        history.add(
            [PartitionSample("t", 0, at, 100, 0, 100), PartitionSample("t", 1, at, 40, 0, 100)]
        )
    records = {("t", 0): RecordInfo(5.0, 10), ("t", 1): RecordInfo(7.0, 10)}
    report = build_report("g", history, 5, records)
    view = group(*report.rows)
    served = api.group_body(view, now=12.0)["status"]["partitions"]
    shown = report.as_json(now=12.0)["partitions"]
    for mine, theirs in zip(shown, served, strict=True):
        assert (mine["lag"], mine["status"]) == (theirs["current_lag"], theirs["status"])
        assert (mine["lag_seconds"], mine["lag_seconds_method"]) == (
            theirs["lag_seconds"],
            theirs["lag_seconds_method"],
        )
    assert [(p["lag_seconds"], p["lag_seconds_method"]) for p in shown] == [
        (0.0, "exact"),
        (5.0, "exact"),
    ]


def test_a_series_keeps_partition_lags_exact_past_four_bytes() -> None:
    """Partition lags are kept in 4 bytes until one needs 8: then that partition's points are
    widened, every point as it was."""
    series = Series(points=3)
    huge = 2**31 + 5
    for at, lag in enumerate([7, 2**31 - 1, huge, 9]):
        series.append(float(at), lag, None, {("t", 0): lag, ("t", 1): at})
    points = series.points()
    assert [p.total_lag for p in points] == [2**31 - 1, huge, 9]
    assert [p.partition_lags for p in points] == [
        (("t", 0, 2**31 - 1), ("t", 1, 1)),
        (("t", 0, huge), ("t", 1, 2)),
        (("t", 0, 9), ("t", 1, 3)),
    ]
