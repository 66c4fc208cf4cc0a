"""Many real consumers at a bounded rate, in a process of their own (their CPU is not the measuring process's):
librdkafka consumers (confluent-kafka), each assigned partition 0 of a topic at its own start offset, each taking
`rate` records a second. librdkafka fetches ahead only as far as its small queue allows, so the fetches follow the
bounded consumption: each consumer keeps one real fetching connection busy at a modest rate.

    python -m tests.bench.consumers BOOTSTRAP TOPIC COUNT RATE END

prints `ready` once every consumer has its first record, then consumes until its stdin closes and prints the
records it took in all. Used by `test_connections_bench.py`.
"""

from __future__ import annotations

import sys
import threading
import time

from confluent_kafka import Consumer, TopicPartition

TICK_S = 0.05
READY_WAIT_S = 120


def consumer(bootstrap: str, topic: str, start: int, n: int) -> Consumer:
    c = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"bench-conns-{n}", "enable.auto.commit": False,
        "client.id": f"bench-conns-{n}",
        # a small prefetch queue: fetches follow what is consumed, 64 KiB at a time
        "queued.max.messages.kbytes": 256, "queued.min.messages": 64, "max.partition.fetch.bytes": 65536,
        "fetch.max.bytes": 65536, "message.max.bytes": 65536, "fetch.wait.max.ms": 500, "enable.partition.eof": False,
    })
    c.assign([TopicPartition(topic, 0, start)])
    return c


def main(bootstrap: str, topic: str, count: int, rate: float, end: int) -> None:
    consumers = [consumer(bootstrap, topic, (end * i) // (count + 1), i) for i in range(count)]
    started = [False] * count
    stop = threading.Event()
    def until_stdin_closes() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=until_stdin_closes, daemon=True).start()
    taken, owed = 0, 0.0
    deadline = time.monotonic() + READY_WAIT_S
    ready = False
    while not stop.is_set():  # bounded by stdin: the caller closes it
        tick = time.monotonic()
        owed += rate * TICK_S
        want = int(owed)
        owed -= want
        for i, c in enumerate(consumers):
            got = c.consume(max(1, want) if not started[i] else want, timeout=0) if want or not started[i] else []
            for msg in got:
                if msg.error() is None:
                    taken += 1
                    started[i] = True
        if not ready and all(started):
            ready = True
            print("ready", flush=True)
        if not ready and time.monotonic() > deadline:
            print(f"not ready: {started.count(False)} consumers without a record", flush=True)
            break
        time.sleep(max(0.0, TICK_S - (time.monotonic() - tick)))  # the rate's tick: pacing, not a wait
    for c in consumers:
        c.close()
    print(f"taken {taken}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
