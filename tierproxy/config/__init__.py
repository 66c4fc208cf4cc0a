"""Settings of `serve` and `tier` (sharing `CommonSettings`): defaults < config file < TIERPROXY_* env < CLI flags.

Keys use Kafka's dotted style in files (``bootstrap.servers=...``), ``TIERPROXY_BOOTSTRAP_SERVERS`` in the
environment and ``--bootstrap-server`` style flags on the command line. A bad value stops the process at
start with a `ConfigError` naming the key and the reason.

Modules: `values` (parsers and checks), `common`, `proxy`, `tier` (the settings models), `sources` (merging).

The names below are imported on first use: importing a submodule (an executor's `config.identity`) does not build
every settings model (pydantic, ~0.3 s of a Spark worker's start).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_WHERE = {
    "OVERRIDE_KEYS": "common", "CommonSettings": "common", "ConfigError": "propfile", "ProxySettings": "proxy",
    "ENV_PREFIX": "sources", "dotted": "sources", "load_settings": "sources", "TierSettings": "tier",
    "SPARK_MASTER": "values", "check_writable_dir": "values", "file_uri": "values", "hide_url_password": "values",
    "hide_url_passwords": "values", "parse_duration_ms": "values", "redact": "values",
}

__all__ = ["ENV_PREFIX", "OVERRIDE_KEYS", "SPARK_MASTER", "CommonSettings", "ConfigError", "ProxySettings",
           "TierSettings", "check_writable_dir", "dotted", "file_uri", "hide_url_password", "hide_url_passwords",
           "load_settings", "parse_duration_ms", "redact"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
