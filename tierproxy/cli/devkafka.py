"""`make kafka` (`python -m tierproxy.cli.devkafka [--port 9092] [--dir DIR]`): one local Kafka broker in the
foreground, from a source checkout (`tierproxy.dev` is not in the wheel). The first SIGINT/SIGTERM stops it,
later ones are ignored while it does (`cli.signals`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make kafka", description=__doc__)
    parser.add_argument("--port", type=int, default=9092, help="the client port on 127.0.0.1 (make: KAFKA_PORT)")
    parser.add_argument("--dir", default="/var/tmp/tierproxy/kafka",
                        help="the broker's data and log, kept between runs (make: KAFKA_DIR)")
    args = parser.parse_args(argv)
    try:
        from tierproxy.dev.localkafka import run_local_kafka
    except ModuleNotFoundError:
        print("tierproxy: `make kafka` runs from a source checkout: an installed tierproxy does not carry the "
              "developer tools it needs", file=sys.stderr)
        return 2
    from tierproxy.cli.signals import ignore_stop_signals, stop_on_sigterm

    stop_on_sigterm()
    try:
        return run_local_kafka(args.port, Path(args.dir))
    finally:
        ignore_stop_signals()


if __name__ == "__main__":
    sys.exit(main())
