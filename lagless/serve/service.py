"""The sampler thread and the HTTP server, started and stopped together."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import threading
from collections.abc import Iterator

from lagless.exceptions import BadInput
from lagless.serve.sampler import Sampler
from lagless.serve.server import Content, LagHTTPServer

# The collector's thresholds while serving: a fleet's round makes and keeps ~25,000 samples
# (history of every partition of every group), and at Python's defaults (700, 10, 10) the
# collections they set off took a third of a round's CPU (2,000 groups x 12 partitions:
# 0.3 of 1.0 s), a full one most rounds. Here a young collection every 50,000 allocations
# and a full one about a minute apart: 0.1 s a round. The sampler's data holds no cycles; the
# rare ones elsewhere (a caught exception's frames) wait for the full collection.
FLEET_GC_THRESHOLDS = (50_000, 20, 10)


@contextlib.contextmanager
def fleet_gc() -> Iterator[None]:
    """FLEET_GC_THRESHOLDS within, what was built before (modules, the parser) out of the
    collector's sight; restored after."""
    before = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(*FLEET_GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


# glibc's mallopt parameters (malloc.h).
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
# Allocations above this size are mapped on their own and given back to the kernel when freed.
MMAP_THRESHOLD_BYTES = 128 * 1024


def fleet_malloc() -> bool:
    """The C allocator set so that serve's resident memory follows what it holds: a fleet's
    /metrics answer is ~20 MB (2,000 groups x 12 partitions), and at glibc's defaults, once one
    such block is freed, the next ones come from the heap and stay resident (the mmap threshold
    rises to the largest block freed), in an arena per HTTP thread: 382 MiB resident where 225
    do with this (bench/fleet.py). Before any thread starts. Whether it applied (glibc only;
    elsewhere the defaults stay)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(_M_ARENA_MAX, 2))


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
