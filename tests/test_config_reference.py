"""docs/configuration.md is the settings models' own reference: generated, complete, and current."""

from __future__ import annotations

from pathlib import Path

from tierproxy.config import ProxySettings, TierSettings, dotted
from tierproxy.config.reference import missing_descriptions, render

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_every_key_says_what_it_does() -> None:
    assert missing_descriptions() == []


def test_the_page_is_the_models_reference() -> None:
    assert PAGE.read_text() == render(), \
        "docs/configuration.md differs from the settings: python -m tierproxy.config.reference > docs/configuration.md"


def test_the_page_lists_every_key_once() -> None:
    text = PAGE.read_text()
    keys = {dotted(n) for model in (ProxySettings, TierSettings) for n in model.model_fields}
    for key in keys:
        assert text.count(f"| `{key}` |") == 1, key
