"""What the tests share, one module per kind of part (no test module imports another):

- `parts`: starting real parts (S3 servers, proxies as processes, ports), failing when one cannot start
- `kafka`: topics, watermarks, retention, DeleteRecords on a real cluster; `fetchraw`: raw batches from a broker
- `tiering`: a tier pass and its settings; `segments`: segment metadata for the RLMM tests
- `spark`, `iceberg`, `helm`: Spark sessions and clusters, Iceberg catalogs and readers, the chart's tools
- `relay`: recording and delaying TCP relays; `balancer`: HAProxy; `s3_faults`: an S3 that fails on cue
- `inprocess`, `memory_tier`: the in-process proxy core and an in-memory remote tier (`tests/core`)
- `remote`: remote-tier scenarios; `samples`, `crosscheck`: codec samples and checks against the Java client
- `certs`, `oauth`, `acls`: TLS material, an OAuth server, ACL set-up; `waiting`: bounded waits
"""
