"""S3 API servers on loopback for the tests: SeaweedFS (`weed server -s3`, with one identity, so unsigned or
wrongly signed requests are refused as on AWS) and moto where a test needs what SeaweedFS cannot do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.parts import unavailable
from tierproxy.dev import ports
from tierproxy.dev.ports import free_port


@dataclass
class S3Server:
    endpoint: str
    proc: subprocess.Popen[bytes]
    log: Path
    metrics: str | None = None  # SeaweedFS's Prometheus endpoint (its own count of the requests it served)

    region = "us-east-1"
    access_key = "testing"
    secret_key = "testing"

    def create_bucket(self, name: str) -> None:
        """Create a bucket, and put this server's credentials in the environment (the usual chain)."""
        import asyncio

        from tierproxy.tier.storage import S3Store

        async def run() -> None:
            store = S3Store(name, endpoint=self.endpoint, region=self.region, access_key=self.access_key,
                            secret_key=self.secret_key)
            try:
                await (await store._c()).create_bucket(Bucket=name)
            finally:
                await store.close()

        asyncio.run(run())
        os.environ.update({"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key})

    def counted(self, bucket: str) -> ServerCounts:
        """What SeaweedFS itself counted for `bucket` so far (its Prometheus metrics): requests by its type (an
        HTTP method, or LIST for object listings; HEADs and ListMultipartUploads are GETs, CreateMultipartUpload
        and CompleteMultipartUpload POSTs, an abort and DeleteObjects DELETEs) and body bytes each way."""
        from prometheus_client.parser import text_string_to_metric_families

        assert self.metrics is not None, "moto has no metrics endpoint"
        with urllib.request.urlopen(self.metrics, timeout=10) as answer:
            text = answer.read().decode()
        out = ServerCounts(Counter(), 0, 0)
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.labels.get("bucket") != bucket:
                    continue
                if sample.name == "SeaweedFS_s3_request_total":
                    out.requests[sample.labels["type"]] += int(sample.value)
                elif sample.name == "SeaweedFS_s3_bucket_traffic_sent_bytes_total":
                    out.sent += int(sample.value)
                elif sample.name == "SeaweedFS_s3_bucket_traffic_received_bytes_total":
                    out.received += int(sample.value)
        return out


@dataclass
class ServerCounts:
    """An S3 server's own count: requests by type, body bytes it sent (GETs) and received (uploads)."""

    requests: Counter[str]
    sent: int
    received: int

    def __sub__(self, before: ServerCounts) -> ServerCounts:
        return ServerCounts(+(self.requests - before.requests), self.sent - before.sent,
                            self.received - before.received)


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, part: str, timeout: float) -> None:
    """Until `url` answers HTTP (any status: an error status is an answer); the part fails with the tail of its log
    if its process ends or `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                unavailable(part, log.read_text(errors="replace")[-3000:])
            time.sleep(0.1)


@contextmanager
def moto_server(workdir: Path) -> Iterator[S3Server]:
    """A moto S3 server in a subprocess on a free loopback port (a subprocess so tests can stop it)."""
    port = free_port()
    log = workdir / "moto.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_http(endpoint + "/moto-api/", proc, log, "moto S3 server", 30)
        yield S3Server(endpoint, proc, log)
    finally:
        proc.terminate()
        proc.wait(10)


S3_IDENTITIES = {"identities": [{"name": "tierproxy", "credentials": [
    {"accessKey": S3Server.access_key, "secretKey": S3Server.secret_key}],
    "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}


def weed_path() -> Path:
    """SeaweedFS's `weed`, built from the Go module proxy by .ci/install-tools.sh (make install)."""
    from tierproxy.dev.maven import cache_dir

    path = cache_dir() / "bin" / "weed"
    if not path.exists():
        unavailable("SeaweedFS", f"{path} missing (make install builds it: .ci/install-tools.sh)")
    return path


@dataclass
class _Launched:
    """A `weed server` started, not yet known to serve."""

    proc: subprocess.Popen[bytes]
    endpoint: str
    log: Path
    metrics: str

    def stop(self) -> None:
        self.proc.kill()  # a test server's data is thrown away: SIGTERM would wait ~30 s for its volumes to settle
        self.proc.wait(10)


def _launch(workdir: Path) -> _Launched:
    weed = weed_path()
    data = workdir / "seaweedfs"
    data.mkdir(parents=True, exist_ok=True)
    config = workdir / "s3-identities.json"
    config.write_text(json.dumps(S3_IDENTITIES))
    # each server's HTTP and gRPC ports, all from this worker's share: left to itself SeaweedFS puts a gRPC port at
    # its HTTP port + 10000, which may lie in the kernel's ephemeral range or in another worker's share, where a
    # client socket or another server can take it before SeaweedFS binds it ("address already in use")
    base = ports.free_port_block(9, reuse_addr=False)
    master, volume, filer, s3 = base, base + 1, base + 2, base + 3
    grpc = {"master": base + 4, "volume": base + 5, "filer": base + 6, "s3": base + 7}
    log = workdir / "seaweedfs.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(weed), "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
             f"-master.port={master}", f"-volume.port={volume}", "-filer", f"-filer.port={filer}", "-s3",
             f"-s3.port={s3}", f"-s3.config={config}", "-master.volumeSizeLimitMB=256", "-volume.max=100",
             *(f"-{name}.port.grpc={port}" for name, port in grpc.items()),
             f"-metricsPort={base + 8}", "-metricsIp=127.0.0.1",
             "-s3.port.iceberg=0", "-s3.port.lance=0"],  # its Iceberg and Lance servers (on fixed ports) stay off
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return _Launched(proc, f"http://127.0.0.1:{s3}", log, f"http://127.0.0.1:{base + 8}/metrics")


@contextmanager
def _serving(launched: _Launched) -> Iterator[S3Server]:
    try:  # an unsigned request is refused once the gateway serves (403), which is what we wait for
        wait_http(launched.endpoint + "/", launched.proc, launched.log, "SeaweedFS S3 server", 60)
        yield S3Server(launched.endpoint, launched.proc, launched.log, launched.metrics)
    finally:
        launched.stop()


@contextmanager
def seaweedfs_server(workdir: Path) -> Iterator[S3Server]:
    """`weed server -s3`: master, volume server, filer and S3 gateway in one process on loopback, with one S3
    identity (the test credentials), so unsigned or wrongly signed requests are refused as on AWS."""
    with _serving(_launch(workdir)) as server:
        yield server


class SeaweedSpares:
    """A fresh `weed server` per test, each started two tests ahead. A new server answers at once but holds its
    first write ~8 s (its master defers volume ids for a heartbeat window after minting a topology; the filer's
    lock ring forms seconds later), on a test's critical path each time. Started while the tests before it ran, it
    is past that when its test takes it; idle meanwhile, it costs ~0.01 CPU-s per second."""

    def __init__(self, root: Path, ahead: int = 2) -> None:
        self.root, self.ahead, self.started = root, ahead, 0
        self.spares: list[_Launched] = []

    def _launch(self) -> _Launched:
        self.started += 1
        return _launch(self.root / f"s3-{self.started}")

    @contextmanager
    def take(self) -> Iterator[S3Server]:
        launched = self.spares.pop(0) if self.spares else self._launch()
        with _serving(launched) as server:
            while len(self.spares) < self.ahead:
                self.spares.append(self._launch())
            yield server

    def close(self) -> None:
        for spare in self.spares:
            spare.stop()
        self.spares.clear()
