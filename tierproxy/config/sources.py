"""Where settings come from: defaults < config file < TIERPROXY_* env < CLI flags; a bad value is one
`ConfigError` naming the key, the value's source and the reason."""

from __future__ import annotations

import difflib
import logging
import os
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from tierproxy.config.common import CommonSettings
from tierproxy.config.propfile import ConfigError, read_properties
from tierproxy.config.proxy import ProxySettings
from tierproxy.config.values import redact, url_password

ENV_PREFIX = "TIERPROXY_"
S = TypeVar("S", bound=CommonSettings)
# TIERPROXY_* variables that are not settings: read by the admin CLI, the Kafka jars' cache, the demo
NOT_SETTINGS = frozenset({"ADMIN_URL", "CACHE", "ALLOW_SKIP", "ICEBERG_PAUSE_AT", "DEV_PORTS"})  # dev.ports
NOT_SETTINGS_PREFIXES = ("BENCH_", "SOAK_", "FUZZ_")  # the benchmarks' and tests' own knobs
log = logging.getLogger("tierproxy.config")


def all_keys() -> set[str]:
    """Every command's settings (field names): a file shared by every command may hold any of them."""
    from tierproxy.config.tier import TierSettings

    return set(ProxySettings.model_fields) | set(TierSettings.model_fields)


def nearest(name: str, known: set[str]) -> str | None:
    """The known field name closest to a mistyped one, if any is close."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    return close[0] if close else None


def dotted(field: str) -> str:
    return field.replace("_", ".")


def _normalize(key: str) -> str:
    return key.strip().lower().replace(".", "_").replace("-", "_")


def load_settings(model: type[S] = ProxySettings, *, config_file: str | Path | None = None,  # type: ignore[assignment]
                  cli: dict[str, Any] | None = None, env: dict[str, str] | None = None) -> S:
    """Merge defaults < file < env < CLI and validate; raise `ConfigError` naming the bad key."""
    fields = model.model_fields
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config: no such file {path}")
        known = all_keys()
        for key, value in read_properties(path).items():
            name = _normalize(key)
            if name not in fields:
                if name in known:  # another command's key: one file may serve every command
                    continue
                hint = f" (did you mean {dotted(near)}?)" if (near := nearest(name, known)) else ""
                raise ConfigError(f"{key}: unknown config key (in {path}){hint}")
            merged[name], sources[name] = value, f"{path}"
    environ = os.environ if env is None else env
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX):
            name = _normalize(key[len(ENV_PREFIX):])
            if name in fields:
                merged[name], sources[name] = value, f"env {key}"
            elif not _known_variable(key[len(ENV_PREFIX):], name):
                # reported, not refused: one environment often serves several commands and tools
                near = nearest(name, all_keys())
                log.warning("%s is not a tierproxy setting%s: ignored", key,
                            f" (did you mean {ENV_PREFIX}{near.upper()}?)" if near else "")
    for name, value in (cli or {}).items():
        if value is not None:
            merged[name], sources[name] = value, "command line"
    try:
        return model(**merged)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"])
            key = dotted(loc) if loc else "config"
            src = f" (from {sources[loc]})" if loc in sources else ""
            # a validator's message may quote the value: never the password of a URL in it
            msg = redact(err["msg"].removeprefix("Value error, "), url_password(str(err.get("input", ""))))
            problems.append(f"{key}: {msg}{src}")
        raise ConfigError("; ".join(problems)) from None


def _known_variable(suffix: str, name: str) -> bool:
    return name in all_keys() or suffix in NOT_SETTINGS or suffix.startswith(NOT_SETTINGS_PREFIXES)
