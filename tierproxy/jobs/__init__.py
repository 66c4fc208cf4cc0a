"""The jobs: the PySpark pipeline (`tiering`, `tierproxy tier`), the tier as Iceberg tables (`iceberg`), the DataFrame
reader (`spark`) and a tier into a new cluster (`restore`). They install with the extras (`kafka-tierproxy[tier]`,
`kafka-tierproxy[iceberg]`); the proxy's packages never import them."""
