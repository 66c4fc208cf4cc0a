"""What is redacted: the password of every URL a setting can hold, whatever it contains (SQLAlchemy and HTTP
clients accept `/`, `:`, `?`, `#`, `@`, whitespace...), in `/v1/config`'s settings, in catalog and registry errors
that quote their URI, and in free text (a log line) for passwords without whitespace."""

from __future__ import annotations

import string
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from tierproxy.config import (
    ConfigError,
    ProxySettings,
    TierSettings,
    hide_url_password,
    hide_url_passwords,
    load_settings,
    redact,
)
from tierproxy.jobs.iceberg.catalog import CatalogConfig, CatalogError, open_catalog
from tierproxy.jobs.iceberg.registry import RegistryConfig

PASSWORDS = st.text(alphabet=string.printable, min_size=1, max_size=40)
USERS = st.text(alphabet=string.ascii_letters + string.digits + "._-", min_size=1, max_size=12)


@given(USERS, PASSWORDS)
def test_a_urls_password_is_hidden_whole_whatever_it_holds(user: str, password: str) -> None:
    for scheme, rest in (("postgresql+psycopg2", "db.example:5432/tierproxy"), ("https", "registry.example/apis"),
                         ("rest:https", "catalog.example/v1")):
        url = f"{scheme}://{user}:{password}@{rest}"
        assert hide_url_password(url) == f"{scheme}://{user}:***@{rest}"


@given(USERS, st.text(alphabet=string.printable.strip(), min_size=1, max_size=40))
def test_in_free_text_a_password_without_whitespace_is_hidden(user: str, password: str) -> None:
    line = f"catalog postgresql://{user}:{password}@db.example/t refused: try again"
    assert hide_url_passwords(line) == f"catalog postgresql://{user}:***@db.example/t refused: try again"


URL_SETTINGS = {  # every setting that can hold a URL with a password: key → value with {pw}
    "iceberg.catalog": "postgresql+psycopg2://tp:{pw}@db.example:5432/iceberg",
    "iceberg.schema.registry.url": "https://tp:{pw}@registry.example:8081",
    "iceberg.warehouse": "s3://warehouse/p?endpoint=https://tp:{pw}@s3.example",
    "spark.master": "k8s://https://tp:{pw}@kubernetes.example:6443",  # refused (no user info): the error hides it
}


@settings(max_examples=40, deadline=None)
@given(PASSWORDS)
def test_no_setting_shows_a_urls_password(password: str) -> None:
    """Accepted: `/v1/config` shows it redacted; refused at start: the error line does not quote it."""
    for key, template in URL_SETTINGS.items():
        value = template.format(pw=password)
        for model in (ProxySettings, TierSettings) if key == "iceberg.catalog" else (TierSettings,):
            try:
                loaded = load_settings(model, cli={"bootstrap_servers": "127.0.0.1:9092",
                                                   "storage": "file:///tmp/tierproxy-redaction"},
                                       env={f"TIERPROXY_{key.upper().replace('.', '_')}": value})
            except ConfigError as exc:
                assert f":{password}@" not in str(exc) and key in str(exc), (key, str(exc))
                continue
            shown = loaded.redacted()[key.replace(".", "_")]
            assert shown == hide_url_password(value) and ":***@" in shown, key


@settings(max_examples=25, deadline=None)
@given(PASSWORDS.filter(lambda p: p.strip() == p and "\\" not in p))
def test_a_catalog_error_quoting_its_uri_shows_no_password(password: str) -> None:
    """The catalog's error line names the catalog, redacted, and passes its client's error through the same."""
    cfg = CatalogConfig(f"nosuchdialect+driver://tp:{password}@db.example/iceberg", "file:///tmp/wh")
    try:
        open_catalog(cfg)
    except CatalogError as exc:
        message = str(exc)
    else:
        raise AssertionError("a catalog of an unknown dialect was opened")
    assert "tp:***@db.example" in message and f"tp:{password}@" not in message, message
    assert "tp:***@db.example" in repr(cfg) and f"tp:{password}@" not in repr(cfg)
    quoted = cfg.redact(f"OperationalError: could not connect to {cfg.uri} (timeout)")
    assert f"tp:{password}@" not in quoted, quoted  # (a one-letter password is hidden everywhere it appears)


def test_redact_hides_known_secrets_anywhere() -> None:
    assert redact("token abc def in a line", "abc def") == "token *** in a line"
    registry = RegistryConfig("https://u:p%2Fq@registry.example", basic_auth="user:s3cr:et")
    assert registry.redact("GET https://u:p%2Fq@registry.example failed for user:s3cr:et") == \
        "GET https://u:***@registry.example failed for ***"


def test_the_settings_file_value_keeps_its_password_for_use(tmp_path: Path) -> None:
    """Redaction is for what is shown: the setting itself still holds the password the client needs."""
    url = "postgresql+psycopg2://u:ab/cd@db.example/iceberg"
    s = TierSettings(bootstrap_servers="127.0.0.1:9092", storage=f"file://{tmp_path}/tier", iceberg_catalog=url)
    assert s.iceberg_catalog == url and s.redacted()["iceberg_catalog"] == "postgresql+psycopg2://u:***@db.example/iceberg"
