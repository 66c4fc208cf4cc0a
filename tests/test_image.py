"""The container images (`make image`) started with buildah as a user would start them: `serve` from the proxy image
(no JRE, no Spark) proxies the test Kafka for kcat and SIGTERM to the container's init (tini, PID 1 in a pod) stops
it within its drain time; `tier --once` from the jobs image tiers a topic to a filesystem tier."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.jvm import options as jvm_options
from tests.support.kafka import create_topic
from tests.support.parts import descendants, free_port_block, unavailable, wait_port
from tests.support.tiering import offsets_of, settings, tiered
from tierproxy.dev.kafkadist import KafkaCluster
from tierproxy.dev.ports import free_port

# the module's first test waits for the image build `make test` started beside the suite (2-4 min on an idle
# machine, twice that on a loaded one): its own hang limit, above the suite's
pytestmark = [pytest.mark.kafka, pytest.mark.image, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"localhost/tierproxy:{VERSION}"  # serve, admin, restore
JOBS_IMAGE = f"localhost/tierproxy-jobs:{VERSION}"  # tier, iceberg (PySpark, a JRE) and the rest
ENV = {**os.environ, "STORAGE_DRIVER": "vfs", "BUILDAH_ISOLATION": "chroot"}


def buildah(*args: str, timeout: float = 120) -> str:
    return subprocess.run(["buildah", *args], check=True, capture_output=True, text=True, env=ENV,
                          timeout=timeout).stdout.strip()


@pytest.fixture(scope="module")
def image() -> str:
    """The images of these sources: `make image`'s build script, which waits for a build already running (`make
    test` starts one beside the first tests) and builds only when the sources changed since the last images. Slow
    (~2-4 min when it builds): buildah builds both images from Debian packages."""
    if os.geteuid() != 0:
        unavailable("buildah", "the image tests need root (buildah, chroot isolation)")
    proc = subprocess.run(["bash", str(ROOT / ".ci/image/build.sh")], capture_output=True, text=True,
                          timeout=1800, env={**ENV, "PY": sys.executable})
    if proc.returncode != 0 or shutil.which("buildah") is None:
        unavailable("make image", proc.stdout[-2000:] + proc.stderr[-2000:])
    return IMAGE


@pytest.fixture
def container(image: str) -> Iterator[str]:
    name = buildah("from", "--pull-never", image)
    yield name
    buildah("rm", name)


@pytest.fixture
def jobs_container(image: str) -> Iterator[str]:
    name = buildah("from", "--pull-never", JOBS_IMAGE)
    yield name
    buildah("rm", name)


def run_in(container: str, cmd: list[str], log: Path, volumes: tuple[Path, ...] = (),
           env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`buildah run` the image's entrypoint (tini) with `cmd` on the host network."""
    vols = [f"--volume={v}:{v}" for v in volumes]
    if jvm_options:  # the jobs' Spark driver with the run's JVM options (C1 alone), as every JVM the run starts
        vols.append(f"--env=SPARK_SUBMIT_OPTS={' '.join(jvm_options)}")
    vols += [f"--env={k}={v}" for k, v in (env or {}).items()]
    with open(log, "wb") as out:
        return subprocess.Popen(["buildah", "run", "--isolation", "chroot", "--network", "host",
                                 "--env", "TINI_SUBREAPER=1", "--env", "SPARK_LOCAL_IP=127.0.0.1", *vols, container,
                                 "--", "/usr/bin/tini", "-g", "--", "tierproxy", *cmd],
                                stdout=out, stderr=subprocess.STDOUT, env=ENV)


def descendant(pid: int, name: str) -> int:
    """The first process under `pid` whose command is `name` (the container's tini)."""
    for p in descendants(pid):
        try:
            if Path(f"/proc/{p}/comm").read_text().strip() == name:
                return p
        except OSError:
            pass
    raise LookupError(f"no {name} under {pid}")


@pytest.mark.parametrize("jobs", [False, True], ids=["proxy", "jobs"])
def test_image_is_non_root_with_labels_and_no_compilers(image: str, jobs: bool, tmp_path: Path) -> None:
    name = JOBS_IMAGE if jobs else image
    cfg = buildah("inspect", "--type", "image", "--format",
                  "{{.OCIv1.Config.User}}|{{index .OCIv1.Config.Labels \"org.opencontainers.image.version\"}}|"
                  "{{.OCIv1.Config.Entrypoint}}|{{index .OCIv1.Config.Labels \"org.opencontainers.image.title\"}}",
                  name)
    user, version, entrypoint, title = cfg.split("|")
    assert user.split(":")[0] == "10001" and version == VERSION and "tini" in entrypoint
    assert title == ("tierproxy-jobs" if jobs else "tierproxy")
    container = buildah("from", "--pull-never", name).strip()
    try:
        out = subprocess.run(["buildah", "run", "--isolation", "chroot", container, "--", "sh", "-c",
                              "id -u; command -v gcc cc g++ make pip || true; ls /var/cache/apt /var/lib/apt/lists |"
                              " wc -l; java -version 2>&1 | head -1; tierproxy --help | head -1; tierproxy tier "
                              "--once --bootstrap-server 127.0.0.1:1 --storage file:///tmp/t 2>&1 | head -1"],
                             capture_output=True, text=True, env=ENV, timeout=120)
    finally:
        buildah("rm", container)
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stderr
    assert lines[0] == "10001"
    assert not any(line.endswith(("/gcc", "/cc", "/g++", "/make", "/pip")) for line in lines), lines
    assert "usage: tierproxy" in out.stdout
    if jobs:
        assert "openjdk" in out.stdout and "needs the tier extra" not in out.stdout
    else:  # no JRE, no Spark: `tier` names the image or extra it needs
        assert "openjdk" not in out.stdout and "pip install 'kafka-tierproxy[tier]'" in out.stdout, out.stdout


def test_serve_from_the_image_proxies_kcat_and_stops_on_sigterm(kafka: KafkaCluster, container: str, kcat: str,
                                                                 tmp_path: Path, topic_name: str) -> None:
    port, base = free_port(), free_port_block(100)
    tmp_path.chmod(0o777)  # the image runs as uid 10001
    create_topic(kafka.bootstrap, topic_name)
    log = tmp_path / "serve.log"
    proc = run_in(container, ["serve", "--bootstrap-server", kafka.bootstrap, "--listen", f"127.0.0.1:{port}",
                              "--admin-listen", f"127.0.0.1:{free_port()}", "--storage", f"file://{tmp_path}/tier",
                              "--metadata", f"file://{tmp_path}/meta"], log, volumes=(tmp_path,),
                  env={"TIERPROXY_BROKER_PORT_BASE": str(base)})
    try:
        wait_port(port, 60)
    except TimeoutError:
        proc.kill()
        pytest.fail(f"serve from the image did not listen: {log.read_text()[-3000:]}")
    try:
        records = "\n".join(f"image-{i}" for i in range(200)) + "\n"
        subprocess.run([kcat, "-b", f"127.0.0.1:{port}", "-P", "-t", topic_name], input=records, text=True,
                       check=True, timeout=60)
        got = subprocess.run([kcat, "-b", f"127.0.0.1:{port}", "-C", "-t", topic_name, "-o", "beginning", "-e",
                              "-q"], capture_output=True, text=True, check=True, timeout=60)
        assert got.stdout.splitlines() == [f"image-{i}" for i in range(200)]

        tini = descendant(proc.pid, "tini")
        started = time.monotonic()
        os.kill(tini, signal.SIGTERM)
        proc.wait(timeout=10 + 5)  # shutdown.drain.ms (10 s) plus a few seconds
        assert time.monotonic() - started < 15
        assert proc.returncode == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_tier_once_from_the_jobs_image_tiers_a_topic_to_the_filesystem(kafka: KafkaCluster, jobs_container: str,
                                                                        tmp_path: Path, topic_name: str) -> None:
    from confluent_kafka import Producer

    create_topic(kafka.bootstrap, topic_name, config={"segment.ms": "500"})
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5, "compression.type": "zstd",
                  "batch.num.messages": 50})
    for i in range(2000):
        p.produce(topic_name, os.urandom(100).hex().encode(), f"k{i}".encode())
    p.flush(30)
    tmp_path.chmod(0o777)  # the image runs as uid 10001
    s = settings(kafka.bootstrap, tmp_path, topic_name, tier_segment_bytes=16 * 1024)
    log = tmp_path / "tier.log"
    proc = run_in(jobs_container, ["tier", "--once", "--no-progress", "--bootstrap-server", kafka.bootstrap,
                              "--storage", s.storage, "--metadata", str(s.metadata), "--topics", s.tier_topics,
                              "--master", "local[1]"], log, volumes=(tmp_path,),
                  env={"TIERPROXY_TIER_SEGMENT_BYTES": str(s.tier_segment_bytes)})
    try:
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log.read_text()[-3000:]
    segs, raw, _ = tiered(s, topic_name)
    assert len(segs) >= 2
    assert offsets_of(raw) == list(range(2000))


def test_the_images_defaults_work_for_its_user_and_an_unwritable_storage_exits_2(
        kafka: KafkaCluster, jobs_container: str, tmp_path: Path, topic_name: str) -> None:
    """No --storage: `tier` and `serve` (the jobs image runs every command) write the tier under the image's data
    dir, /var/lib/tierproxy (a volume owned by uid 10001); a storage the user cannot write stops `serve` with exit
    2 and one line."""
    container = jobs_container
    from confluent_kafka import Producer

    create_topic(kafka.bootstrap, topic_name, config={"segment.ms": "500"})
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
    for i in range(500):
        p.produce(topic_name, f"v{i}".encode())
    p.flush(30)
    meta = {"TIERPROXY_METADATA": "topic:__tierproxy_image_defaults?partitions=3&replication=1"}
    tier = run_in(container, ["tier", "--once", "--no-progress", "--bootstrap-server", kafka.bootstrap, "--topics",
                              topic_name, "--master", "local[1]"], tmp_path / "tier.log", env=meta)
    try:
        tier.wait(timeout=240)
    finally:
        if tier.poll() is None:
            tier.kill()
    assert tier.returncode == 0, (tmp_path / "tier.log").read_text()[-3000:]
    found = buildah("run", "--isolation", "chroot", container, "--", "sh", "-c",
                    "find /var/lib/tierproxy -name '*.log' -user 10001 | wc -l; ls /var/lib/tierproxy/state")
    count, *state = found.splitlines()
    assert int(count) >= 1 and "last_run.json" in state, found

    port, base = free_port(), free_port_block(100)
    serve = run_in(container, ["serve", "--bootstrap-server", kafka.bootstrap, "--listen", f"127.0.0.1:{port}"],
                   tmp_path / "serve.log", env={**meta, "TIERPROXY_BROKER_PORT_BASE": str(base)})
    try:
        wait_port(port, 60)
        os.kill(descendant(serve.pid, "tini"), signal.SIGTERM)
        serve.wait(timeout=20)
        assert serve.returncode == 0, (tmp_path / "serve.log").read_text()[-3000:]
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait(10)

    bad = run_in(container, ["serve", "--bootstrap-server", kafka.bootstrap, "--storage", "file:///etc/tier"],
                 tmp_path / "bad.log")
    assert bad.wait(timeout=60) != 0
    text = (tmp_path / "bad.log").read_text()
    assert "subprocess exited with status 2" in text and "Traceback" not in text  # buildah reports the exit code
    lines = [line for line in text.splitlines() if line.startswith("tierproxy")]
    assert lines == ["tierproxy: config error: storage: /etc/tier: cannot be created, /etc is not writable by this "
                     "user (uid 10001) (from command line)"], lines
