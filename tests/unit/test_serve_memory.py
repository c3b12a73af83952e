"""serve's allocator settings (service.fleet_malloc): a large answer built and freed, again
and again in threads of their own as the HTTP server's are, leaves no resident memory behind.
At glibc's defaults the second such block comes from the heap and stays resident (the mmap
threshold rises to the largest block freed). Real glibc, this process's own resident size."""

from __future__ import annotations

import threading

from lagless.serve.service import fleet_malloc

BODY_BYTES = 24 * 1024 * 1024


def resident_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS in /proc/self/status")


def build_and_free_bodies() -> None:
    for n in range(4):
        body = b"".join([bytes([65 + n]) * 1024] * (BODY_BYTES // 1024))  # touched, resident
        assert len(body) == BODY_BYTES
        del body


def test_large_answers_built_in_threads_leave_no_resident_memory_behind() -> None:
    assert fleet_malloc(), "this machine's C library is glibc"
    before = resident_kib()
    for _ in range(3):
        thread = threading.Thread(target=build_and_free_bodies)
        thread.start()
        thread.join()
    grown_mib = (resident_kib() - before) / 1024
    assert grown_mib < BODY_BYTES / 1024 / 1024 / 2, f"{grown_mib:.1f} MiB stayed resident"
