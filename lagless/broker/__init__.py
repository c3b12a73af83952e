"""The embedded dev broker (librdkafka's mock cluster)."""

from lagless.broker.cluster import EmbeddedBroker, parse_topic_spec

__all__ = ["EmbeddedBroker", "parse_topic_spec"]
