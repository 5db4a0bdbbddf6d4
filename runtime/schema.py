"""Typed TOML: turn a parsed TOML table into frozen dataclasses, validating once.

Every error names the file, the line (best effort: tomllib keeps no positions, so the
line is found by scanning the text for the key inside its table) and the dotted key,
and says what was expected. Unknown keys are errors: a typo in a config on a device that
runs unattended must not silently fall back to a default.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

T = TypeVar("T")


class ConfigError(ValueError):
    """A config or profile file is invalid; the message says where and why."""


def load_toml(path: Path, cls: type[T]) -> T:
    """Read `path` and validate it into `cls` (a dataclass)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e
    return build(cls, data, source=str(path), text=text)


def build(cls: type[T], data: dict[str, Any], source: str = "<config>", text: str = "") -> T:
    """Validate a mapping into dataclass `cls`; errors name `source` and the key."""
    return _build(cls, data, _Where(source, text, ()))


@dataclasses.dataclass(frozen=True)
class _Where:
    source: str
    text: str
    keys: tuple[str, ...]

    def child(self, key: str) -> _Where:
        return _Where(self.source, self.text, (*self.keys, key))

    def fail(self, msg: str) -> ConfigError:
        line = _find_line(self.text, self.keys)
        loc = f"{self.source}:{line}" if line else self.source
        key = ".".join(self.keys) or "(top level)"
        return ConfigError(f"{loc}: key '{key}': {msg}")


def _find_line(text: str, keys: tuple[str, ...]) -> int | None:
    """Line number of the last key of `keys` inside its table, or of the table itself."""
    if not text or not keys:
        return None
    table, key = keys[:-1], keys[-1]
    current: tuple[str, ...] = ()
    fallback = None
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        header = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?", line)
        if header:
            current = tuple(p.strip().strip('"') for p in header.group(1).split("."))
            if current == keys:
                fallback = fallback or no
            continue
        m = re.match(r'^"?([A-Za-z0-9_\-]+)"?\s*=', line)
        if m and m.group(1) == key and current == table:
            return no
    return fallback


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in get_args(tp))
    if origin in (list, tuple):
        (inner, *_) = get_args(tp) or (Any,)
        return f"list of {_type_name(inner)}"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "a table"
    if tp is type(None):
        return "nothing"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _convert(tp: Any, value: Any, where: _Where) -> Any:
    origin = get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise where.fail(f"expected a table, got {type(value).__name__} {value!r}")
        return _build(tp, value, where)
    if origin is Literal:
        if value not in get_args(tp):
            raise where.fail(f"expected {_type_name(tp)}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in get_args(tp):
            try:
                return _convert(arg, value, where)
            except ConfigError:
                continue
        raise where.fail(f"expected {_type_name(tp)}, got {value!r}")
    if origin is tuple or origin is list:
        if not isinstance(value, list):
            raise where.fail(f"expected {_type_name(tp)}, got {value!r}")
        (inner, *_) = get_args(tp)
        return tuple(_convert(inner, v, where.child(f"[{i}]")) for i, v in enumerate(value))
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise where.fail(f"expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise where.fail(f"expected an integer, got {value!r}")
        return value
    if tp is type(None):
        if value is not None:
            raise where.fail(f"expected nothing, got {value!r}")
        return None
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise where.fail(f"expected {_type_name(tp)}, got {value!r}")
        return value
    if tp is Any:
        return value
    raise TypeError(f"schema type {tp!r} is not supported")  # a bug in a schema, not user input


def _build(cls: Any, data: dict[str, Any], where: _Where) -> Any:
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise where.child(unknown[0]).fail(
            f"unknown key (known keys here: {', '.join(sorted(fields))})"
        )
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _convert(hints[name], value, where.child(name))
    try:
        obj = cls(**kwargs)
    except TypeError as e:  # a required key is missing
        raise where.fail(str(e)) from e
    check = getattr(obj, "validate", None)
    if check is not None:
        problem = check()
        if problem:
            key, msg = problem
            raise where.child(key).fail(msg)
    return obj


def to_dict(obj: Any) -> Any:
    """A dataclass tree as plain TOML/JSON-friendly values (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    return obj
