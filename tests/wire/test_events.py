"""The event vocabulary (runtime/wire/events.py) is complete: every event type the product
code emits or matches is a member, and every member says what it reports.

The product code is read with ast, so an event written as a new string literal anywhere
(an `event("...")` call, an event dict `{"type": "...", "severity": ...}`, a power
`ControlEvent("...")`, a comparison with `ev["type"]`) fails here, naming file:line.
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from power.control import ControlEventType
from runtime.wire.events import MODEL_EVENTS, EventType

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("runtime", "power")
EMITTERS = {"event", "_event", "_on_event", "on_event"}  # callables taking a type or event dict


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _is_type_lookup(node: ast.expr) -> bool:
    """`ev["type"]` or `ev.get("type")`."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "type"
    return (isinstance(node, ast.Call) and _name(node.func) == "get" and bool(node.args)
            and isinstance(node.args[0], ast.Constant) and node.args[0].value == "type")


def _dict_type(node: ast.Dict) -> ast.expr | None:
    keys = {k.value: v for k, v in zip(node.keys, node.values, strict=True)
            if isinstance(k, ast.Constant)}
    return keys.get("type")


def used_types(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, type) of every event type a module names: string literals in an event
    position, and `EventType.NAME` references (as 'EventType.NAME')."""
    found: dict[int, tuple[int, str]] = {}  # by node: a dict in an emitter call is seen twice

    def take(node: ast.expr | None) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found[id(node)] = (node.lineno, node.value)
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            for e in node.elts:
                take(e)

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "EventType":
            found[id(node)] = (node.lineno, f"EventType.{node.attr}")
        elif isinstance(node, ast.Call) and node.args:
            first = node.args[0]
            if _name(node.func) in EMITTERS:
                take(_dict_type(first) if isinstance(first, ast.Dict) else first)
            elif _name(node.func) == "ControlEvent":
                take(first)
        elif isinstance(node, ast.Dict):
            keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
            if {"type", "severity"} <= keys:  # an event as a dict
                take(_dict_type(node))
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and any(
                "event" in ast.unparse(t) for t in node.targets):
            take(_dict_type(node.value))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_is_type_lookup(s) for s in sides):
                for s in sides:
                    take(s)
    return sorted(found.values())


ASGI = ("http", "lifespan", "websocket")  # ASGI scope and message types (wire/httpapp.py)


def unknown(tree: ast.AST, where: str) -> list[str]:
    values = {e.value for e in EventType}
    return [f"{where}:{line}: {t!r} is not in runtime/wire/events.py EventType"
            for line, t in used_types(tree)
            if not (t in values or t.startswith(ASGI) or (t.startswith("EventType.") and
                                    t.removeprefix("EventType.") in EventType.__members__))]


def product_files() -> list[Path]:
    return [p for top in PRODUCT for p in sorted((ROOT / top).rglob("*.py"))]


def test_every_event_type_the_product_names_is_in_the_vocabulary():
    problems = []
    for p in product_files():
        problems += unknown(ast.parse(p.read_text(), str(p)), str(p.relative_to(ROOT)))
    assert problems == []


def test_the_scan_finds_the_emitters():
    """The scan sees the product's emitters (so the test above is not vacuous): some in every
    converted module, literals where they remain (daemon.py, power)."""
    seen: dict[str, set[str]] = {}
    for p in product_files():
        for _, t in used_types(ast.parse(p.read_text())):
            seen.setdefault(str(p.relative_to(ROOT)), set()).add(t)
    for module, sample in [("runtime/frames/capture.py", "EventType.SOURCE_FAILED"),
                           ("runtime/telemetry/outbox.py", "EventType.OUTBOX_CORRUPT"),
                           ("runtime/device/ota.py", "EventType.MODEL_SWAPPED"),
                           ("runtime/coordinator/rollout.py", "EventType.MODEL_ROLLED_BACK"),
                           ("power/control.py", "physics_bounded")]:
        assert sample in seen.get(module, set()), (module, seen.get(module))
    every = set().union(*seen.values())
    named = {t.removeprefix("EventType.") for t in every}
    missing = [e for e in EventType if e.name not in named and e.value not in named]
    assert missing == [], f"members no product code names: {missing}"


@pytest.mark.parametrize(("source", "bad"), [
    ('d.event("rung_changd", "info")\n', "'rung_changd'"),
    ('self._event({"type": "frame_bda", "severity": "warning"})\n', "'frame_bda'"),
    ('x = {"type": "nope", "severity": "info", "detail": ""}\n', "'nope'"),
    ('ControlEvent("energyy", "warning", "")\n', "'energyy'"),
    ('if ev["type"] in ("governor", "sensor_hld"):\n    pass\n', "'sensor_hld'"),
    ('if ev.get("type") == "woken":\n    pass\n', "'woken'"),
    ('d.event(EventType.WOKEN, "info")\n', "'EventType.WOKEN'"),
])
def test_an_unknown_type_fails_naming_the_line(source, bad):
    (problem,) = unknown(ast.parse("\n" + source), "x.py")
    assert problem.startswith("x.py:2: " + bad)


def test_known_types_pass():
    assert unknown(ast.parse('d.event("woke", "info")\nd.event(EventType.WOKE)\n'
                             'x = {"type": "object", "properties": {}}\n'), "x.py") == []


def test_every_member_is_documented_and_named_for_its_value():
    for e in EventType:
        assert e.name == e.value.upper() and isinstance(e, str)
        assert len(e.doc) > 10, e


def test_power_names_only_vocabulary_types():
    assert set(typing.get_args(ControlEventType)) <= {e.value for e in EventType}


def test_model_events_are_what_a_rollout_reads():
    assert {e.value for e in MODEL_EVENTS} == {
        "model_deployed", "model_deploy_failed", "model_swapped", "model_probation_passed",
        "model_rolled_back"}
