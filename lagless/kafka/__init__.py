"""Everything lagless says to a Kafka broker outside the executors' range reading:
client settings (`config.py`), the driver's questions about offsets, groups and records
(`offset_reader.py`, the only way there), and producing (`produce.py`)."""
