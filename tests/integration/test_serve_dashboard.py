"""The dashboard at / in headless Chromium (Debian's, driven by Playwright), against `lagless
serve` sampling a real group on the embedded broker. Nothing is faked."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from playwright.sync_api import Browser, expect

from lagless.broker import EmbeddedBroker
from tests.harness.serve import chromium, lagless_serve

RECORDS = 30


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


def test_a_lagging_group_shows_its_lag_and_status_and_the_chart_moves(
    browser: Browser, tmp_path: Path
) -> None:
    with EmbeddedBroker(topics={"orders": 2}) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for number in range(RECORDS):
            producer.produce("orders", b"x", partition=number % 2)
        producer.flush(10)
        committer = Consumer(
            {"bootstrap.servers": broker.bootstrap, "group.id": "web-group",
             "enable.auto.commit": False}
        )  # fmt: skip
        committer.commit(
            offsets=[TopicPartition("orders", 0, 3), TopicPartition("orders", 1, 15)],
            asynchronous=False,
        )
        try:
            with lagless_serve(broker.bootstrap, "--group", "web-group", "--interval", "0.2",
                               "--window", "1") as url:  # fmt: skip
                page = browser.new_page()
                requested: list[str] = []
                page.on("request", lambda request: requested.append(request.url))
                page.goto(url + "/?refresh=200")

                row = page.locator('#groups tr[data-group="web-group"]')
                row.locator("td.lag", has_text="12").wait_for(timeout=10_000)
                # Nothing commits, so the group turns STALL, then STOP once the window passes.
                page.locator('#groups tr[data-group="web-group"][data-status="STOP"]').wait_for(
                    timeout=10_000
                )
                # The page rebuilds its rows on every refresh: a check on an element once found
                # could read one already replaced, so these retry on the current row.
                badge = row.locator(".status")
                expect(badge).to_have_text("STOP")
                expect(badge, "STOP is red").to_have_css("background-color", "rgb(198, 40, 40)")
                section = page.locator('section[data-group="web-group"]')
                partition_row = section.locator('tr[data-partition="orders:0"]')
                # The details of a group arrive a moment after the list of groups.
                section.locator('li[data-kind="stop"]').wait_for(timeout=5_000)
                expect(partition_row.locator("td.lag")).to_have_text("12")
                expect(partition_row).to_contain_text("STOP")

                chart = section.locator("canvas.chart")
                # A line per partition, most lagging first, named with its status in the legend.
                expect(chart).to_have_attribute("data-lines", "total,orders:0 STOP,orders:1 OK")
                first_points = int(chart.get_attribute("data-points") or 0)
                first_image = chart.evaluate("c => c.toDataURL()")
                # A new commit: the lag drops and the chart must draw it.
                committer.commit(offsets=[TopicPartition("orders", 0, 10)], asynchronous=False)
                page.locator('#groups tr[data-group="web-group"] td.lag', has_text="5").wait_for(
                    timeout=10_000
                )
                time.sleep(0.5)
                assert int(chart.get_attribute("data-points") or 0) > first_points
                assert chart.get_attribute("data-last-lag") == "5"
                assert chart.evaluate("c => c.toDataURL()") != first_image
                assert all(r.startswith(url) for r in requested), "nothing from elsewhere"
                # Kept for a person to look at when the test fails.
                page.screenshot(path=tmp_path / "dashboard.png", full_page=True)
                page.close()
        finally:
            committer.close()


def test_while_the_broker_is_down_a_group_is_grey_unknown_with_the_error_and_since_when(
    browser: Browser, tmp_path: Path
) -> None:
    """The embedded broker goes down under a sampled group: the page must not keep a green OK
    (or a lag of 0); it shows UNKNOWN in grey, the error, since when, and the last lag greyed.
    A second named group that never committed is shown as such from the start."""
    with EmbeddedBroker(topics={"orders": 1}) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for _ in range(RECORDS):
            producer.produce("orders", b"x", partition=0)
        producer.flush(10)
        committer = Consumer(
            {"bootstrap.servers": broker.bootstrap, "group.id": "down-group",
             "enable.auto.commit": False}
        )  # fmt: skip
        committer.commit(offsets=[TopicPartition("orders", 0, RECORDS)], asynchronous=False)
        committer.close()
        with lagless_serve(broker.bootstrap, "--group", "down-group", "--group", "new-group",
                           "--interval", "0.2", "--window", "1") as url:  # fmt: skip
            page = browser.new_page()
            page.goto(url + "/?refresh=200")
            row = page.locator('#groups tr[data-group="down-group"]')
            expect(row.locator(".status")).to_have_text("OK", timeout=10_000)
            newcomer = page.locator('#groups tr[data-group="new-group"]')
            expect(newcomer.locator(".status")).to_have_text("NO_COMMITS")
            expect(newcomer.locator("td.problem")).to_have_text("no committed offset yet")

            # The lag is 0 and OK: exactly what must not stay on the page once the broker is
            # away. New records first make the last lag seen tell from a made-up 0.
            for _ in range(RECORDS - 12):
                producer.produce("orders", b"x", partition=0)
            producer.flush(10)
            expect(row.locator("td.lag")).to_have_text(str(RECORDS - 12), timeout=10_000)
            section = page.locator('section[data-group="down-group"]')
            stale_badge = section.locator('tr[data-partition="orders:0"] .status')
            down_at = time.time()
            broker.set_down()

            expect(row.locator(".status")).to_have_text("UNKNOWN", timeout=15_000)
            badge = row.locator(".status")
            expect(badge, "UNKNOWN is grey").to_have_css("background-color", "rgb(158, 158, 158)")
            expect(row.locator("td.problem")).to_contain_text("cannot sample since ")
            expect(row.locator("td.problem")).to_have_class("text problem error")
            expect(row.locator("td.lag"), "the last lag seen, greyed").to_have_text(
                str(RECORDS - 12)
            )
            expect(row.locator("td.lag")).to_have_class("lag stale")
            expect(stale_badge, "a partition's last status is greyed").to_have_css(
                "background-color", "rgb(189, 189, 189)"
            )
            expect(section.locator("li[data-kind]")).to_have_count(1)
            expect(section.locator('li[data-kind="unknown"]')).to_contain_text(
                "could not be sampled"
            )
            since = page.evaluate(
                "fetch('/api/groups/down-group').then(r => r.json()).then(b => b.status)"
            )
            assert since["status"] == "UNKNOWN"
            assert down_at - 1 <= since["error_since"] <= time.time()
            page.screenshot(path=tmp_path / "dashboard-down.png", full_page=True)

            broker.set_up()
            expect(row.locator(".status")).not_to_have_text("UNKNOWN", timeout=30_000)
            expect(row.locator("td.problem")).to_have_text("")
            page.close()
