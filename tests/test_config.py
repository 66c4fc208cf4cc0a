"""Settings at start: the default tier lives under the working directory (never at /), every form of a file path
means what it says, and a path tierproxy cannot write stops the process with exit 2 and one line naming the key,
the path and the reason."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.parts import unavailable
from tierproxy.config import ConfigError, ProxySettings, TierSettings, file_uri, load_settings

ROOT = Path(__file__).resolve().parent.parent


def test_the_default_tier_and_state_resolve_under_the_working_directory(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    s = load_settings(TierSettings, cli={"bootstrap_servers": "127.0.0.1:9092"}, env={})
    assert s.storage == f"file://{tmp_path}/tierproxy-data/tier"
    assert s.tier_state_dir == tmp_path / "tierproxy-data" / "state"
    assert load_settings(ProxySettings, cli={"bootstrap_servers": "127.0.0.1:9092"}, env={}).storage == s.storage
    assert not Path("/tierproxy-data").exists()


@pytest.mark.parametrize(("given", "expected"), [
    ("file:///abs/tier", "file:///abs/tier"),
    ("file://./rel/tier", "file://{cwd}/rel/tier"),
    ("file:rel/tier", "file://{cwd}/rel/tier"),
    ("file:/abs/tier", "file:///abs/tier"),
    ("rel/tier", "file://{cwd}/rel/tier"),
    ("./rel/tier", "file://{cwd}/rel/tier"),
    ("/abs/tier", "file:///abs/tier"),
    ("s3://bucket/prefix?endpoint=http://127.0.0.1:9000", "s3://bucket/prefix?endpoint=http://127.0.0.1:9000"),
    ("topic:meta", "topic:meta"),
])
def test_file_uri_forms(given: str, expected: str) -> None:
    assert file_uri(given) == expected.format(cwd=os.getcwd())


def test_a_file_uri_with_a_host_is_refused() -> None:
    with pytest.raises(ValueError, match="names a host"):
        file_uri("file://data/tier")


@pytest.mark.parametrize(("key", "value", "reason"), [
    ("storage", "file:///nonexistent-{n}/tier", "its parent /nonexistent-{n} does not exist (nothing is created at /)"),
    ("storage", "{tmp}/a-file/tier", "{tmp}/a-file is a file, not a directory"),
    ("storage", "{tmp}/a-file", "a file is in the way"),
    ("metadata", "file://{tmp}/a-file", "a file is in the way"),
    ("metadata_checkpoint_dir", "{tmp}/a-file/ckpt", "is a file, not a directory"),
    ("tier_state_dir", "/nonexistent-{n}/state", "nothing is created at /"),
    ("spark_master", "lcal[2]", "is not a Spark master URL"),
    ("tier_topic_overrides", '{{"t": {{"retention.msx": 1}}}}', "unknown key(s) ['retention.msx']"),
    ("tier_retention_ms", "-2", "greater than or equal to -1"),
    ("iceberg_partition_by", "partition,week(timestamp)", "entry 'week(timestamp)': not one of partition, "
                                                          "hour(timestamp), day(timestamp)"),
    ("iceberg_compaction_min_input_files", "1", "greater than or equal to 2"),
    ("iceberg_target_file_bytes", "-1", "greater than or equal to 0"),
    ("iceberg_value_format", "json", "should match pattern '^(registry|string|bytes)$'"),
])
def test_bad_paths_and_values_name_the_key_and_the_reason(tmp_path: Path, key: str, value: str, reason: str) -> None:
    (tmp_path / "a-file").write_text("x")
    fill = {"tmp": tmp_path, "n": os.getpid()}
    with pytest.raises(ConfigError) as err:
        load_settings(TierSettings, cli={"bootstrap_servers": "127.0.0.1:9092", key: value.format(**fill)}, env={})
    assert str(err.value).startswith(key.replace("_", ".") + ": ")
    assert reason.format(**fill) in str(err.value)


def test_typed_tables_need_a_registry_only_for_the_registry_value_format() -> None:
    base = {"bootstrap_servers": "127.0.0.1:9092", "iceberg_tables": "t=kafka.{topic}"}
    with pytest.raises(ConfigError, match=r"iceberg\.schema\.registry\.url is not"):
        load_settings(TierSettings, cli=base, env={})
    assert load_settings(TierSettings, cli={**base, "iceberg_value_format": "string"}, env={}).iceberg_tables


def test_serve_with_an_unwritable_storage_exits_2_with_one_line(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        unavailable("root", "this test runs tierproxy as another uid (setpriv)")
    top = Path(tempfile.mkdtemp(prefix="tierproxy-config-"))  # reachable by another uid, unlike pytest's tmp_path
    top.chmod(0o755)
    locked = top / "locked"
    locked.mkdir(mode=0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERPROXY_")}
    # as an unprivileged user (the image's uid), the way a user meets it
    out = subprocess.run(["setpriv", "--reuid=10001", "--regid=10001", "--clear-groups", sys.executable, "-m",
                          "tierproxy.cli", "serve", "--bootstrap-server", "127.0.0.1:9", "--storage",
                          f"{locked}/tier", "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60,
                         env=env, cwd=ROOT)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines == [f"tierproxy: config error: storage: {locked}/tier: cannot be created, {locked} is not "
                     "writable by this user (uid 10001) (from command line)"]
    shutil.rmtree(top)


def test_a_port_in_use_and_unreachable_brokers_are_one_line(tmp_path: Path) -> None:
    import socket

    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERPROXY_")}
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", "tierproxy.cli", "serve", "--bootstrap-server", "127.0.0.1:9",
                              "--listen", f"127.0.0.1:{port}", "--storage", str(tmp_path / "tier")],
                             capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"tierproxy: config error: listen: 127.0.0.1:{port}: Address already in "
                                               f"use (while attempting to bind on address ('127.0.0.1', {port}))"]
    out = subprocess.run([sys.executable, "-m", "tierproxy.cli", "tier", "--once", "--no-progress",
                          "--bootstrap-server", "127.0.0.1:9", "--storage", str(tmp_path / "tier"), "--metadata",
                          f"file://{tmp_path}/meta"], capture_output=True, text=True, timeout=120,
                         env={**env, "TIERPROXY_TIER_STATE_DIR": str(tmp_path / "state")}, cwd=ROOT)
    assert out.returncode == 6, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("tierproxy: the brokers at 127.0.0.1:9 cannot be reached: ")
    assert "Traceback" not in out.stderr


def test_secrets_and_passwords_inside_urls_never_show(tmp_path: Path) -> None:
    """`/v1/config`, logs and reprs show no secret: secret keys as ***, and a password inside any URL (a catalog's
    `postgresql://user:password@host/db`) as ***."""
    for model in (ProxySettings, TierSettings):
        s = model(bootstrap_servers="127.0.0.1:9092", storage=f"file://{tmp_path}/tier",
                  iceberg_catalog="postgresql+psycopg2://tp:hunter2-pw@db.example:5432/catalog",
                  iceberg_catalog_token="t0k3n-secret",
                  **({"tier_state_dir": tmp_path / "state"} if model is TierSettings else {}))
        shown = [repr(s), str(s), str(s.redacted())]
        for text in shown:
            assert "hunter2-pw" not in text and "t0k3n-secret" not in text, text
        assert s.redacted()["iceberg_catalog"] == "postgresql+psycopg2://tp:***@db.example:5432/catalog"
        assert s.iceberg_catalog is not None and "hunter2-pw" in s.iceberg_catalog  # the value itself stays usable
