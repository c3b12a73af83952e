"""The HTTP server: /metrics, the JSON API under /api, and the dashboard at /.

Standard library only (ThreadingHTTPServer): handlers read the sampler's latest views and
metrics, which are swapped in whole after each round, so a scrape never waits on the broker
nor on judging.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from urllib.parse import unquote, urlsplit

from lagless.serve import api, metrics
from lagless.serve.view import GroupView

DASHBOARD = "dashboard.html"
API_GROUPS = "/api/groups"


@dataclass(frozen=True)
class Content:
    """What the handlers serve from: the latest views and how to label them."""

    views: Callable[[], Sequence[GroupView]]
    cluster: str
    poll_time_ms: Callable[[], float | None] = lambda: None
    now: Callable[[], float] = time.time
    exposition: Callable[[], metrics.Exposition | None] = lambda: None
    """The latest round's metrics, built after the round (None before the first: then from
    the views)."""

    def metrics_body(self) -> bytes:
        exposition = self.exposition() or metrics.Exposition(self.views(), self.cluster)
        return exposition.body(self.now(), self.poll_time_ms())


@cache
def dashboard_html() -> bytes:
    return files("lagless.serve").joinpath(DASHBOARD).read_bytes()


class LagHTTPServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], content: Content) -> None:
        self.content = content
        super().__init__(address, LagRequestHandler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


class LagRequestHandler(BaseHTTPRequestHandler):
    server: LagHTTPServer
    server_version = "lagless"

    def do_GET(self) -> None:
        content = self.server.content
        path = urlsplit(self.path).path
        if path == "/":
            self._send(HTTPStatus.OK, "text/html; charset=utf-8", dashboard_html())
        elif path == "/metrics":
            self._send(HTTPStatus.OK, metrics.CONTENT_TYPE, content.metrics_body())
        elif path in (API_GROUPS, API_GROUPS + "/"):
            self._json(HTTPStatus.OK, api.groups_body(content.views(), content.now()))
        elif path.startswith(API_GROUPS + "/"):
            name = unquote(path[len(API_GROUPS) + 1 :])
            found = [view for view in content.views() if view.group == name]
            if found:
                self._json(HTTPStatus.OK, api.group_body(found[0], content.now()))
            else:
                self._json(HTTPStatus.NOT_FOUND, api.not_found_body(f"group {name!r} not found"))
        else:
            self._json(HTTPStatus.NOT_FOUND, api.not_found_body(f"no such path: {path}"))

    def _json(self, status: HTTPStatus, body: object) -> None:
        self._send(status, "application/json", json.dumps(body).encode())

    def _send(self, status: HTTPStatus, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: Prometheus scrapes every few seconds; a line per request would bury errors."""
