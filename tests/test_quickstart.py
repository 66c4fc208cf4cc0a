"""The README's quickstart runs as written: its properties file and its commands, read from the README itself (only
ports and paths are changed, to this test's own), from `make kafka` to kcat through the proxy. Then the broker
deletes all but its active segment and the proxy still reads every record from offset 0, as the quickstart
promises; a Ctrl-C pressed twice on `make kafka` leaves no JVM and its port free; started again, it has the same
data. Before: the quickstart had no Kafka to run against (the demo's is on random ports and torn down at its end)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.kafka import set_topic_config, watermarks
from tests.support.parts import free_port_block, wait_port
from tests.support.stopping import Started, comm
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.kcat, pytest.mark.process]
ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _quickstart() -> tuple[str, list[str]]:
    """The quickstart's properties file and its command lines (shell comments dropped), in order."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Quickstart"):]
    section = section[:section.index("\n## ", 1)]
    blocks = BLOCK.findall(section)
    props = [body for lang, body in blocks if lang == "properties"]
    lines = [re.split(r"\s+#", line, maxsplit=1)[0].strip() for lang, body in blocks if lang == "sh"
             for line in body.splitlines()]
    return props[0], [line for line in lines if line and not line.startswith("#")]


def test_the_readme_quickstart_runs_as_written(kcat: str, tmp_path: Path) -> None:
    props, lines = _quickstart()
    assert lines[0] == "make kafka" and any(line.startswith("tierproxy serve") for line in lines), lines
    kafka_port, listen, admin = free_port_block(1), free_port_block(1), free_port_block(1)
    swap = {"127.0.0.1:9092": f"127.0.0.1:{kafka_port}", "127.0.0.1:9192": f"127.0.0.1:{listen}",
            "127.0.0.1:9180": f"127.0.0.1:{admin}", "/var/tmp/tierproxy": str(tmp_path)}

    def here(text: str) -> str:
        for old, new in swap.items():
            text = text.replace(old, new)
        return text

    (tmp_path / "tierproxy.properties").write_text(here(props))
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "TIERPROXY_ADMIN_URL": f"http://127.0.0.1:{admin}",  # `tierproxy admin`'s default is the quickstart's
           "TIERPROXY_BROKER_PORT_BASE": str(free_port_block(2)), "TIERPROXY_BROKER_PORT_RANGE": "2",
           "TIERPROXY_TIER_STATE_DIR": str(tmp_path / "state"), "TIERPROXY_SPARK_MASTER": "local[1]"}
    running: list[Started] = []
    outputs: dict[str, str] = {}
    try:
        for line in lines:
            if line == "make kafka":  # the Makefile's own recipe; -o: the venv counts as installed (a newer
                # pyproject.toml, edited in this checkout, must not reinstall it under the test)
                kafka = Started(["make", "--no-print-directory", "-o", ".venv/.installed", "kafka",
                                 f"KAFKA_PORT={kafka_port}", f"KAFKA_DIR={tmp_path}/kafka"], tmp_path / "kafka.out",
                                env=env, cwd=ROOT)
                running.append(kafka)
                wait_port(kafka_port, 180, proc=kafka.proc)
                wait_until(lambda k=kafka: "Kafka is at" in k.text(), "make kafka's ready line")
            elif line.startswith("tierproxy serve"):
                serve = Started(["bash", "-c", f"exec {here(line)}"], tmp_path / "serve.out", env=env,
                                cwd=tmp_path)
                running.append(serve)
                wait_port(listen, 120, proc=serve.proc)
                wait_port(admin, 60, proc=serve.proc)
            else:
                # pipefail: a producer failing inside a pipe fails the line; not where `head` ends the pipe early
                # (kcat exits 1 on the broken pipe)
                pipefail = ["-o", "pipefail"] if "| head" not in line else []
                done = subprocess.run(["bash", *pipefail, "-c", here(line)], cwd=tmp_path,
                                      env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
                assert done.returncode == 0, f"`{line}`: exit {done.returncode}\n{done.stdout[-2000:]}" \
                                             f"{done.stderr[-3000:]}"
                outputs[line] = done.stdout
        reads = [line for line in lines if line.startswith("kcat") and "127.0.0.1:9192" in line]
        assert reads and outputs[reads[-1]].splitlines() == ["order-1", "order-2", "order-3"], outputs
        partitions = next(out for line, out in outputs.items() if line.startswith("tierproxy admin partitions"))
        row = next(line for line in partitions.splitlines() if re.match(r"│\s*0\s*│", line))
        tier_end = int([cell.strip() for cell in row.split("│")[1:-1]][6])  # partition, leader, ..., tier end
        assert tier_end == 99_999, partitions  # the README's "tier end 99999": every record written

        # the broker deletes all but its active segment: the proxy still serves every record from offset 0
        bootstrap = f"127.0.0.1:{kafka_port}"
        set_topic_config(bootstrap, "orders", "retention.bytes", "1")
        wait_until(lambda: watermarks(bootstrap, "orders")[0] > 0, "the broker deleting the closed segment",
                   timeout=60)
        assert 0 < watermarks(bootstrap, "orders")[0] <= tier_end + 1  # what it deleted, the tier holds
        everything = subprocess.run(["bash", "-c", here(reads[-1]).replace(" | head -3", "")], cwd=tmp_path,
                                    env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
        assert everything.stdout.splitlines() == [f"order-{i}" for i in range(1, 100_001)], everything.stderr[-2000:]

        serve.proc.send_signal(signal.SIGINT)  # Ctrl-C in its terminal
        assert serve.proc.wait(60) == 0 and "Traceback" not in serve.text(), serve.text()[-3000:]
        pids = kafka.signal_twice(signal.SIGINT, group=True)  # Ctrl-C twice in make kafka's terminal
        assert any(comm(p) == "java" for p in pids), pids
        kafka.assert_stopped_cleanly(pids, [kafka_port], codes=(0, 2, -signal.SIGINT))
        assert "Kafka stopped." in kafka.text()

        # started again, it is the same cluster with the same data (its log dirs keep their cluster id)
        again = Started(kafka.proc.args, tmp_path / "kafka-again.out", env=env, cwd=ROOT)
        running.append(again)
        wait_port(kafka_port, 180, proc=again.proc)
        assert watermarks(bootstrap, "orders")[1] == 100_000, again.text()
        pids = again.signal_twice(signal.SIGTERM, group=False)
        again.assert_stopped_cleanly(pids, [kafka_port], codes=(0, 2, -signal.SIGTERM))
    finally:
        for run in running:
            run.kill()
