"""Settings of `serve` and `tier` (sharing `CommonSettings`): defaults < config file < TIERPROXY_* env < CLI flags.

Keys use Kafka's dotted style in files (``bootstrap.servers=...``), ``TIERPROXY_BOOTSTRAP_SERVERS`` in the
environment and ``--bootstrap-server`` style flags on the command line. A bad value stops the process at
start with a `ConfigError` naming the key and the reason.

Modules: `values` (parsers and checks), `common`, `proxy`, `tier` (the settings models), `sources` (merging).
"""

from tierproxy.config.common import OVERRIDE_KEYS, CommonSettings
from tierproxy.config.propfile import ConfigError
from tierproxy.config.proxy import ProxySettings
from tierproxy.config.sources import ENV_PREFIX, dotted, load_settings
from tierproxy.config.tier import TierSettings
from tierproxy.config.values import (
    SPARK_MASTER,
    check_writable_dir,
    file_uri,
    hide_url_password,
    hide_url_passwords,
    parse_duration_ms,
    redact,
)

__all__ = ["ENV_PREFIX", "OVERRIDE_KEYS", "SPARK_MASTER", "CommonSettings", "ConfigError", "ProxySettings",
           "TierSettings", "check_writable_dir", "dotted", "file_uri", "hide_url_password", "hide_url_passwords",
           "load_settings", "parse_duration_ms", "redact"]
