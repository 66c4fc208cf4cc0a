"""Where settings come from: defaults < config file < TIERPROXY_* env < CLI flags; a bad value is one
`ConfigError` naming the key, the value's source and the reason."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from tierproxy.config.common import CommonSettings
from tierproxy.config.proxy import ProxySettings
from tierproxy.config.values import redact, url_password
from tierproxy.propfile import ConfigError, read_properties

ENV_PREFIX = "TIERPROXY_"
S = TypeVar("S", bound=CommonSettings)


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
        for key, value in read_properties(path).items():
            name = _normalize(key)
            if name not in fields:
                raise ConfigError(f"{key}: unknown config key (in {path})")
            merged[name], sources[name] = value, f"{path}"
    environ = os.environ if env is None else env
    for key, value in environ.items():
        if key.startswith(ENV_PREFIX):
            name = _normalize(key[len(ENV_PREFIX):])
            if name in fields:
                merged[name], sources[name] = value, f"env {key}"
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
