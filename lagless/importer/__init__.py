"""The import job: a Structured Streaming query from Kafka into a sink."""
