"""Developer tools, not used by the running service and not in the wheel: the Kafka distribution for tests and the
demo (`kafkadist`), the one Maven resolver (`maven`), the generator of the typed message module (`messages`) and
`tierproxy demo` (`demo`, run from a checkout: `make demo`)."""
