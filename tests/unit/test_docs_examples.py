"""Docs that cannot drift (issue #21): every TOML example in README.md and docs/*.md loads through
the real config classes, and every `sluice ...` command line in them names real commands and
real flags, checked against the parser that `sluice ... --help` prints (which is run too).

A ```toml block starts with a comment naming the config it shows — `# drainer.toml`,
`# pump.toml`, `# cluster.toml`, ... — or `# fragment of drainer.toml` for a part of one, which is
loaded merged into a minimal valid config of that kind. A drainer's `[to]` goes through the
config class of the sink its `sink = "..."` names, so sink examples are checked like the rest.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from sluice.core import config as cfgmod
from sluice.core.errors import ConfigError
from sluice.ctl import cluster_config as cc
from sluice.ctl import main as cli
from tests.support.procs import REPO, sluice_argv

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"^#\s*(?P<fragment>fragment of\s+)?(?P<name>[\w-]+)\.toml\b")
PROCESS_KINDS = tuple(cc.PROCESS_CONFIGS)          # tso, pump, drainer, capture, ctl
CONFIG_NAMES = (*PROCESS_KINDS, "cluster")
# What a fragment is merged into: the smallest config of that kind that loads.
MINIMAL: dict[str, dict[str, Any]] = {"drainer": {"sink": "file", "to": {"dir": "out"}}}
SHELL_LANGS = ("", "sh", "shell", "bash", "console")


@dataclasses.dataclass(frozen=True)
class Block:
    path: Path
    line: int            # of the opening fence, 1-based
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def code_blocks(path: Path) -> list[Block]:
    out, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        m = re.match(r"^\s*```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith("```"):
            j += 1
        out.append(Block(path, i + 1, m.group(1), "\n".join(lines[i + 1:j])))
        i = j + 1
    return out


ALL_BLOCKS = [b for path in DOCS for b in code_blocks(path)]
TOML_BLOCKS = [b for b in ALL_BLOCKS if b.lang == "toml"]


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_example(name: str, data: dict[str, Any], where: str, tmp: Path) -> Any:
    """Load a TOML example as the process (or `sluice cluster up`) would: ConfigError if not."""
    if name == "cluster":
        spec = cfgmod.from_dict(cc.ClusterSpec, data, where).check(where)
        ports: dict[str, int] = {}
        # The plan writes nothing; it validates every process config it derives (each
        # drainer's [to] through its sink's config class included).
        return cc.plan(spec, cc.Layout(tmp), lambda key: ports.setdefault(key, 20000 + len(ports)))
    return cc.validate(name, data, where)


def check_toml_block(block: Block, tmp: Path) -> Any:
    first = block.text.lstrip("\n").splitlines()[0] if block.text.strip() else ""
    m = MARKER.match(first)
    if m is None or m["name"] not in CONFIG_NAMES:
        raise AssertionError(
            f"{block.where}: a ```toml block must start with a comment naming its config "
            f"({', '.join(n + '.toml' for n in CONFIG_NAMES)}), e.g. '# drainer.toml', or "
            f"'# fragment of drainer.toml' for a part of one; got {first!r}")
    try:
        data = tomllib.loads(block.text)
    except tomllib.TOMLDecodeError as e:
        raise AssertionError(f"{block.where}: invalid TOML: {e}") from None
    name = m["name"]
    if m["fragment"]:
        base = dict(MINIMAL.get(name, {}))
        if "sink" in data:          # another sink: the minimal [to] belongs to the file sink
            base.pop("to", None)
        data = _merge(base, data)
    return load_example(name, data, f"{block.where} ({name}.toml)", tmp)


@pytest.mark.parametrize("block", TOML_BLOCKS, ids=[b.where for b in TOML_BLOCKS])
def test_every_toml_example_loads_through_its_config_class(block: Block, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ```toml example in the docs names its config and loads through that config's real
    class (a drainer's [to] through its sink's): an example that stops working fails here. An
    `env:NAME` secret the example names is set (to a dummy), as its reader is told to."""
    for name in re.findall(r'"env:([A-Za-z_][A-Za-z0-9_]*)"', block.text):
        monkeypatch.setenv(name, "example-secret")
    for name in re.findall(r'password-file\s*=\s*"([^"/]+)"', block.text):
        (tmp_path / name).write_text("example-secret\n")   # next to the example, as told
    monkeypatch.chdir(tmp_path)
    try:
        check_toml_block(block, tmp_path)
    except ConfigError as e:
        raise AssertionError(f"{block.where}: the example does not load: {e}") from None


def test_the_checker_refuses_a_wrong_or_unmarked_example(tmp_path: Path) -> None:
    """The checker is not a formality: the `[sink] / [sink.options]` form docs/mysql-sink.md
    used to show, a typo in [to], and a block that does not say which config it is all fail."""
    def block(text: str) -> Block:
        return Block(REPO / "docs" / "x.md", 1, "toml", text)
    with pytest.raises(ConfigError, match=r"key 'sink': expected str, got dict"):
        check_toml_block(block('# drainer.toml\n[sink]\nname = "mysql"\n\n[sink.options]\n'
                               'host = "127.0.0.1"\n'), tmp_path)
    with pytest.raises(ConfigError, match=r"\[to\] \(mysql sink\): unknown key 'hots'"):
        check_toml_block(block('# drainer.toml\nsink = "mysql"\n[to]\nhots = "h"\n'), tmp_path)
    with pytest.raises(ConfigError, match=r"\[to\] \(grpc sink\): unknown key 'dir'"):
        check_toml_block(block('# fragment of drainer.toml\nsink = "grpc"\n[to]\ndir = "x"\n'),
                         tmp_path)
    with pytest.raises(AssertionError, match="must start with a comment naming its config"):
        check_toml_block(block('sink = "mysql"\n'), tmp_path)
    with pytest.raises(ConfigError, match=r"\[\[drainers\]\]|drainer|unknown key 'hots'"):
        check_toml_block(block('# cluster.toml\n[[drainers]]\nname = "m"\nsink = "mysql"\n'
                               'to = { hots = "h" }\n'), tmp_path)
    assert check_toml_block(block('# fragment of drainer.toml\n[filter]\ndo-db = ["shop"]\n'),
                            tmp_path).filter.do_db == ["shop"]


# -- shell examples ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Command:
    where: str
    text: str


def _strip_comment(line: str) -> str:
    return re.split(r"\s#\s", line, maxsplit=1)[0].rstrip()


def sluice_commands(block: Block) -> list[Command]:
    """The `sluice ...` command lines of a shell block: in a transcript (lines starting with
    `$ `) only the prompted lines; otherwise every line running `sluice` (not output such as
    `sluice ctl: no pump ...`), with indented or backslash-continued lines joined on."""
    lines = block.text.splitlines()
    transcript = any(line.startswith("$ ") for line in lines)
    out: list[Command] = []
    joined: list[tuple[int, str]] = []
    for n, raw in enumerate(lines, start=block.line + 1):
        raw = _strip_comment(raw)
        if transcript:
            if raw.startswith("$ "):
                joined.append((n, raw[2:]))
            continue
        if joined and (raw[:1].isspace() or joined[-1][1].endswith("\\")):
            ln, prev = joined[-1]
            joined[-1] = (ln, prev.rstrip("\\") + " " + raw.strip())
        else:
            joined.append((n, raw))
    for n, line in joined:
        for segment in re.split(r";|&&", line):
            words = segment.split()
            if "sluice" not in words:
                continue
            rest = words[words.index("sluice") + 1:]
            if not rest or rest[0].endswith(":") or not re.match(r"^[a-z][\w|-]*$", rest[0]):
                continue        # output naming the program, or prose
            out.append(Command(f"{block.path.relative_to(REPO)}:{n}",
                               " ".join(words[words.index("sluice"):])))
    return out


COMMANDS = [c for b in ALL_BLOCKS if b.lang in SHELL_LANGS for c in sluice_commands(b)]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _tokens(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return text.split()


def resolve(command: Command) -> list[tuple[list[str], list[str]]]:
    """[(command path, flags used)] for each alternative of the command (`up|down`); raises
    AssertionError naming the doc line for an unknown command, subcommand or flag."""
    tokens = _tokens(command.text)[1:]
    results = []
    for top in tokens[0].split("|"):
        assert top in cli.COMMANDS, f"{command.where}: `sluice {top}` is not a command: {command.text}"
        parser, mod = cli.command_parser(top)
        assert mod is not None, f"{command.where}: `sluice {top}` is not part of this build"
        path, flags, settled, value_next = [top], [], False, False
        for raw in tokens[1:]:
            parts = [p.strip("[](),") for p in raw.strip("[](),").split("|")]
            used = [p for p in parts if p.startswith("-") and len(p) > 1]
            for part in used:
                flag = part.split("=", 1)[0]
                action = parser._option_string_actions.get(flag)
                assert action is not None, (
                    f"{command.where}: `sluice {' '.join(path)}` has no option {flag}: "
                    f"{command.text}")
                flags.append(flag)
                value_next = action.nargs != 0 and "=" not in part
            if used:
                continue
            if value_next:         # the value of the flag before: never a subcommand
                value_next = False
                continue
            token = parts[0] if len(parts) == 1 else "|".join(parts)
            subs = _subparsers(parser)
            if subs and not settled and re.fullmatch(r"[a-z][\w-]*(\|[a-z][\w-]*)*", token):
                names = token.split("|")
                missing = [n for n in names if n not in subs]
                assert not missing, (f"{command.where}: `sluice {' '.join(path)}` has no "
                                     f"subcommand {missing[0]!r}: {command.text}")
                path.append(names[0])
                parser = subs[names[0]]
                continue
            settled = True       # a positional argument or a placeholder: no more subcommands
        results.append((path, flags))
    return results


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_every_sluice_command_in_the_docs_names_real_commands_and_flags(command: Command) -> None:
    """Every `sluice ...` line in README.md and docs/*.md uses commands, subcommands and flags
    the CLI has: a renamed flag fails here, not in a user's terminal."""
    assert resolve(command)


def test_the_command_checker_refuses_unknown_flags_and_commands() -> None:
    """The command checker is not a formality: an unknown flag, subcommand or command fails."""
    for text, problem in (("sluice ctl pumps --no-such-flag", "has no option --no-such-flag"),
                          ("sluice cluster up|sideways", "has no subcommand 'sideways'"),
                          ("sluice ctl checkpoint shw d1", "has no subcommand 'shw'"),
                          ("sluice nonsense --help", "is not a command")):
        with pytest.raises(AssertionError, match=re.escape(problem)):
            resolve(Command("docs/x.md:1", text))
    # A value that looks like a subcommand is a value, not a subcommand.
    assert resolve(Command("docs/x.md:1", "sluice ctl --etcd pumps drainers")) == [
        (["ctl", "drainers"], ["--etcd"])]


@pytest.mark.timeout(240)
def test_help_runs_for_every_command_the_docs_show() -> None:
    """`sluice <command path> --help` runs (exit 0) for every command path the docs use, and
    lists every flag the docs use with it."""
    wanted: dict[tuple[str, ...], set[str]] = {}
    for command in COMMANDS:
        for path, flags in resolve(command):
            wanted.setdefault(tuple(path), set()).update(flags)
    assert len(wanted) >= 10      # the docs show most commands; an extraction bug shows here
    for path, flags in sorted(wanted.items()):
        r = subprocess.run(sluice_argv(*path, "--help"), capture_output=True, text=True,
                           timeout=60, cwd=REPO)
        assert r.returncode == 0, (path, r.stderr)
        for flag in flags:
            assert flag in r.stdout, (path, flag)
