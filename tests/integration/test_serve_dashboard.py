"""The dashboard at / in headless Chromium (Debian's, driven by Playwright), against `lagless
serve` sampling a real group on the embedded broker. Nothing is faked."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from playwright.sync_api import Browser, expect, sync_playwright

from lagless.broker import EmbeddedBroker
from tests.harness.serve import lagless_serve

CHROMIUM = "/usr/bin/chromium"
RECORDS = 30


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert shutil.which(CHROMIUM), "chromium is not installed: run scripts/install-serve-test-tools"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield launched
        launched.close()


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
