"""The compiled validator (fastjsonschema, what `payloads.check` runs) against the interpreting
one (jsonschema Draft 2020-12, the reference and the writer of quarantine messages), on a
corpus made from SCHEMAS themselves: for every payload kind, a valid payload with every
declared field filled in, then hostile variants of it — each field replaced by wrong types,
huge and non-finite numbers, long and odd strings and nested junk, each field removed, an
extra key in every object, and junk at the top level. Both must agree on every payload.

The one known difference, kept on purpose (the compiled one is stricter, and check() refuses
whatever either refuses): `pattern` — the interpreter uses Python's `$`, which also matches
before one trailing newline, so it took an id "dev1\\n" that becomes a stored stream name or
a topic level; the compiled one anchors at the very end.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import fastjsonschema
import pytest

from runtime.wire import payloads

JUNK: tuple[Any, ...] = (
    None, True, False, 0, -1, 1, 1.5, -0.0, 2 ** 62, 2 ** 63 - 1, -(2 ** 63) + 1, 10 ** 30,
    1e308, -1e308, 5e-324, float("nan"), float("inf"), float("-inf"), "", "x", "x" * 5000,
    "dev1\n", "a b", "é", "\x00", [], [1, "a", None], [[[[[]]]]], {}, {"a": {"b": [1, {}]}},
    {"": None}, {"v": 1},
)


def _sample(schema: Any) -> Any:
    """A valid value of `schema` with every declared property present (and one undeclared
    member where the schema allows them)."""
    if schema is True or schema == {}:
        return {"free": [1, "two", None]}
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next(k for k in kind if k != "null")
    if kind == "object":
        out = {k: _sample(s) for k, s in schema.get("properties", {}).items()}
        extra = schema.get("additionalProperties", True)
        if extra is not False:
            out["extra_key"] = _sample(extra if isinstance(extra, dict) else {})
        return out
    if kind == "array":
        return [_sample(schema.get("items", {}))] * max(1, schema.get("minItems", 1))
    if kind == "string":
        if "pattern" in schema:
            return "dev-1_a.b"
        return "s" * max(1, schema.get("minLength", 1))
    if kind == "integer":
        return max(1, schema.get("minimum", 1))
    if kind == "number":
        lo, hi = schema.get("minimum", 0.25), schema.get("maximum", 1e9)
        return min(max(lo, 0.25), hi)
    if kind == "boolean":
        return True
    raise AssertionError(f"no sample for {schema}")


def _paths(obj: Any, path: tuple = ()) -> Iterator[tuple]:
    """Every path to a value inside obj (dict keys and list indexes)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield (*path, k)
            yield from _paths(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield (*path, i)
            yield from _paths(v, (*path, i))


def _at(obj: Any, path: tuple) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def _with(obj: Any, path: tuple, value: Any = None, delete: bool = False) -> Any:
    """A copy of obj with the value at `path` replaced (or deleted); only the containers on
    the path are copied (the rest is shared, never changed)."""
    if len(path) == 1:
        out = obj.copy()
        if delete:
            del out[path[0]]
        else:
            out[path[0]] = value
        return out
    out = obj.copy()
    out[path[0]] = _with(obj[path[0]], path[1:], value, delete)
    return out


def _corpus(kind: str) -> Iterator[tuple[str, Any]]:
    base = _sample(payloads.SCHEMAS[kind])
    yield "valid, every field", base
    required = payloads.SCHEMAS[kind].get("required", [])
    yield "valid, required only", {k: base[k] for k in required}
    for junk in JUNK:
        yield f"top level {junk!r:.40}", junk
    for path in _paths(base):
        for junk in JUNK:
            yield f"{path} = {junk!r:.40}", _with(base, path, junk)
        if isinstance(path[-1], str):
            yield f"{path} missing", _with(base, path, delete=True)
    for path in [(), *_paths(base)]:
        if isinstance(_at(base, path), dict):
            yield f"{path} + undeclared key", _with(base, (*path, "zz_undeclared"),
                                                     {"nested": ["junk", 1e308, None]})


def _only_trailing_newline(obj: Any) -> bool:
    """Whether obj holds a string ending in a newline (the known `pattern` difference)."""
    if isinstance(obj, str):
        return obj.endswith("\n")
    if isinstance(obj, dict):
        return any(_only_trailing_newline(v) for v in obj.values())
    if isinstance(obj, list):
        return any(_only_trailing_newline(v) for v in obj)
    return False


@pytest.mark.parametrize("kind", payloads.KINDS)
def test_compiled_and_interpreted_validators_agree(kind):
    compiled = fastjsonschema.compile(payloads.SCHEMAS[kind], use_default=False,
                                      use_formats=False)
    reference = payloads.interpreter(kind)
    n = stricter = refused = 0
    for name, obj in _corpus(kind):
        n += 1
        try:
            compiled(obj)
            fast_ok = True
        except fastjsonschema.JsonSchemaException:
            fast_ok = False
        slow_ok = not any(True for _ in reference.iter_errors(obj))
        if fast_ok != slow_ok:
            assert not fast_ok and _only_trailing_newline(obj), (
                f"{kind} {name}: compiled says {fast_ok}, jsonschema says {slow_ok}")
            stricter += 1
        if n % 5 == 0 or fast_ok != slow_ok:  # check() itself, on a fifth of the corpus
            with pytest.raises(payloads.PayloadError) if not fast_ok else _nothing():
                payloads.check(kind, obj)
        refused += not fast_ok
    assert n > 40 and refused > 20, (kind, n, refused)  # the corpus is not trivially small
    base = _sample(payloads.SCHEMAS[kind])
    before = copy.deepcopy(base)
    payloads.check(kind, base)  # the every-field sample itself is valid ...
    assert base == before  # ... and validating it changed nothing (no defaults filled in)


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return False


def test_an_id_with_a_trailing_newline_is_refused_with_its_path():
    """The interpreting validator alone took stream "s\\n" (Python's `$`): a stream name with a
    newline reached the store. check() now refuses it and says where."""
    msg = {"v": 1, "stream": "s\n", "boot": "b", "floor": 1,
           "results": [{"seq": 1, "t": 1.0}]}
    assert not list(payloads.interpreter("result").iter_errors(msg))  # the old behaviour
    with pytest.raises(payloads.PayloadError, match=r"result: at stream: .*pattern"):
        payloads.check("result", msg)


def test_refusals_still_name_the_field_and_its_path():
    """The compiled validator decides, the message is still the interpreter's: what and where."""
    msg = {"v": 1, "stream": "s", "boot": "b", "floor": 1,
           "results": [{"seq": 1, "t": 1.0}, {"seq": "2", "t": 1.0}]}
    with pytest.raises(payloads.PayloadError, match=r"^result: at results/1/seq: '2' is not "
                                                    r"of type 'integer'$"):
        payloads.check("result", msg)
    with pytest.raises(payloads.PayloadError, match=r"^health: at mqtt: Additional "
                                                    r"properties are not allowed"):
        payloads.check("health", {"v": 1, "t": 1.0, "boot": "b", "mqtt": {"nope": 1}})
    with pytest.raises(payloads.PayloadError, match=r"^ack: at \(top level\): 'seq' is a "
                                                    r"required property"):
        payloads.decode("ack", b'{"v": 1, "stream": "s", "from": 1}')


@pytest.mark.parametrize("raw", [
    b'"\\ud800"', b'{"\\udc00": 1}', b'{"a": ["x", {"b": "\\ud83d"}]}',  # lone surrogates
    b'"\\ud83d\\ude00"', b'"\\\\ud800"', b'{"a": "\\u00e9"}',  # a pair, an escaped \\, é
    "\"\ud800\"", "{\"a\": \"\udfff\"}",  # a str holding a lone surrogate as such
    b"[" * 16 + b"]" * 16, b"[" * 17 + b"]" * 17, b'{"a":' * 16 + b"1" + b"}" * 16,
    b'{"a":' * 17 + b"1" + b"}" * 17,
    b'{"a": "' + b"[" * 40 + b'"}',  # brackets inside a string are not nesting
    b'[' * 15 + b'"\\ud800"' + b']' * 15,  # deep and a surrogate
])
def test_safejson_shortcut_refuses_exactly_what_the_full_walk_refuses(raw):
    """safejson.loads skips the tree walk when no `\\u` escape and too few brackets make a
    failure impossible; it must refuse exactly what walking every node refuses."""
    import json

    from runtime.wire import safejson

    def reference(raw):
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        obj = json.loads(text)
        safejson._check_tree(obj, safejson.MAX_DEPTH)
        return obj

    try:
        want = ("ok", reference(raw))
    except safejson.JsonRejected as e:
        want = ("refused", str(e))
    try:
        got = ("ok", safejson.loads(raw))
    except safejson.JsonRejected as e:
        got = ("refused", str(e))
    assert got == want
