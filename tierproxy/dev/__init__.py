"""Developer tools, not used by the running service: the Kafka distribution for tests and demos
(`kafkadist`), the one Maven resolver (`maven`), and the generator of the typed message module (`messages`)."""
