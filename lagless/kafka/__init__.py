"""Everything lagless says to a Kafka broker outside the executors' range reading: client
settings (`config.py`); the driver's questions, asked through one OffsetReader
(`offset_reader.py`, the only way there) and answered by what they are about: the logs'
offsets (`log_offsets.py`), groups' offsets (`group_offsets.py`), records (`records.py`), the
cluster's topics, configs and groups (`cluster_info.py`), over one connection
(`connection.py`); and producing (`produce.py`)."""

from lagless.partitions import TP

# Offsets of several partitions.
Offsets = dict[TP, int]

__all__ = ["TP", "Offsets"]
