"""The docs' examples are true: every `tierproxy ...` command line in the code blocks of README and docs/ parses
with the real CLI parser, and every properties example parses with the real properties reader, with keys a
command knows and no note after a value (which Kafka's format would make part of it)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tierproxy.cli import build_parser
from tierproxy.config.propfile import TRAILING_COMMENT, read_properties
from tierproxy.config.sources import _normalize, all_keys

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
CLIENT_PREFIXES = ("security.", "sasl.", "ssl.", "bootstrap.servers")  # a --command-config: Kafka client keys


def _blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for page in PAGES for m in BLOCK.finditer(page.read_text())]


def _command_lines() -> list[str]:
    out = []
    for lang, body in _blocks():
        if lang not in ("", "sh", "bash"):
            continue
        for full in body.replace("\\\n", " ").splitlines():
            line = re.split(r"\s#", full, maxsplit=1)[0]  # a shell comment after the command
            at = line.find("tierproxy ")
            if at < 0 or (at > 0 and line[at - 1] not in " $(") or line.lstrip().startswith("#"):
                continue
            command = line[at:].split(")", 1)[0] if line[:at].endswith("$(") else line[at:]
            if " ... " not in f"{command} ":  # an elided line (`tierproxy tier ... --master`) is prose, not a command
                out.append(command)
    return out


COMMANDS = _command_lines()


def test_the_docs_have_command_examples_to_check() -> None:
    assert len(COMMANDS) >= 8, COMMANDS


@pytest.mark.parametrize("line", COMMANDS)
def test_each_command_line_parses(line: str) -> None:
    words = shlex.split(line, comments=True)
    try:
        build_parser().parse_args(words[1:])
    except SystemExit as exc:
        pytest.fail(f"docs: `{line}` does not parse (exit {exc.code})")


def _properties_blocks() -> list[str]:
    return [body for lang, body in _blocks() if lang == "properties" or body.startswith("# tierproxy.properties")]


def test_the_docs_have_properties_examples_to_check() -> None:
    assert len(_properties_blocks()) >= 5


@pytest.mark.parametrize("index", range(len(_properties_blocks())))
def test_each_properties_example_parses_with_known_keys(index: int, tmp_path: Path) -> None:
    body = _properties_blocks()[index]
    f = tmp_path / "example.properties"
    f.write_text(body)
    props = read_properties(f)
    assert props, body
    known = all_keys()
    for key, value in props.items():
        assert not TRAILING_COMMENT.search(value), f"docs: a note after the value of {key} would be part of it"
        assert key.startswith(CLIENT_PREFIXES) or _normalize(key) in known, f"docs: {key} is no command's key"


def test_every_relative_link_in_the_docs_leads_to_a_file() -> None:
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} → {target}")
    assert broken == []
