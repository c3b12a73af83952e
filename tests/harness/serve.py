"""`lagless serve` and Prometheus as real processes for tests, each on a kernel-chosen port."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from playwright.sync_api import Browser

START_TIMEOUT_S = 30.0
CHROMIUM = "/usr/bin/chromium"


def descriptors(pid: int) -> int:
    """File descriptors the process holds."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def children(pid: int) -> list[int]:
    """The process's direct children."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def get_json(url: str) -> dict:
    status, body = get(url)
    assert status == 200, f"{url}: HTTP {status}: {body}"
    return json.loads(body)


def wait_for(what: str, check, timeout_s: float = 15.0, every_s: float = 0.1):  # type: ignore[no-untyped-def]
    """check() until it returns something truthy; fail naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {last!r})")


def _read_first_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    """The process's first stdout line, without blocking past timeout_s."""
    import selectors

    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            raise AssertionError(f"no line on stdout within {timeout_s} s")
    return process.stdout.readline().strip()


@contextmanager
def lagless_serve(bootstrap: str, *args: str) -> Iterator[str]:
    """`lagless serve --port 0` in its own process; yields its URL, read from its first line."""
    with lagless_serve_process(bootstrap, *args) as (url, _process):
        yield url


@contextmanager
def lagless_serve_process(
    bootstrap: str, *args: str
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """As lagless_serve, yielding the process too (to read its /proc)."""
    with tempfile.TemporaryFile("w+") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "lagless", "serve", "--bootstrap", bootstrap, "--port", "0",
             *args],
            stdout=subprocess.PIPE,
            stderr=stderr,  # a file: librdkafka's logs while a broker is down must not block it
            text=True,
        )  # fmt: skip
        try:
            url = _read_first_line(process, START_TIMEOUT_S)
            if not url.startswith("http://127.0.0.1:"):
                stderr.seek(0)
                raise AssertionError(f"lagless serve did not start: {url!r} {stderr.read()}")
            try:
                yield url, process
                stderr.seek(0)
                process.stderr_text = stderr.read()  # type: ignore[attr-defined]
            except BaseException as failure:
                # The test failed: say whether the server was still there, with its last words.
                stderr.seek(0)
                tail = "".join(stderr.readlines()[-40:])
                code = process.poll()
                failure.add_note(f"lagless serve: exit code {code}; stderr's end:\n{tail}")
                raise
        finally:
            process.terminate()
            code = process.wait(timeout=15)
            assert code == 0, f"lagless serve exited with {code} on SIGTERM"


@contextmanager
def prometheus(target: str, scrape_interval_s: float = 0.5) -> Iterator[str]:
    """Debian's prometheus scraping `target` (host:port); yields its URL. Port 0: Prometheus
    logs the port it got, which is read back."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus is not installed: run scripts/install-serve-test-tools"
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder, "prometheus.yml")
        interval = f"{int(scrape_interval_s * 1000)}ms"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {interval}\n"
            f"  scrape_timeout: {interval}\n"
            "scrape_configs:\n"
            "  - job_name: lagless\n"
            "    static_configs:\n"
            f'      - targets: ["{target}"]\n'
        )
        log = Path(folder, "prometheus.log")
        with log.open("w") as log_file:
            process = subprocess.Popen(
                [binary, f"--config.file={config}", f"--storage.tsdb.path={folder}/data",
                 "--web.listen-address=127.0.0.1:0", "--log.level=info"],
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
            try:
                found = wait_for(
                    "Prometheus to listen",
                    lambda: re.search(r'msg="Listening on" address=([\d.]+:\d+)', log.read_text()),
                    timeout_s=START_TIMEOUT_S,
                )
                url = f"http://{found.group(1)}"
                wait_for("Prometheus to be ready", lambda: get(url + "/-/ready")[0] == 200)
                yield url
            finally:
                process.terminate()
                process.wait(timeout=15)


def promql(prometheus_url: str, query: str) -> list[dict]:
    """The result vector of an instant query through Prometheus's HTTP API."""
    body = get_json(f"{prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": query}))
    assert body["status"] == "success", body
    return body["data"]["result"]


def parse_metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text format -> {(name, labels): value}; fails on a line it cannot read."""
    found = {}
    pattern = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+)$")
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = pattern.match(line)
        assert match, f"not a sample line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2)))
        found[(match.group(1), labels)] = float(match.group(3))
    return found


def metric(samples: dict, name: str, **labels: object) -> float | None:
    """The one sample of `name` whose labels include `labels`."""
    wanted = {(k, str(v)) for k, v in labels.items()}
    matches = [v for (n, have), v in samples.items() if n == name and wanted <= have]
    assert len(matches) <= 1, f"{name} {labels}: {len(matches)} samples"
    return matches[0] if matches else None


@contextmanager
def chromium() -> Iterator[Browser]:
    """Debian's headless Chromium driven by Playwright (never `playwright install`)."""
    from playwright.sync_api import sync_playwright

    assert shutil.which(CHROMIUM), "chromium is not installed: run scripts/install-serve-test-tools"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            launched.close()
