"""ctypes bindings to the mock-cluster API of the librdkafka inside the confluent-kafka wheel.

Loading the very library confluent-kafka itself uses keeps one copy of librdkafka per process.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os

import confluent_kafka

from lagless.exceptions import TerminalError

_p = ctypes.c_void_p
_int = ctypes.c_int


def _library_path() -> str:
    package_dir = os.path.dirname(confluent_kafka.__file__)
    for folder in (os.path.join(package_dir, os.pardir, "confluent_kafka.libs"), package_dir):
        found = sorted(glob.glob(os.path.join(folder, "librdkafka*.so*")))
        if found:
            return os.path.abspath(found[0])
    raise TerminalError(
        "librdkafka with the mock cluster was not found inside confluent-kafka; "
        "reinstall it from a binary wheel: pip install --force-reinstall confluent-kafka"
    )


@functools.cache
def library() -> ctypes.CDLL:
    lib = ctypes.CDLL(_library_path())
    signatures: dict[str, tuple[list[type], type | None]] = {
        "rd_kafka_conf_new": ([], _p),
        "rd_kafka_conf_set": (
            [_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t],
            _int,
        ),
        "rd_kafka_new": ([_int, _p, ctypes.c_char_p, ctypes.c_size_t], _p),
        "rd_kafka_destroy": ([_p], None),
        "rd_kafka_mock_cluster_new": ([_p, _int], _p),
        "rd_kafka_mock_cluster_destroy": ([_p], None),
        "rd_kafka_mock_cluster_bootstraps": ([_p], ctypes.c_char_p),
        "rd_kafka_mock_topic_create": ([_p, ctypes.c_char_p, _int, _int], _int),
        "rd_kafka_mock_broker_set_down": ([_p, _int], _int),
        "rd_kafka_mock_broker_set_up": ([_p, _int], _int),
        "rd_kafka_mock_broker_set_rtt": ([_p, _int, _int], _int),
        "rd_kafka_mock_push_request_errors_array": (
            [_p, ctypes.c_int16, ctypes.c_size_t, ctypes.POINTER(_int)],
            None,
        ),
        "rd_kafka_mock_clear_request_errors": ([_p, ctypes.c_int16], None),
        "rd_kafka_mock_partition_delete_records": (
            [_p, ctypes.c_char_p, ctypes.c_int32, ctypes.c_int64],
            _int,
        ),
        "rd_kafka_err2str": ([_int], ctypes.c_char_p),
    }
    for name, (argtypes, restype) in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = restype
    return lib


def err2str(code: int) -> str:
    text = library().rd_kafka_err2str(code)
    return text.decode() if text else f"error {code}"
