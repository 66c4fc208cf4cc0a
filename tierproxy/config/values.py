"""Value parsers and checks the settings share: HOST:PORT, file URIs, writable directories, durations, Spark
masters, and hiding secrets in what is shown."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

SPARK_MASTER = re.compile(r"local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?|local-cluster\[\d+,\d+,\d+\]|"
                          r"spark://[^\s/]+(,[^\s/]+)*|k8s://\S+|yarn|mesos://\S+")


def _hostport(value: str, key: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{key} must be HOST:PORT, got {value!r}")
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"{key}: port {port} is out of range (0..65535), got {value!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _has_uvloop() -> bool:
    import importlib.util

    return importlib.util.find_spec("uvloop") is not None


def location(value: str) -> str:
    """A storage or metadata location (a URI or a path) without the whitespace around it; one holding `#` is
    refused: in a URI `#` starts a fragment, which names no place, and in a properties file `key=value  # note`
    keeps the note in the value (`storage=tier  # note` once put the tier in a directory `tier  `)."""
    v = value.strip()
    if "#" in v:
        raise ValueError(f"{hide_url_passwords(v)!r}: a location cannot hold '#' (in a properties file a comment "
                         "goes on a line of its own)")
    return v


def file_uri(value: str) -> str:
    """`file:///abs`, `file://./rel`, `file:rel`, `file:/abs` or a plain path → `file:///absolute` (a relative path
    is relative to the working directory); anything else (s3://, topic:) unchanged."""
    v = value.strip()
    if v.startswith("file://./") or v.startswith("file://../"):
        path = v[len("file://"):]
    elif v.startswith("file:") and not v.startswith("file://"):
        path = v[len("file:"):]
    elif v.startswith("file://"):
        if not v.startswith("file:///"):
            raise ValueError(f"{v!r}: file://HOST/... names a host; use file:///absolute/path or file:relative/path")
        return v
    elif "://" not in v and not v.startswith("topic:") and v not in ("topic",):
        path = v
    else:
        return v
    if not path:
        raise ValueError("a file URI needs a path")
    return "file://" + str(Path(path).expanduser().absolute())


def check_writable_dir(path: Path) -> Path:
    """`path` (absolute, or relative to the working directory) is a directory tierproxy can write, or can be
    created: its nearest existing ancestor is a writable directory and not `/` (nothing is ever created at the
    filesystem root). Raises ValueError with the path and the reason."""
    p = path.expanduser().absolute()
    try:
        return _writable_dir(p)
    except PermissionError as exc:  # a parent this user cannot enter
        raise ValueError(f"{p}: cannot be reached by this user (uid {os.getuid()}): {exc.strerror}") from None


def _writable_dir(p: Path) -> Path:
    if p.exists():
        if not p.is_dir():
            raise ValueError(f"{p}: a file is in the way (not a directory)")
        if not os.access(p, os.W_OK | os.X_OK):
            raise ValueError(f"{p}: not writable by this user (uid {os.getuid()})")
        return p
    ancestor = p.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{p}: {ancestor} is a file, not a directory")
    if ancestor == Path(ancestor.anchor):
        raise ValueError(f"{p}: its parent {p.parent} does not exist (nothing is created at {ancestor})")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ValueError(f"{p}: cannot be created, {ancestor} is not writable by this user (uid {os.getuid()})")
    return p


SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
SECRET_KEYS = ("password", "secret", "token", "credential", "user_info", "user.info")


def url_password_span(url: str) -> tuple[int, int] | None:
    """Where the password of `url` is (start, end), or None: the user info runs from `://` to the last `@` before
    the host, the password from its first `:` on. SQLAlchemy (`postgresql+psycopg2://u:ab/cd@host/db`) and HTTP
    clients take `/`, `:`, `?` and more in a password (base64 passwords hold `/` and `+`), so neither `/` nor any
    other character ends it early; an `@` in a path makes the span too long, never too short."""
    scheme = SCHEME.search(url)  # `rest:https://…` and `k8s://https://…` too: the first scheme's `://`
    if scheme is None:
        return None
    at = url.rfind("@", scheme.end())
    colon = url.find(":", scheme.end(), at) if at > 0 else -1
    return (colon + 1, at) if colon >= 0 else None


def url_password(url: str) -> str | None:
    """The password in `url`'s user info (`url_password_span`), None when it has none."""
    span = url_password_span(url)
    return None if span is None else url[span[0]:span[1]]


def hide_url_password(url: str) -> str:
    """`url` (one setting's whole value) with its password as ***."""
    span = url_password_span(url)
    return url if span is None else f"{url[:span[0]]}***{url[span[1]:]}"


def hide_url_passwords(text: str) -> str:
    """Every URL's password in `text` (a message, a log line) as ***: each URL runs from its scheme to the next
    whitespace. A password holding whitespace is found only in a whole value (`hide_url_password`) or by
    `redact`, which knows it."""
    out, pos = [], 0
    for m in SCHEME.finditer(text):
        if m.start() < pos:
            continue
        end = next((i for i in range(m.end(), len(text)) if text[i].isspace()), len(text))
        out += [text[pos:m.start()], hide_url_password(text[m.start():end])]
        pos = end
    return "".join(out) + text[pos:]


def redact(text: str, *secrets: str | None) -> str:
    """`text` with each of `secrets` (a configured password, token, credential) and every URL password as ***."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, "***")
    return hide_url_passwords(text)


def _hidden(key: str, value: Any) -> Any:
    if value is None:
        return None
    if any(s in key for s in SECRET_KEYS):
        return "***"
    if isinstance(value, str):
        return hide_url_password(value)  # one setting, one URL: its password may hold anything, whitespace too
    if isinstance(value, dict):
        return {k: _hidden(str(k), v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hidden(key, v) for v in value]
    return value


def parse_duration_ms(value: str | int) -> int:
    """'30s', '5m', '1h', '250ms' or a number of milliseconds."""
    if isinstance(value, int):
        return value
    v = value.strip().lower()
    for suffix, factor in (("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000)):
        if v.endswith(suffix) and v[: -len(suffix)].replace(".", "", 1).isdigit():
            return int(float(v[: -len(suffix)]) * factor)
    if v.isdigit():
        return int(v)
    raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 5m, 250ms)")


def typed_table_rules(spec: str) -> list[tuple[re.Pattern[str], str]]:
    """`iceberg.tables` as (topic regex, table name pattern) pairs; ValueError naming the entry that is wrong."""
    rules = []
    for entry in (e.strip() for e in spec.split(";")):
        if not entry:
            continue
        regex, eq, pattern = entry.rpartition("=")
        if not eq or not regex or not pattern:
            raise ValueError(f"entry {entry!r}: write REGEX=NAMESPACE.TABLE_PATTERN")
        try:
            compiled = re.compile(regex)
        except re.error as exc:
            raise ValueError(f"entry {entry!r}: not a regular expression: {exc}") from None
        name = pattern.replace("{topic}", "t")
        if "{" in name or "}" in name or "." not in name.strip(".") or not all(name.split(".")):
            raise ValueError(f"entry {entry!r}: the table pattern must be NAMESPACE.NAME, with {{topic}} the only "
                             "placeholder")
        rules.append((compiled, pattern))
    if not rules:
        raise ValueError("no entry")
    return rules


def typed_table_name(pattern: str, topic: str) -> str:
    """The table of `topic` by its pattern: `{topic}` as the topic with every character other than a letter, a digit
    or _ as _ (a topic's dots would otherwise be namespaces)."""
    return pattern.replace("{topic}", re.sub(r"[^A-Za-z0-9_]", "_", topic))


def typed_table_for(rules: list[tuple[re.Pattern[str], str]], topic: str) -> str | None:
    """The typed table `topic` gets under `iceberg.tables` (parsed by `typed_table_rules`): the first rule whose regex
    matches the whole name; None for no rule and for internal topics (`__*`)."""
    if topic.startswith("__"):
        return None
    pattern = next((p for r, p in rules if r.fullmatch(topic)), None)
    return None if pattern is None else typed_table_name(pattern, topic)


class TableCollision(ValueError):
    """Two topics map to one typed table (`iceberg.tables`)."""


def typed_tables(rules: list[tuple[re.Pattern[str], str]], topics: Iterable[str],
                 key: Callable[[str], str] | None = None) -> dict[str, str]:
    """Each topic's typed table (`typed_table_for`); TableCollision naming both topics when two map to one table
    (`a-b` and `a.b`, both legal side by side, both become `a_b`; `Orders` and `orders` where the catalog compares
    names case-folded: `key`, the catalog's own comparison, `jobs.iceberg.catalog.name_key`): one table holds one
    topic's rows, or one topic's keys would delete the other's rows in upsert mode."""
    out: dict[str, str] = {}
    owner: dict[str, str] = {}
    for topic in sorted(set(topics)):
        table = typed_table_for(rules, topic)
        if table is None:
            continue
        if (other := owner.setdefault(key(table) if key else table, topic)) != topic:
            raise TableCollision(f"iceberg.tables: topics {other!r} and {topic!r} both map to table {table}; a "
                                 "typed table holds one topic (give one of them a rule of its own)")
        out[topic] = table
    return out


PARTITION_BY = ("partition", "hour(timestamp)", "day(timestamp)")


def partition_by_fields(spec: str) -> tuple[str, ...]:
    """`iceberg.partition.by` as its entries (`partition`, `hour(timestamp)`, `day(timestamp)`, comma-separated, in
    the order the table partitions by them); ValueError naming what is wrong."""
    entries = tuple(e.strip().lower().replace(" ", "") for e in spec.split(",") if e.strip())
    if not entries:
        raise ValueError("no entry (write e.g. `partition`, `day(timestamp)` or `partition,hour(timestamp)`)")
    for e in entries:
        if e not in PARTITION_BY:
            raise ValueError(f"entry {e!r}: not one of {', '.join(PARTITION_BY)}")
    if len(set(entries)) != len(entries) or {"hour(timestamp)", "day(timestamp)"} <= set(entries):
        raise ValueError("each entry at most once, and hour or day of the timestamp, not both")
    return entries
