"""Reading the timelines of `test_fetch_timeline_bench`: the proxy's own (`timeline/sitecustomize.py`) and kcat's
(librdkafka's `-d protocol` lines: each FetchResponse with its round trip as the client saw it)."""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from pathlib import Path

_RTT = re.compile(r"Received FetchResponse \(v\d+, (\d+) bytes, CorrId \d+, rtt ([0-9.]+)ms\)")


def kcat_rtts(stderr: str, least_bytes: int = 1 << 20) -> list[float]:
    """The round trips (ms) kcat saw for its Fetch answers of at least `least_bytes`."""
    return [float(m[2]) for m in _RTT.finditer(stderr) if int(m[1]) >= least_bytes]


STEPS = {  # a remote fetch's steps in the proxy: (from, to) events of one fetch
    "request in -> handler": ("in", "req"),
    "plan + forward (handler)": ("req", "fwd"),
    "broker's authorizing round trip": ("fwd", "brk"),
    "answer made (response handler)": ("brk", "ans"),
    "-> first file byte out": ("ans", "s0"),
    "file regions sent": ("s0", "s1"),
    "last byte out -> next request in": ("s1", "in"),
}


def proxy_steps(path: Path) -> dict[str, float]:
    """Medians (ms) of each step over the remote fetches of the connection that served the most of them, the
    waits for the socket to drain summed per fetch ("drain waits"), and the whole fetch ("request in -> last byte
    out")."""
    by_session: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        t, event, who = line.split()
        by_session[who].append((int(t), event))
    events = max(by_session.values(), key=lambda ev: sum(1 for _, e in ev if e == "s0"))
    fetches: list[dict[str, int]] = []
    cur: dict[str, int] = {}
    for t, e in events:
        if e == "in":
            if "s1" in cur:  # the next request: the last one is complete
                cur["next"] = t
                fetches.append(cur)
                cur = {}
            if "in" not in cur:
                cur["in"] = t
        elif e == "w0":
            cur["w0"] = t
        elif e == "w1" and "w0" in cur:
            cur["wait"] = cur.get("wait", 0) + t - cur.pop("w0")
        elif e not in cur and e != "in1":
            cur[e] = t
    out: dict[str, list[float]] = defaultdict(list)
    for f in fetches:
        if not all(k in f for k in ("in", "req", "fwd", "brk", "ans", "s0", "s1")):
            continue
        for name, (a, b) in STEPS.items():
            out[name].append((f["next" if b == "in" else b] - f[a]) / 1e6)
        out["drain waits (inside sending)"].append(f.get("wait", 0) / 1e6)
        out["request in -> last byte out"].append((f["s1"] - f["in"]) / 1e6)
    fetched = float(len(out["request in -> last byte out"]))
    return {k: statistics.median(v) for k, v in out.items()} | {"fetches": fetched}


def inclusive(raw: Path, names: list[str]) -> dict[str, float]:
    """The share (%) of py-spy's samples (`--format raw`) whose stack holds each named function."""
    counts = dict.fromkeys(names, 0)
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        total += int(count)
        frames = {f.split(" (", 1)[0] for f in stack.split(";")}
        for name in names:
            if name in frames:
                counts[name] += int(count)
    return {n: c * 100 / max(1, total) for n, c in counts.items()}
