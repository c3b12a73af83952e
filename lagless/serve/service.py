"""The sampler thread and the HTTP server, started and stopped together."""

from __future__ import annotations

import errno
import threading

from lagless.exceptions import BadInput
from lagless.serve.sampler import Sampler
from lagless.serve.server import Content, LagHTTPServer


def bind(host: str, port: int, content: Content) -> LagHTTPServer:
    """The server bound to host:port (0: a port the kernel picks); a port in use is bad input."""
    try:
        return LagHTTPServer((host, port), content)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise BadInput(f"port {port} on {host} is in use") from None
        if exc.errno == errno.EACCES:
            raise BadInput(f"not allowed to listen on port {port} of {host}") from None
        raise BadInput(f"cannot listen on {host}:{port}: {exc.strerror}") from None


class LagService:
    """Samples in one thread, serves HTTP in another, until stop()."""

    def __init__(self, sampler: Sampler, server: LagHTTPServer) -> None:
        self.sampler = sampler
        self.server = server
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=sampler.run, args=(self._stop,), name="lag-sampler"),
            threading.Thread(target=server.serve_forever, args=(0.2,), name="lag-http"),
        ]

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> LagService:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.server.shutdown()
        for thread in self._threads:
            thread.join()
        self.server.server_close()
        self.sampler.close()
