"""The driver collects from Spark's JVM over a Unix socket (importer/spark.py).

Over local TCP, Spark's thread serving a toArrow() took the first connection to its port; one
that failed its secret check (a client reconnecting to a port Spark had reused: librdkafka's,
to a broker gone) killed that thread without completing the call's result, and toArrow waited
forever: an import hung that way in CI ("serve-Arrow ... Authentication failed" on the JVM's
stderr). A socket file is reached by this machine's processes that look for it only.
"""

from __future__ import annotations

import os
import stat

import pyarrow as pa
from pyspark.sql.pandas.serializers import ArrowCollectSerializer
from pyspark.util import _load_from_socket


def test_to_arrow_is_served_on_a_socket_file_not_a_tcp_port(spark):
    frame = spark.range(25)
    where, secret, server = frame._jdf.collectAsArrowToPython()
    is_file = isinstance(where, str) and stat.S_ISSOCK(os.stat(where).st_mode)
    try:  # read whichever it is: a call left unread would wait forever
        with _load_from_socket((where, secret), ArrowCollectSerializer()) as stream:
            batches = [b for b in stream if isinstance(b, pa.RecordBatch)]
    finally:
        server.getResult()
    assert is_file and secret is None, (where, secret)
    assert sum(b.num_rows for b in batches) == 25
