"""docs/configuration.md is the settings models' own reference: generated, complete, and current."""

from __future__ import annotations

from pathlib import Path

from tierproxy.config import ConfigError, ProxySettings, TierSettings, dotted, load_settings
from tierproxy.config.reference import DURATION, missing_descriptions, render

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


def test_the_page_says_duration_where_a_key_takes_30s(tmp_path: Path) -> None:
    """Each `*.ms` key is tried with `30s` through the real loader: the page's type says "duration" exactly where
    the loader takes it as 30000 ms, "integer" where it refuses it."""
    rows = {line.split("|")[1].strip(" `"): line.split("|")[2].strip() for line in PAGE.read_text().splitlines()
            if line.startswith("| `")}
    tried = 0
    for model in (ProxySettings, TierSettings):
        for name in (n for n in model.model_fields if n.endswith("_ms")):
            env = {"TIERPROXY_TIER_STATE_DIR": str(tmp_path / "state"), f"TIERPROXY_{name.upper()}": "30s"}
            try:
                takes = getattr(load_settings(model, cli={"bootstrap_servers": "127.0.0.1:9092"}, env=env),
                                name) == 30_000
            except ConfigError:
                takes = False
            assert rows[dotted(name)] == (DURATION if takes else "integer"), (dotted(name), takes)
            tried += 1
    assert tried >= 15
