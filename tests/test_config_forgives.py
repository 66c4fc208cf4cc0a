"""Config that forgives the ordinary: one properties file for every command, a mistyped key or TIERPROXY_* variable
named with the key it most likely meant, `-c`, `--log-level` after the command, and a `# note` after a value
kept as Kafka's own properties format keeps it — said in a warning."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tierproxy.cli import build_parser
from tierproxy.config import ConfigError, ProxySettings, TierSettings, load_settings

SHARED = """\
# one file for serve, tier, iceberg and restore
bootstrap.servers=127.0.0.1:9092
storage=file:///tmp/tierproxy-tier
metadata=topic:
listen=127.0.0.1:9192
remote.fetch.max.wait.ms=400
tier.topics=orders.*
tier.interval.ms=60000
iceberg.table=kafka.history
restore.fill.batch.records=20000
"""


def test_one_file_serves_every_command(tmp_path: Path) -> None:
    f = tmp_path / "tierproxy.properties"
    f.write_text(SHARED)
    serve = load_settings(ProxySettings, config_file=f, env={})
    job = load_settings(TierSettings, config_file=f, env={})
    assert serve.remote_fetch_max_wait_ms == 400 and serve.listen == "127.0.0.1:9192"
    assert job.tier_topics == "orders.*" and job.iceberg_table == "kafka.history"
    assert job.restore_fill_batch_records == 20000


def test_a_key_no_command_knows_is_refused_with_the_key_it_most_likely_meant(tmp_path: Path) -> None:
    f = tmp_path / "tierproxy.properties"
    f.write_text(SHARED + "remote.fetch.max.wiat.ms=100\n")
    with pytest.raises(ConfigError, match=r"remote\.fetch\.max\.wiat\.ms: unknown config key .*did you mean "
                                          r"remote\.fetch\.max\.wait\.ms\?"):
        load_settings(ProxySettings, config_file=f, env={})
    f.write_text(SHARED + "tier.intervall.ms=100\n")  # another command's key, mistyped: refused by each command
    for model in (ProxySettings, TierSettings):
        with pytest.raises(ConfigError, match=r"did you mean tier\.interval\.ms\?"):
            load_settings(model, config_file=f, env={})
    f.write_text(SHARED + "completely.unrelated=1\n")
    with pytest.raises(ConfigError, match=r"completely\.unrelated: unknown config key \(in [^)]*\)$"):
        load_settings(ProxySettings, config_file=f, env={})


def test_a_mistyped_environment_variable_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    env = {"TIERPROXY_BOOTSTRAP_SERVERS": "127.0.0.1:9092", "TIERPROXY_REMOTE_FETCH_MAX_WIAT_MS": "100",
           "TIERPROXY_TIER_TOPICS": "x", "TIERPROXY_ADMIN_URL": "http://127.0.0.1:1", "TIERPROXY_BENCH_RECORDS": "1"}
    with caplog.at_level(logging.WARNING, logger="tierproxy.config"):
        s = load_settings(ProxySettings, env=env)
    assert s.remote_fetch_max_wait_ms == 500, "a mistyped variable sets nothing"
    said = [r.getMessage() for r in caplog.records]
    assert said == ["TIERPROXY_REMOTE_FETCH_MAX_WIAT_MS is not a tierproxy setting (did you mean "
                    "TIERPROXY_REMOTE_FETCH_MAX_WAIT_MS?): ignored"], said  # tier.topics: another command's


def test_a_note_after_a_value_is_part_of_it_as_in_kafka_and_said(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    f = tmp_path / "tierproxy.properties"
    f.write_text("bootstrap.servers=127.0.0.1:9092\nadmin.token=s3cr3t   # optional\n")
    with caplog.at_level(logging.WARNING, logger="tierproxy.config"):
        s = load_settings(ProxySettings, config_file=f, env={})
    assert s.admin_token is not None and s.admin_token.get_secret_value() == "s3cr3t   # optional", \
        "java.util.Properties keeps it: so does tierproxy"
    (said,) = [r.getMessage() for r in caplog.records]
    assert f"{f}:2: the value of admin.token holds ' #'" in said and "s3cr3t" not in said
    f.write_text("bootstrap.servers=127.0.0.1:9092\nadmin.listen=127.0.0.1:9999  # the admin API\n")
    with pytest.raises(ConfigError, match=r"admin\.listen"):
        load_settings(ProxySettings, config_file=f, env={})


@pytest.mark.parametrize("command", ["serve", "tier", "iceberg", "restore"])
def test_c_is_config_and_log_level_goes_after_the_command_too(command: str) -> None:
    parser = build_parser()
    args = parser.parse_args([command, "-c", "x.properties", "--log-level", "DEBUG"])
    assert (args.config, args.log_level) == ("x.properties", "DEBUG")
    assert parser.parse_args(["--log-level", "WARNING", command]).log_level == "WARNING"
    assert parser.parse_args([command]).log_level == "INFO"
