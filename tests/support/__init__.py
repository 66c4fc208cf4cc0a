"""What the tests share, one module per kind of part (no test module imports another):

- `parts`: what starting any real part needs (failing when one cannot start, kcat, ports, stopping processes)
- `s3`: SeaweedFS and moto S3 servers; `proxy`: `tierproxy serve` as a process
- `kafka`: topics, watermarks, retention, DeleteRecords on a real cluster; `fetchraw`: raw batches from a broker
- `tiering`: a tier pass and its settings; `segments`: segment metadata for the RLMM tests
- `spark`, `iceberg`, `helm`: Spark sessions and clusters, Iceberg catalogs and readers, the chart's tools
- `relay`: recording and delaying TCP relays; `balancer`: HAProxy; `s3_faults`: an S3 that fails on cue
- `inprocess`, `memory_tier`: the in-process proxy core and an in-memory remote tier (`tests/core`)
- `remote`: remote-tier scenarios; `samples`, `crosscheck`: codec samples and checks against the Java client
- `certs`, `oauth`, `acls`: TLS material, an OAuth server, ACL set-up; `waiting`: bounded waits
"""
