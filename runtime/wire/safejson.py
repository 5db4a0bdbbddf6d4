"""JSON from outside, parsed with limits: size, nesting depth, number range, valid text.

`json.loads` on hostile input can raise RecursionError (8 KB of `[`), build integers with
thousands of digits, accept NaN/Infinity (which no schema or SQLite column expects) and return
strings with lone surrogates (which SQLite refuses to bind). `loads` turns every one of those
into a `JsonRejected` naming the limit, and never raises anything else.
"""

from __future__ import annotations

import json
from typing import Any

MAX_BYTES = 1 << 20
MAX_DEPTH = 16
MAX_INT = 1 << 63  # |int| must be below this: fits SQLite's signed 64-bit integers


class JsonRejected(ValueError):
    """The input is not JSON we accept; the text says which limit it broke."""


def _no_constant(name: str) -> Any:
    raise JsonRejected(f"{name} is not a JSON number")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > 19:  # cheap check before int() builds a huge number
        raise JsonRejected(f"integer {text[:24]}... is out of range (|n| < 2^63)")
    value = int(text)
    if not -MAX_INT < value < MAX_INT:
        raise JsonRejected(f"integer {value} is out of range (|n| < 2^63)")
    return value


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise JsonRejected(f"number {text[:24]} overflows a double")
    return value


def _check_tree(obj: Any, max_depth: int, texts: bool = True) -> None:
    """Depth and (with `texts`) text checks, iteratively (a recursive walk would itself be
    the bug)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            if texts:
                _check_text(node)
        elif isinstance(node, dict | list):
            if depth > max_depth:
                raise JsonRejected(f"nested deeper than {max_depth} levels")
            if isinstance(node, dict):
                for k, v in node.items():
                    if texts:
                        _check_text(k)
                    stack.append((v, depth + 1))
            else:
                stack.extend((v, depth + 1) for v in node)


def _check_text(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise JsonRejected("string with a lone surrogate (not valid Unicode text)") from None


def loads(raw: bytes | str, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """Parse `raw` within the limits; raises JsonRejected (a ValueError) saying why not."""
    if len(raw) > max_bytes:
        raise JsonRejected(f"{len(raw)} bytes exceeds the {max_bytes}-byte limit")
    if isinstance(raw, bytes | bytearray):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise JsonRejected(f"not UTF-8 text: {e.reason} at byte {e.start}") from None
    else:
        _check_text(raw)  # a str may hold a lone surrogate as such (UTF-8 bytes cannot)
    # The C parser recurses once per bracket but guards it with the interpreter's recursion
    # limit, so very deep input is a RecursionError here, caught; the tree walk below then
    # enforces the real (much lower) depth limit.
    try:
        obj = json.loads(raw, parse_int=_int, parse_float=_float, parse_constant=_no_constant)
    except JsonRejected:
        raise
    except (ValueError, RecursionError, MemoryError) as e:
        raise JsonRejected(f"not JSON: {str(e)[:200]}") from None
    # The tree walk was a quarter of a coordinator's ingest: skip what cannot fail. After
    # the check above, a lone surrogate can only come from a `\u` escape; and nesting is
    # never deeper than the number of `{` and `[` in the text.
    escapes = "\\u" in raw
    if escapes or raw.count("{") + raw.count("[") > max_depth:
        _check_tree(obj, max_depth, escapes)
    return obj
