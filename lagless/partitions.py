"""A topic's partition, the unit every part of lagless plans, reads, commits and reports by:
(topic, partition). One definition for the driver, the tasks, the stores and the broker."""

TP = tuple[str, int]
