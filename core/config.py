"""TOML configuration: kebab-case keys mapped onto dataclasses, flags override the file.

Each process declares its config as a dataclass (nested dataclasses for TOML tables). Loading
checks every key and type and raises ConfigError with one line naming the file and the key, e.g.
`pump.toml: unknown key 'max-binlog-sise' in [storage] (did you mean 'max-binlog-size'?)`.
"""
from __future__ import annotations

import dataclasses
import difflib
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


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        errors = []
        for a in args:
            try:
                return _convert(value, a, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0])
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {type(value).__name__}")
        return _build(tp, value, where)
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {type(value).__name__}")
        return [_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {type(value).__name__}")
        _, vt = typing.get_args(tp) or (str, Any)
        return {k: _convert(v, vt, f"{where}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, bool):
        raise ConfigError(f"{where}: expected an integer, got a boolean")
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    return value


def _build(cls: type[T], data: dict[str, Any], where: str) -> T:
    hints = typing.get_type_hints(cls)
    fields = {field_key(f.name): f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        f = fields.get(key)
        if f is None:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise ConfigError(f"{where}: unknown key '{key}'{hint}")
        kwargs[f.name] = _convert(value, hints[f.name], f"{where}: key '{key}'" if "key '" not in where
                                  else f"{where}.{key}")
    try:
        return cls(**kwargs)
    except TypeError as e:  # a required field is missing
        raise ConfigError(f"{where}: {e}") from None


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


def merge_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {text!r}: {part} is not a table")
        node[path[-1]] = value
    return data


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
    merge_overrides(data, overrides or [])
    return _build(cls, data, name)


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
