"""tierproxy: a Kafka proxy with a remote tier."""
