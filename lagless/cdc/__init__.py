"""Change data capture: Debezium's change events, and the rules that make a table of them.

One place for the envelope's rules (as Debezium's own JDBC sink keeps them in one place):
`connect_types.py` turns Kafka Connect's schemas into columns and each value into what its
column takes; `envelope.py` turns one change event (a Kafka key and value) into the row the
importer's upsert path stores or the key it deletes. Pure: no I/O, nothing of lagless but its
errors; run in the executors' Python workers (importer/debezium.py's decoding) and tested
without Spark.
"""
