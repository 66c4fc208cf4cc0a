"""`spark-submit` entry point for the tiering job on a real Spark cluster.

    spark-submit --master spark://host:7077 --conf spark.pyspark.python=/opt/tierproxy/bin/python \\
        $(python -c 'import tierproxy.jobs.tiering.spark_entry as m; print(m.__file__)') \\
        --bootstrap-server broker:9092 --storage s3://bucket/tier --interval 30s

The executors run `tierproxy.jobs.tiering.copy.copy_task`, so their Python needs the tierproxy distribution (install
the wheel there, or ship a packed virtualenv with `--archives`). The master comes from spark-submit; everything
after the script path is `tierproxy tier`'s own arguments.
"""

from __future__ import annotations

import os
import sys

from tierproxy.cli import main


def run() -> int:
    os.environ["SPARK_SUBMIT_MASTER_SET"] = "1"  # keep spark-submit's --master
    return main(["tier", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(run())
