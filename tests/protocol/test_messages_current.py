"""The typed message module is what the schema declarations render: regenerate it with
`python -m tierproxy.dev.messages > protocol/messages.py` after changing a schema."""

from __future__ import annotations

import typing
from pathlib import Path

from protocol import messages, registry
from tests.support.samples import sample
from tierproxy.dev.messages import render

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_generated_module_is_current() -> None:
    assert (ROOT / "protocol" / "messages.py").read_text() == render()


def test_every_message_of_the_registry_has_a_type_with_every_field() -> None:
    for api in registry.SUPPORTED.values():
        for message in (api.request, api.response):
            if message is None:
                continue
            typed = getattr(messages, message.name)
            keys = set(typing.get_type_hints(typed)) - {"_tags", "_unknown"}
            assert keys == {f.name for f in message.fields}, message.name


def _check(value: typing.Any, hint: typing.Any, where: str) -> None:
    """`value` (as decoded) has exactly the keys of the TypedDict found in `hint`, recursively."""
    for arg in typing.get_args(hint) or (hint,):
        if typing.get_origin(arg) is list and isinstance(value, list):
            for item in value:
                _check(item, typing.get_args(arg)[0], where + "[]")
            return
        if typing.is_typeddict(arg) and isinstance(value, dict):
            hints = typing.get_type_hints(arg)
            assert set(value) - {"_tags", "_unknown"} == set(hints) - {"_tags", "_unknown"}, where
            for key, v in value.items():
                if key not in ("_tags", "_unknown"):
                    _check(v, hints[key], f"{where}.{key}")
            return


def test_every_decoded_version_has_exactly_the_keys_of_its_type() -> None:
    for api in registry.SUPPORTED.values():
        for message in (api.request, api.response):
            if message is None:
                continue
            for version in range(message.min_version, message.max_version + 1):
                decoded = message.decode(memoryview(message.encode(sample(message, version), version)), version)
                _check(decoded, getattr(messages, message.name), f"{message.name} v{version}")
