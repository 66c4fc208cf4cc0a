"""Sans-IO Kafka wire codec."""
