"""The configuration reference, generated from the settings models as Kafka generates its own.

    python -m tierproxy.config.reference > docs/configuration.md

`tests/test_config_reference.py` fails when the page and the models differ, or when a key has no description.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from tierproxy.config.common import CommonSettings
from tierproxy.config.proxy import ProxySettings
from tierproxy.config.sources import ENV_PREFIX, dotted
from tierproxy.config.tier import TierSettings

HEADER = """\
# Configuration reference

Generated from the settings models (`python -m tierproxy.config.reference > docs/configuration.md`); a test
fails when this page and the code differ. Every key can be set in a properties file (`--config FILE` or `-c`,
Kafka-style `key=value`, a comment on a line of its own: as in Kafka's files, `key=value  # note` keeps the note in
the value, with a warning, and a `storage` or `metadata` location holding `#` is refused), as a `TIERPROXY_*`
environment variable, or (for some) as a flag; flags win over the environment, the environment over the file, the
file over the defaults. One file can serve every command: each command takes its own keys and passes over the other
commands' keys; a key no command knows is refused, naming the one it most likely meant.
"""

SECTIONS = (
    ("Every command", "The cluster, the tier's storage and metadata, tierproxy's own identity.", None),
    ("`tierproxy serve`", "The proxy and its admin API.", ProxySettings),
    ("`tierproxy tier`, `iceberg` and `restore`", "The PySpark jobs and the restore.", TierSettings),
)


DURATION = "duration (ms, or e.g. 30s, 5m, 1h)"


def accepts_duration(model: type[BaseModel], name: str) -> bool:
    """Whether the key takes `30s` as well as a number of milliseconds, asked of the model's own validators (a
    "before" validator that turns `30s` into 30000): the page says so only where the code does it."""
    for validator in model.__pydantic_decorators__.field_validators.values():
        if name in validator.info.fields and validator.info.mode == "before":
            try:
                return bool(validator.func("30s") == 30_000)
            except (TypeError, ValueError):
                return False
    return False


def _type(annotation: Any) -> str:
    if get_origin(annotation) in (Union, types.UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        return " or ".join(_type(a) for a in inner) + ", optional"
    if annotation is SecretStr:
        return "secret"
    if get_origin(annotation) is dict:
        return "JSON object"
    return {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "Path": "path"}.get(
        getattr(annotation, "__name__", str(annotation)), str(annotation))


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        made = field.default_factory()  # type: ignore[call-arg]
        return f"`{json.dumps(made)}`" if isinstance(made, (dict, list)) else "(computed at start)"
    if field.default is PydanticUndefined:
        return "(required)"
    if field.default is None:
        return "(none)"
    value = field.default
    if isinstance(value, bool):
        return "true" if value else "false"
    return f"`{value}`" if value != "" else '`""`'


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    """The whole page."""
    common = set(CommonSettings.model_fields)
    out = [HEADER]
    for title, what, model in SECTIONS:
        fields = CommonSettings.model_fields if model is None else {
            n: f for n, f in model.model_fields.items() if n not in common}
        out += [f"## {title}", "", what, "", "| key | type | default | environment | description |",
                "|---|---|---|---|---|"]
        for name, field in sorted(fields.items()):
            kind = DURATION if accepts_duration(model or CommonSettings, name) else _type(field.annotation)
            out.append(f"| `{dotted(name)}` | {kind} | {_cell(_default(field))} | "
                       f"`{ENV_PREFIX}{name.upper()}` | {_cell(field.description or '')} |")
        out.append("")
    return "\n".join(out)


def missing_descriptions() -> list[str]:
    """Keys with no description (the page must say what each key does)."""
    return sorted(dotted(n) for model in (ProxySettings, TierSettings) for n, f in model.model_fields.items()
                  if not (f.description or "").strip())


if __name__ == "__main__":
    sys.stdout.write(render())
