"""The dashboard at / in headless Chromium (Debian's, driven by Playwright), against `lagless
serve` sampling real groups on the embedded broker. Nothing is faked. Screenshots of the first
screen (1400x1000 and a phone's 390x844) and of a group's page are left in the test's tmp
folder for a person to look at."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from playwright.sync_api import Browser, Page, expect

from lagless.broker import EmbeddedBroker
from tests.harness.serve import chromium, lagless_serve

RECORDS = 30
WIDE = {"width": 1400, "height": 1000}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with chromium() as launched:
        yield launched


def bottom_of(page: Page, group: str) -> float:
    """Where a group's row ends on the page, in CSS pixels from the top."""
    return float(
        page.evaluate(
            'g => document.querySelector(`#groups tr[data-group="${g}"]`)'
            ".getBoundingClientRect().bottom",
            group,
        )
    )


def commit(bootstrap: str, group: str, offsets: dict[tuple[str, int], int]) -> Consumer:
    committer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    )
    committer.commit(
        offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()], asynchronous=False
    )
    return committer


def test_the_first_screen_lists_every_group_and_a_group_page_reads_in_two_seconds(
    browser: Browser, tmp_path: Path
) -> None:
    """Three groups: one stopped 1,234 records behind on one of its 4 partitions, one caught
    up, one that never committed. The first screen shows each as a row, worst first, with lag
    in records (thousands separated) and time, a sparkline and its top finding, on a wide
    screen and a phone's; the stopped group's page shows its chart with round ticks, each
    finding once, the lagging partition first and the caught-up ones folded."""
    with EmbeddedBroker(topics={"orders": 4, "audit": 1}) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 20})
        for partition in range(4):
            for _ in range(1_300 if partition == 0 else RECORDS):
                producer.produce("orders", b"x", partition=partition)
        for _ in range(RECORDS):
            producer.produce("audit", b"x", partition=0)
        producer.flush(30)
        ends = {("orders", 0): 1_300, **{("orders", p): RECORDS for p in (1, 2, 3)}}
        web = commit(broker.bootstrap, "web-group", {**ends, ("orders", 0): 66})
        commit(broker.bootstrap, "audit-group", {("audit", 0): RECORDS}).close()
        try:
            with lagless_serve(broker.bootstrap, "--group", "web-group", "--group",
                               "audit-group", "--group", "new-group", "--interval", "0.2",
                               "--window", "1") as url:  # fmt: skip
                page = browser.new_page(viewport=WIDE)
                requested: list[str] = []
                page.on("request", lambda request: requested.append(request.url))
                page.goto(url + "/?refresh=200")

                rows = page.locator("#groups tbody tr")
                web_row = page.locator('#groups tr[data-group="web-group"]')
                # Nothing commits: STALL, then STOP once the window passes; worst first.
                page.locator('#groups tr[data-group="web-group"][data-status="STOP"]').wait_for(
                    timeout=15_000
                )
                expect(rows.first).to_have_attribute("data-group", "web-group")
                expect(web_row.locator("td.lag")).to_have_text("1,234")
                expect(web_row.locator("td.lag-seconds")).to_have_text(re.compile(r"^\d[\d.]* s$"))
                expect(web_row.locator(".status")).to_have_css(
                    "background-color", "rgb(198, 40, 40)"
                )
                expect(web_row.locator("td.finding")).to_contain_text(
                    "orders:0: lag but the committed offset did not move"
                )
                assert int(web_row.locator("svg.spark").get_attribute("data-points") or 0) >= 2
                newcomer = page.locator('#groups tr[data-group="new-group"]')
                expect(newcomer.locator(".status")).to_have_text("NO_COMMITS")
                expect(newcomer.locator("td.finding")).to_have_text("no committed offset yet")
                expect(page.locator('#groups tr[data-group="audit-group"] .status')).to_have_text(
                    "OK"
                )
                expect(page.locator("#counts")).to_contain_text("3 groups")
                assert bottom_of(page, "web-group") < WIDE["height"] / 3
                page.screenshot(path=tmp_path / "first-screen-1400x1000.png")

                phone = browser.new_page(viewport=PHONE)
                phone.goto(url + "/?refresh=200")
                phone_row = phone.locator('#groups tr[data-group="web-group"]')
                expect(phone_row.locator("td.lag")).to_have_text("1,234", timeout=10_000)
                assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], (
                    "a group's row fits a phone's width"
                )
                assert bottom_of(phone, "web-group") < PHONE["height"] / 2
                phone.screenshot(path=tmp_path / "first-screen-phone.png")
                phone.close()

                web_row.locator("td.group a").click()
                section = page.locator('section#group[data-group="web-group"]')
                section.locator('li[data-kind="stop"]').wait_for(timeout=5_000)
                expect(section.locator("h2")).to_contain_text("group web-group")
                expect(section.locator(".summary")).to_contain_text("1,234 records behind")
                kinds = section.locator("ul.findings li").evaluate_all(
                    "items => items.map(i => i.dataset.kind)"
                )
                assert len(kinds) == len(set(kinds)), f"each finding once: {kinds}"
                lagging = section.locator("table.partitions:not(.caught-up) tbody tr")
                expect(lagging).to_have_count(1)
                expect(lagging.first).to_have_attribute("data-partition", "orders:0")
                expect(lagging.first.locator("td.lag")).to_have_text("1,234")
                expect(section.locator("details.caught-up summary")).to_have_text(
                    "3 caught-up partitions"
                )
                expect(section.locator("details.caught-up")).not_to_have_attribute("open", "")
                chart = section.locator("canvas.chart")
                expect(chart).to_have_attribute("data-lines", "total,orders:0 STOP")
                ticks = (chart.get_attribute("data-ticks") or "").split(",")
                assert ticks[0] == "0" and all(re.fullmatch(r"\d+(\.\d)?K?", t) for t in ticks)
                first_points = int(chart.get_attribute("data-points") or 0)
                first_image = chart.evaluate("c => c.toDataURL()")
                page.screenshot(path=tmp_path / "group-page-1400x1000.png")

                # A new commit: the lag drops and the chart draws it.
                web.commit(offsets=[TopicPartition("orders", 0, 1_000)], asynchronous=False)
                expect(section.locator(".summary")).to_contain_text(
                    "300 records behind", timeout=10_000
                )
                time.sleep(0.5)
                assert int(chart.get_attribute("data-points") or 0) > first_points
                assert chart.get_attribute("data-last-lag") == "300"
                assert chart.evaluate("c => c.toDataURL()") != first_image
                assert all(r.startswith(url) for r in requested), "nothing from elsewhere"
                page.close()
        finally:
            web.close()


def test_while_the_broker_is_down_a_group_is_grey_unknown_with_the_error_and_since_when(
    browser: Browser, tmp_path: Path
) -> None:
    """The embedded broker goes down under a sampled group: the page must not keep a green OK
    (or a lag of 0); it shows UNKNOWN in grey, the error, since when, and the last lag greyed."""
    with EmbeddedBroker(topics={"orders": 1}) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for _ in range(RECORDS):
            producer.produce("orders", b"x", partition=0)
        producer.flush(10)
        commit(broker.bootstrap, "down-group", {("orders", 0): RECORDS}).close()
        with lagless_serve(broker.bootstrap, "--group", "down-group", "--interval", "0.2",
                           "--window", "1") as url:  # fmt: skip
            page = browser.new_page(viewport=WIDE)
            page.goto(url + "/?refresh=200")
            row = page.locator('#groups tr[data-group="down-group"]')
            expect(row.locator(".status")).to_have_text("OK", timeout=10_000)

            # New records first make the last lag seen tell from a made-up 0.
            for _ in range(RECORDS - 12):
                producer.produce("orders", b"x", partition=0)
            producer.flush(10)
            expect(row.locator("td.lag")).to_have_text(str(RECORDS - 12), timeout=10_000)
            down_at = time.time()
            broker.set_down()

            expect(row.locator(".status")).to_have_text("UNKNOWN", timeout=15_000)
            expect(row.locator(".status"), "UNKNOWN is grey").to_have_css(
                "background-color", "rgb(189, 189, 189)"
            )
            expect(row).to_have_class("stale")
            expect(row.locator("td.finding")).to_contain_text("cannot sample since ")
            expect(row.locator("td.lag"), "the last lag seen").to_have_text(str(RECORDS - 12))
            since = page.evaluate(
                "fetch('/api/groups/down-group').then(r => r.json()).then(b => b.status)"
            )
            assert since["status"] == "UNKNOWN"
            assert down_at - 1 <= since["error_since"] <= time.time()
            page.screenshot(path=tmp_path / "first-screen-down.png")

            row.locator("td.group a").click()
            section = page.locator('section#group[data-group="down-group"]')
            expect(section.locator("li[data-kind]")).to_have_count(1, timeout=5_000)
            expect(section.locator('li[data-kind="unknown"]')).to_contain_text(
                "could not be sampled"
            )
            expect(section.locator('tr[data-partition="orders:0"] .status')).to_have_css(
                "background-color", "rgb(189, 189, 189)"
            )
            page.screenshot(path=tmp_path / "group-page-down.png")

            broker.set_up()
            expect(section.locator(".status").first).not_to_have_text("UNKNOWN", timeout=30_000)
            page.close()
