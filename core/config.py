"""TOML configuration: kebab-case keys mapped onto dataclasses, flags override the file.

Each process declares its config as a dataclass (nested dataclasses for TOML tables). Loading
checks every key and type and raises ConfigError with one line naming the file and the key, e.g.
`pump.toml: unknown key 'max-binlog-sise' in [storage] (did you mean 'max-binlog-size'?)`.

Secrets: a key named `password` (or ending in `-password`) may say `env:NAME` (the value of the
environment variable NAME) or `file:PATH` (the file's content, one trailing newline removed), so
TOML files, `--set` flags and process listings need not carry the secret. The value is resolved
at load time and never appears in an error message.
"""
from __future__ import annotations

import dataclasses
import difflib
import os
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from .errors import ConfigError

T = TypeVar("T")


def field_key(name: str) -> str:
    return name.replace("_", "-")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


class _Where:
    """Names the source of a key in error messages: the file, or `--set` for an override."""

    def __init__(self, file: str, overridden: set[tuple[str, ...]]) -> None:
        self.file, self.overridden = file, overridden

    def source(self, path: tuple[str, ...]) -> str:
        if any(path[:n] in self.overridden for n in range(1, len(path) + 1)):
            return f"{self.file} (--set {'.'.join(path)})" if self.file != "<defaults>" else "--set"
        return self.file

    def key(self, path: tuple[str, ...], shown: str) -> str:
        return f"{self.source(path)}: key '{shown}'"


def _show(path: tuple[str, ...]) -> str:
    """('storage', 'max-binlog-size') -> 'storage.max-binlog-size'; list items as [i]."""
    out = ""
    for part in path:
        out += part if part.startswith("[") or not out else "." + part
    return out


def _convert(value: Any, tp: Any, where: _Where, path: tuple[str, ...]) -> Any:
    origin = typing.get_origin(tp)
    what = where.key(path, _show(path))
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        errors = []
        for a in args:
            try:
                return _convert(value, a, where, path)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0])
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{what}: expected a table, got {type(value).__name__}")
        return _build(tp, value, where, path)
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list):
            raise ConfigError(f"{what}: expected a list, got {type(value).__name__}")
        return [_convert(v, item, where, (*path, f"[{i}]")) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{what}: expected a table, got {type(value).__name__}")
        _, vt = typing.get_args(tp) or (str, Any)
        return {k: _convert(v, vt, where, (*path, k)) for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, bool):
        raise ConfigError(f"{what}: expected an integer, got a boolean")
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{what}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    return value


def from_dict(cls: type[T], data: dict[str, Any], where: str) -> T:
    """Build cls from an already-parsed table (e.g. a sink's options), checked like `load`;
    `where` names the source in error messages."""
    return _build(cls, data, _Where(where, set()))


def _build(cls: type[T], data: dict[str, Any], where: _Where | str, path: tuple[str, ...] = ()) -> T:
    if isinstance(where, str):
        where = _Where(where, set())
    hints = typing.get_type_hints(cls)
    fields = {field_key(f.name): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    table = f" in [{_show(path)}]" if path else ""
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        f = fields.get(key)
        if f is None:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{where.source((*path, key))}: unknown key '{key}'{table}{hint}")
        if is_secret(f.name):
            value = resolve_secret(value, where.key((*path, key), _show((*path, key))))
        kwargs[f.name] = _convert(value, hints[f.name], where, (*path, key))
    for key, f in fields.items():
        if (f.name not in kwargs and f.default is dataclasses.MISSING
                and f.default_factory is dataclasses.MISSING):  # type: ignore[misc]
            raise ConfigError(f"{where.source((*path, key))}: missing required key '{key}'{table}")
    return cls(**kwargs)


SECRET_ENV, SECRET_FILE = "env:", "file:"


def is_secret(field_name: str) -> bool:
    return field_name == "password" or field_name.endswith("_password")


def resolve_secret(value: Any, what: str) -> Any:
    """`env:NAME` / `file:PATH` -> the secret; anything else unchanged. Errors never show it."""
    if not isinstance(value, str):
        raise ConfigError(f"{what}: expected a string (or env:NAME / file:PATH)")
    if value.startswith(SECRET_ENV):
        name = value[len(SECRET_ENV):]
        if name not in os.environ:
            raise ConfigError(f"{what}: environment variable {name!r} is not set")
        return os.environ[name]
    if value.startswith(SECRET_FILE):
        file = value[len(SECRET_FILE):]
        try:
            text = Path(file).read_text()
        except OSError as e:
            raise ConfigError(f"{what}: cannot read secret file {file!r}: {e.strerror}") from None
        return text[:-1] if text.endswith("\n") else text
    return value


def parse_override(text: str) -> tuple[list[str], Any]:
    """`storage.max-binlog-size=1024` -> (['storage', 'max-binlog-size'], 1024)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected key=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # a bare word is a string
    return key.strip().split("."), value


def merge_overrides(data: dict[str, Any], overrides: list[str]) -> set[tuple[str, ...]]:
    """Apply `key=value` overrides to data in place; returns the overridden key paths."""
    done: set[tuple[str, ...]] = set()
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text!r}: {part} is not a table")
        node[path[-1]] = value
        done.add(tuple(path))
    return done


def load(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Load `cls` from a TOML file (optional) with `key=value` overrides applied on top."""
    data: dict[str, Any] = {}
    name = str(path) if path else "<defaults>"
    if path:
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{name}: config file not found") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{name}: invalid TOML: {e}") from None
    overridden = merge_overrides(data, overrides or [])
    return _build(cls, data, _Where(name, overridden))


def dump_defaults(cls: type) -> dict[str, Any]:
    """The defaults of a config class as a TOML-shaped dict (docs/config.md, `--print-defaults`)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[field_key(f.name)] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            v = f.default_factory()  # type: ignore[misc]
            out[field_key(f.name)] = dump_defaults(type(v)) if dataclasses.is_dataclass(v) else v
    return out
