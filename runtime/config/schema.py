"""Typed TOML: turn a parsed TOML table into frozen dataclasses, validating once.

Every error names the file, the line (best effort: tomllib keeps no positions, so the
line is found by scanning the text for the key inside its table) and the dotted key,
and says what was expected. Unknown keys are errors: a typo in a config on a device that
runs unattended must not silently fall back to a default.
"""

from __future__ import annotations

import codecs
import dataclasses
import math
import os
import re
import stat
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

T = TypeVar("T")


class ConfigError(ValueError):
    """A config or profile file is invalid; the message says where and why."""


class ConfigAbsent(ConfigError):
    """A file the config names is not there, or cannot be looked at, yet (a mount not up, a
    model provisioned after the config): a restart may find it, so it is retried (exit 2)."""


class Absent(str):
    """A `validate` message about a file the config names that is not there (yet): the
    refusal it makes is a ConfigAbsent, not a ConfigInvalid."""


class ConfigInvalid(ConfigError):
    """A file was read and its content is refused (not UTF-8, not TOML, an unknown key, a
    value out of range): unlike a file that cannot be read yet, restarting cannot help until
    someone edits it, so the services exit with EX_CONFIG and systemd does not restart them."""


# dataclass field metadata of a field that is no key of its section (a value the program
# sets, e.g. `Constraints.frame`): a file naming it gets "unknown key", and to_dict leaves it out
NOT_A_KEY = {"config_key": False}


def keys_of(cls: Any) -> dict[str, dataclasses.Field]:
    """The fields of dataclass `cls` (or of an instance) that are keys of its section."""
    return {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("config_key", True)}


MAX_FILE_BYTES = 1 << 20  # a config or profile is a few KiB; anything near this is a mistake


def load_toml(path: Path, cls: type[T]) -> T:
    """Read `path` and validate it into `cls` (a dataclass). Every failure, whatever its
    cause (unreadable, not a file, not UTF-8, not TOML, invalid values), is a ConfigError
    naming the file and, where known, the line and key."""
    text = read_text(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        loc = f"{path}:{m.group(1)}" if m else str(path)
        raise ConfigInvalid(f"{loc}: not valid TOML: {e}") from e
    except RecursionError as e:  # tomllib recurses into nested arrays and inline tables
        raise ConfigInvalid(f"{path}: not valid TOML: nested too deeply") from e
    try:
        return build(cls, data, source=str(path), text=text)
    except (ConfigInvalid, ConfigAbsent):
        raise
    except ConfigError as e:
        raise ConfigInvalid(str(e)) from e
    except Exception as e:  # whatever else a hostile file provokes is still a config error
        raise ConfigInvalid(f"{path}: cannot be used: {type(e).__name__}: {e}") from e


def read_text(path: Path) -> str:
    """The UTF-8 text of a regular file of at most MAX_FILE_BYTES; ConfigError otherwise.

    Opened non-blocking and checked with fstat first, so a FIFO or a device node put in
    place of the file (`/dev/zero`) is refused instead of hanging or filling memory.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{path}: cannot read: it is a directory, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path}: cannot read: not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ConfigError(f"{path}: cannot read: {st.st_size} bytes, more than the "
                              f"{MAX_FILE_BYTES} a config may have")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from e
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{path}: cannot read: more than {MAX_FILE_BYTES} bytes")
    if data.startswith(codecs.BOM_UTF8):  # editors on Windows add one; harmless
        data = data[len(codecs.BOM_UTF8):]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        # the file was read: its bytes are what is refused, as for a TOML error
        raise ConfigInvalid(f"{path}:{line}: not UTF-8: byte {data[e.start]:#04x} at column "
                          f"{col} (save the file as UTF-8)") from e


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
        keys = self.keys
        while line is None and keys and re.fullmatch(r"\[\d+\]", keys[-1]):
            keys = keys[:-1]  # an entry of a list value: on its list's line
            line = _find_line(self.text, keys)
        loc = f"{self.source}:{line}" if line else self.source
        key = ".".join(self.keys) or "(top level)"
        kind = ConfigAbsent if isinstance(msg, Absent) else ConfigError
        return kind(f"{loc}: key '{key}': {msg}")


def _find_line(text: str, keys: tuple[str, ...]) -> int | None:
    """Line number of the last key of `keys` inside its table, or of the table itself."""
    if not text or not keys:
        return None
    table, key = keys[:-1], keys[-1]
    current: tuple[str, ...] = ()
    fallback = None
    seen: dict[tuple[str, ...], int] = {}  # [[array]] tables so far: entry i is key "[i]"
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        header = re.match(r"^\[\[?\s*([^\]]+?)\s*\]\]?", line)
        if header:
            current = tuple(p.strip().strip('"') for p in header.group(1).split("."))
            if line.startswith("[["):
                seen[current] = seen.get(current, -1) + 1
                current = (*current, f"[{seen[current]}]")
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
        # TOML has nan and inf literals; every range check (`x <= 0`, `0 <= x <= 1`) lets
        # nan through, and no setting means anything by them (a health interval of nan
        # sent one health message and then none; latency_ms = nan crashed the first health)
        if not math.isfinite(value):
            raise where.fail(f"expected a finite number, got {value!r}")
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
    fields = keys_of(cls)
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
        return {name: to_dict(getattr(obj, name)) for name in keys_of(obj)}
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    return obj
