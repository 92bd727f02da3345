"""The stream front-end (docs/stream.md): Kafka-style clients over the node's durable log."""
