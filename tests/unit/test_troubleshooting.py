"""docs/troubleshooting.md cannot drift from the code's messages (issue #21): every `## ` heading
is one error message in backticks, `<...>` marking what varies, and every fixed part of it must
still be written in the code's messages (string literals and f-strings of the shipped packages).
"""
from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

from tests.support.procs import REPO

PAGE = REPO / "docs" / "troubleshooting.md"
PACKAGES = ("core", "ctl", "drainer", "pump", "tso", "capture", "client", "spark_sink")
PLACEHOLDER = re.compile(r"<[^<>]+>")
# Messages are composed as "<file>: <table>: <problem>" from several literals; a fixed part is
# therefore checked piece by piece between placeholders and ": " joints.
JOINT = re.compile(r": ")
MIN_PIECE = 3
RUST_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _render(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        # {x!r} of a string prints it quoted: render it as the user sees it, '{}'.
        return "".join(v.value if isinstance(v, ast.Constant) else
                       "'{}'" if isinstance(v, ast.FormattedValue) and v.conversion == ord("r")
                       else "{}" for v in node.values)
    return None


@cache
def code_strings() -> tuple[str, ...]:
    """Every string literal and f-string (implicit concatenations joined, as Python does) of the
    shipped packages."""
    out = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                text = _render(node)
                if text:
                    out.append(text)
    # The native core's messages (native/src, Rust string literals) reach users too.
    for path in sorted((REPO / "native" / "src").rglob("*.rs")):
        out.extend(m.group(1) for m in RUST_STRING.finditer(path.read_text()))
    return tuple(out)


def headings() -> list[tuple[int, str]]:
    return [(n, line[3:].strip()) for n, line in enumerate(PAGE.read_text().splitlines(), 1)
            if line.startswith("## ")]


def missing_pieces(message: str, strings: tuple[str, ...]) -> list[str]:
    """The fixed parts of a heading's message that no code string contains."""
    pieces = [p.strip() for part in PLACEHOLDER.split(message) for p in JOINT.split(part)]
    return [p for p in pieces if len(p) >= MIN_PIECE and not any(p in s for s in strings)]


HEADINGS = headings()


def test_the_page_has_headings_of_messages() -> None:
    assert len(HEADINGS) >= 10
    for n, text in HEADINGS:
        assert re.fullmatch(r"`[^`]+`", text), (
            f"docs/troubleshooting.md:{n}: a heading is one message in backticks, got {text!r}")


@pytest.mark.parametrize("line,heading", HEADINGS, ids=[h for _, h in HEADINGS])
def test_every_heading_is_a_message_the_code_still_writes(line: int, heading: str) -> None:
    """Every fixed part of each heading's message is still in the code's messages."""
    missing = missing_pieces(heading.strip("`"), code_strings())
    assert not missing, (f"docs/troubleshooting.md:{line}: {heading}: no message in the code "
                         f"contains {missing}; update the page with the code")


def test_the_check_catches_a_message_that_drifted() -> None:
    """The check is not a formality: a reworded or invented message is caught."""
    strings = code_strings()
    assert missing_pieces("<file>: unknown key '<key>'", strings) == []
    assert missing_pieces("<file>: unknown setting '<key>'", strings) == ["unknown setting '"]
    assert missing_pieces("etcd <x>: totally unreachable", strings) == ["totally unreachable"]
