"""The proxy core: one session per client connection (`session`), the tables of what each API does (`handlers`),
pure address rewrites (`rewrite`), flow control and memory bounds (`flow`), node ids ↔ advertised ports
(`brokers`), the listeners (`server`) and what changes in Kafka's answers over the tier (`intercept`)."""
