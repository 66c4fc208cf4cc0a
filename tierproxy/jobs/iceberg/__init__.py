"""The tier as an Apache Iceberg table: Kafka history for every query engine, written from the tier's own bytes.

`schema` declares the table (Spark's Kafka source columns plus leaderEpoch and producerId), `catalog` opens the
catalog and the table, `files` is the executors' half (one Parquet file per tiered segment or byte range of one),
`ledger` reads and writes what each commit records (segments added, the end offset per partition) and answers
`snapshot-at`, `sync` is one pass: plan, write, commit exactly once, then make the table follow the tier.
"""
