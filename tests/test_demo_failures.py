"""`tierproxy demo`'s steps when something under it fails (a CI run met serve refusing its ports): one FAILED line
naming the process and its log, never a traceback, and never the step that deletes the broker's data before the
tier holds it. Real processes and commands, no broker (`tests/test_demo.py` walks through the whole demo)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tierproxy.dev import demo


def test_a_tierproxy_process_that_exited_is_named_with_its_logs_last_lines(tmp_path: Path) -> None:
    (tmp_path / "serve.log").write_text("starting\ntierproxy: config error: config: admin.listen 127.0.0.1:9: inside "
                                        "the broker port range\n")
    ended = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(2)"])
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ended.wait(30)
        with pytest.raises(demo.DemoFailed) as failed:
            demo._check_running({"tier": running, "serve": ended}, tmp_path)
        said = str(failed.value)
        assert "`tierproxy serve` exited with 2" in said and "inside the broker port range" in said, said
        assert f"{tmp_path}/serve.log" in said
        demo._check_running({"tier": running}, tmp_path)  # running: nothing to say
    finally:
        running.kill()
        running.wait(30)


def test_a_failing_command_is_one_line_not_a_traceback() -> None:
    with pytest.raises(demo.DemoFailed, match="exited with 1: no such topic"):
        demo._run("echo 'no such topic' >&2; exit 1")
    assert demo._run("echo read") == "read\n"


def test_the_proxys_ports_are_ports_serve_accepts() -> None:
    """serve refuses an admin port inside its broker ports (broker.port.base .. + broker.port.range), the CI run's
    failure when the demo drew its two ports apart; its ports now come from one block."""
    from tierproxy.config.proxy import ProxySettings

    for _ in range(20):
        listen, admin = demo.proxy_ports()
        s = ProxySettings(bootstrap_servers="127.0.0.1:1", listen=f"127.0.0.1:{listen}",
                          admin_listen=f"127.0.0.1:{admin}")
        assert s.broker_port_range == demo.BROKER_PORTS and not s.port_base <= admin < s.port_base + demo.BROKER_PORTS
    with pytest.raises(ValueError, match="inside the broker port range"):  # what the check refuses, as it did
        ProxySettings(bootstrap_servers="127.0.0.1:1", listen=f"127.0.0.1:{listen}",
                      admin_listen=f"127.0.0.1:{listen + 50}")
