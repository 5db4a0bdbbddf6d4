"""The coordinator store's rooms (ingest.py, reads.py, budget.py, pruning.py) behind one
transaction owner (store.py), read from the source with ast: a room opens no connection of its
own and touches no other room's private attributes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from runtime.coordinator import budget, ingest, pruning, reads, store, store_rows

ROOMS = (ingest, reads, budget, pruning, store_rows)
OWNER = store
# what opens a database connection: only dialect.py (opened by store.py) may
CONNECTS = {"sqlite3", "psycopg", "psycopg_pool"}


def _tree(module) -> ast.Module:
    path = Path(module.__file__)
    return ast.parse(path.read_text(), filename=str(path))


def private_reach(tree: ast.AST) -> list[str]:
    """`x._a._b` (a private attribute of a private attribute: another room's insides), and
    `x._a` where x is not `self` or `cls`, as "line: text"."""
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id in ("self", "cls"):
            continue
        out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def connects(tree: ast.AST) -> list[str]:
    """Imports of a database driver or of `open_dialect`, as "line: name"."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [f"{node.lineno}: {a.name}" for a in node.names
                    if a.name.split(".")[0] in CONNECTS]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in CONNECTS:
                out.append(f"{node.lineno}: {node.module}")
            out += [f"{node.lineno}: {a.name}" for a in node.names if a.name == "open_dialect"]
    return out


@pytest.mark.parametrize("room", (*ROOMS, OWNER), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_a_room_reaches_into_no_other_rooms_private_attributes(room):
    assert private_reach(_tree(room)) == []


@pytest.mark.parametrize("room", ROOMS, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_a_room_opens_no_connection_of_its_own(room):
    assert connects(_tree(room)) == []


def test_only_the_store_opens_the_dialect():
    assert [x.split(": ")[1] for x in connects(_tree(OWNER))] == ["open_dialect"]


@pytest.mark.parametrize(("source", "found"), [
    ("self._budget.admit(db, m)", []),
    ("self._budget._ratio = 2", ["1: self._budget._ratio"]),
    ("other._total", ["1: other._total"]),
    ("self._d.db", []),
    ("import sqlite3\nfrom runtime.coordinator.dialect import open_dialect", None),
])
def test_the_rules_see_what_they_are_about(source, found):
    tree = ast.parse(source)
    if found is None:
        assert connects(tree) == ["1: sqlite3", "2: open_dialect"]
    else:
        assert private_reach(tree) == found
