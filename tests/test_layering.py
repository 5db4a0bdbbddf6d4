"""The house rules of docs/architecture.md ("Layering"), read from the source with ast.

Every import statement counts, at module level, inside a function (an import moved into a
function to hide a dependency still counts) or under `if TYPE_CHECKING:` (a type-level
dependency is still two modules that must know each other); only the check of what importing a
module loads leaves the `TYPE_CHECKING` blocks out (they never run). An import names the
module it loads: `from a.b import c` is `a.b.c` when that is
a module, else `a.b`. A failure names the offending import as file:line.

- no import cycle among the product modules (runtime/, power/);
- runtime's packages (and its top-level modules) stand in one order, PACKAGE_ORDER: each imports
  only those below it, function-level imports included, so the packages form a DAG;
- power/ imports nothing of runtime/; runtime/config/ imports only itself and the standard
  library;
- the coordinator imports no device-only module, and the device side no coordinator module;
- `import runtime.cli` loads neither numpy nor cv2 (its early SIGHUP handler must be in place
  before anything slow is imported: tests/device/test_signals.py);
- importing the backend protocol (runtime/engine/backends/base.py) loads almost nothing;
- no product module over MAX_MODULE_LINES lines and no class over MAX_CLASS_LINES, but those
  in OVERSIZE, each with its reason (a failure names file:line and the size).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("runtime", "power")  # the packages whose modules the rules are about
PROJECT = {"runtime", "power", "models", "firmware_config"}  # top-level packages we ship
# Importing the backend protocol loads runtime, runtime.engine, runtime.engine.backends and
# base itself; a few more would be a dependency creeping back into "the small protocol".
BASE_CLOSURE_MAX = 4

# Modules only the device process runs (docs/architecture.md says why each is on this list):
# the frame path, the engine and the choice of variant, the power side, device telemetry,
# and the OTA steps that run on the device. runtime.ota.bundle (the signed bundle format) is
# shared on purpose: the coordinator checks and serves the bundles the devices install.
DEVICE_ONLY = ("runtime.device", "runtime.frames", "runtime.engine", "runtime.choice",
               "runtime.telemetry", "power", "runtime.ota.model_store", "runtime.ota.install",
               "runtime.ota.download", "runtime.ota.bundle_mqtt", "runtime.ota.probation")
COORDINATOR = ("runtime.coordinator",)
# The device side: the packages above, less the bundle format they share with the coordinator.
DEVICE_SIDE = ("runtime.device", "runtime.frames", "runtime.engine", "runtime.choice",
               "runtime.telemetry", "runtime.ota", "power")

# runtime's packages and top-level modules, and power/, from the top down: each may import only
# what stands in a later layer (never its own layer's others, never an earlier one). The entry
# point and the commands that reach across packages on top; the contract (wire) and the leaves
# at the bottom. docs/architecture.md ("Layering") says why each is where it is.
PACKAGE_ORDER: tuple[tuple[str, ...], ...] = (
    ("runtime.cli",),
    ("runtime.cli_profile", "runtime.cli_models"),
    ("runtime.cli_bundles", "runtime.tools"),
    ("runtime.coordinator", "runtime.device"),
    ("runtime.telemetry", "runtime.ota"),
    ("runtime.choice",),
    ("runtime.frames",),
    ("runtime.engine",),
    ("runtime.wire",),
    ("runtime.cli_types", "runtime.journal", "runtime.durable", "power"),
    ("runtime.config", "runtime"),
)

# Import edges (importer, imported) left out of the cycle check: none. (While the Daemon was
# split, runtime/device/ could hold entries here; nothing else may ever be allowlisted.)
ALLOWED_CYCLE_EDGES: set[tuple[str, str]] = set()

# Rooms by job: a module past this many lines, or a class past MAX_CLASS_LINES, holds more
# than one job (docs/architecture.md "Layering").
MAX_MODULE_LINES = 800
MAX_CLASS_LINES = 500
# The ones over the limit today, each with why it still is: "path" for a module, "path::Class"
# for a class. An entry that is no longer over fails too (remove it: the limit then holds).
OVERSIZE: dict[str, str] = {
    "runtime/telemetry/outbox.py": "the Outbox class below, most of the module",
    "runtime/telemetry/outbox.py::Outbox": "the durable outbox: the result log, the SQLite "
                                           "spill and the writes held on a full disk share one "
                                           "lock and one order of writes and syncs, which the "
                                           "rebuilt power-cut states and the kill storm check "
                                           "(tests/telemetry/test_log_crash_states.py, "
                                           "tests/device/test_kill_storm.py); split only with "
                                           "those rerun on every step",
}


def module_name(path: Path, root: Path) -> str:
    """`runtime/ota/store.py` -> `runtime.ota.store`; a package's `__init__.py` -> the package."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules(root: Path) -> dict[str, Path]:
    """Every module of the product packages under `root`, by name."""
    return {module_name(p, root): p for top in PRODUCT for p in sorted((root / top).rglob("*.py"))
            if "__pycache__" not in p.parts}


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING"))


def imports(path: Path, root: Path, known: typing.Collection[str] = (),
            top_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, wherever it stands, under
    `if TYPE_CHECKING:` too (with `top_level_only`, only those that run when the module is
    imported: not inside a function, not under `TYPE_CHECKING`). `from a.b import c` names
    `a.b.c` when that is one of the `known` modules, else `a.b`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[tuple[int, str]] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if top_level_only and _type_checking_only(child):  # never runs: its else does
                for sub in typing.cast(ast.If, child).orelse:
                    visit_one(sub)
            else:
                visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if top_level_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef
                                         | ast.Lambda):
            return
        if isinstance(node, ast.Import):
            found.update((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the file's package
                pkg = path.relative_to(root).parent.parts
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join((*pkg, base) if base else pkg)
            subs = {f"{base}.{a.name}" for a in node.names} & set(known)
            found.update((node.lineno, m) for m in (subs or {base}))
        visit(node)

    visit(tree)
    return sorted(found)


def graph(root: Path, top_level_only: bool = False) -> dict[str, list[tuple[int, str]]]:
    """Product module -> [(line, product module it imports)]."""
    mods = product_modules(root)
    return {name: [(line, m) for line, m in imports(p, root, mods, top_level_only)
                   if m in mods and m != name] for name, p in mods.items()}


def where(root: Path, mod: str, line: int) -> str:
    return f"{product_modules(root)[mod].relative_to(root)}:{line}"


def cycles(root: Path, allowed: set[tuple[str, str]]) -> list[list[str]]:
    """Each import cycle (strongly connected group of modules), as the imports inside it
    ("file:line: a imports b"); edges in `allowed` are left out."""
    g = {m: [(ln, d) for ln, d in es if (m, d) not in allowed] for m, es in graph(root).items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    groups: list[set[str]] = []

    def strong(v: str) -> None:  # Tarjan, iterative: deep chains do not hit the recursion limit
        work = [(v, iter(g[v]))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for _, w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(g[w])))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        group.add(w)
                        if w == node:
                            break
                    if len(group) > 1:
                        groups.append(group)

    for v in sorted(g):
        if v not in index:
            strong(v)
    return [sorted(f"{where(root, a, ln)}: {a} imports {b}"
                   for a in grp for ln, b in g[a] if b in grp) for grp in groups]


def offences(root: Path, importers: typing.Callable[[str], bool],
             forbidden: typing.Callable[[str], bool]) -> list[str]:
    """"file:line: imports m" for every import by a module `importers` accepts of a module
    (or library) `forbidden` accepts."""
    mods = product_modules(root)
    return [f"{p.relative_to(root)}:{line}: imports {m}"
            for name, p in mods.items() if importers(name)
            for line, m in imports(p, root, mods) if forbidden(m)]


def under(*prefixes: str) -> typing.Callable[[str], bool]:
    """Whether a module name is one of `prefixes` or inside one."""
    return lambda m: any(m == p or m.startswith(p + ".") for p in prefixes)


def package(module: str) -> str:
    """The unit PACKAGE_ORDER places a module in: `runtime.choice.selector` ->
    `runtime.choice`, a top-level `runtime.cli_types` -> itself, `power.rungs` -> `power`."""
    parts = module.split(".")
    return "power" if parts[0] == "power" else ".".join(parts[:2])


def against_the_order(root: Path, order: typing.Sequence[typing.Sequence[str]]) -> list[str]:
    """"file:line: a imports b" for every import (function-level ones included) from a
    package to one in its own layer or above it; a package the order lacks is named too."""
    layer = {pkg: i for i, names in enumerate(order) for pkg in names}
    g = graph(root)
    bad = sorted(f"{package(m)}: not in the package order" for m in g
                 if package(m) not in layer)
    return sorted(set(bad)) + [
        f"{where(root, a, ln)}: {a} imports {b}" for a, es in sorted(g.items()) for ln, b in es
        if package(a) != package(b) and package(a) in layer and package(b) in layer
        and layer[package(b)] <= layer[package(a)]]


def chain(root: Path, start: str, lib: str) -> list[str]:
    """The module-level imports by which importing `start` loads library `lib`
    (["file:line: a imports b", ...]; [] when none does)."""
    mods = product_modules(root)
    g = graph(root, top_level_only=True)
    seen: dict[str, list[str]] = {start: []}
    todo = [start]
    while todo:
        m = todo.pop(0)
        for line, lmod in imports(mods[m], root, mods, top_level_only=True):
            if lmod.split(".")[0] == lib:
                return [*seen[m], f"{where(root, m, line)}: {m} imports {lmod}"]
        for line, d in g[m]:
            if d not in seen:
                seen[d] = [*seen[m], f"{where(root, m, line)}: {m} imports {d}"]
                todo.append(d)
    return []


def oversize(root: Path, max_module: int, max_class: int) -> dict[str, str]:
    """Every product module over `max_module` lines and class over `max_class`, keyed as
    OVERSIZE is ("path", "path::Class"), each with "file:line: what, N lines (limit M)"."""
    found: dict[str, str] = {}
    for p in product_modules(root).values():
        rel, text = p.relative_to(root).as_posix(), p.read_text()
        lines = len(text.splitlines())
        if lines > max_module:
            found[rel] = f"{rel}:1: module, {lines} lines (limit {max_module})"
        for node in ast.walk(ast.parse(text, filename=str(p))):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > max_class:
                    found[f"{rel}::{node.name}"] = (f"{rel}:{node.lineno}: class {node.name}, "
                                                    f"{size} lines (limit {max_class})")
    return found


# -- the rules --------------------------------------------------------------------------------

def test_no_import_cycle_among_product_modules():
    assert cycles(ROOT, ALLOWED_CYCLE_EDGES) == []


def test_packages_import_only_those_below_them_in_the_order():
    assert against_the_order(ROOT, PACKAGE_ORDER) == []


def test_the_package_order_names_only_packages_that_exist():
    """A stale entry would keep a place for a package that left (and hide a rename)."""
    placed = {p for names in PACKAGE_ORDER for p in names}
    assert placed == {package(m) for m in product_modules(ROOT)}


def test_the_cycle_allowlist_is_only_the_daemon_split_and_still_needed():
    """Nothing outside runtime/device/ is allowlisted, and every entry is still a real import
    (a stale entry would hide the cycle it names when it came back)."""
    g = graph(ROOT)
    for a, b in ALLOWED_CYCLE_EDGES:
        assert under("runtime.device")(a) and under("runtime.device")(b), (a, b)
        assert b in {d for _, d in g[a]}, f"{a} no longer imports {b}: remove the entry"


def test_power_imports_nothing_of_runtime():
    assert offences(ROOT, under("power"), under("runtime")) == []


def test_config_imports_only_itself_and_the_standard_library():
    def forbidden(m: str) -> bool:
        top = m.split(".")[0]
        return not (top == "__future__" or top in sys.stdlib_module_names
                    or under("runtime.config")(m))
    assert offences(ROOT, under("runtime.config"), forbidden) == []


def test_the_coordinator_imports_no_device_only_module():
    assert offences(ROOT, under(*COORDINATOR), under(*DEVICE_ONLY)) == []


def test_the_device_side_imports_no_coordinator_module():
    assert offences(ROOT, under(*DEVICE_SIDE), under(*COORDINATOR)) == []


@pytest.mark.parametrize("lib", ["numpy", "cv2"])
def test_importing_the_cli_loads_no_numpy_or_cv2(lib):
    code = f"import sys, runtime.cli; print({lib!r} in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == "False", chain(ROOT, "runtime.cli", lib) or f"{lib} loaded (no static path)"
    assert chain(ROOT, "runtime.cli", lib) == []


def test_backend_protocol_loads_almost_nothing_of_the_project():
    code = ("import json, sys; import runtime.engine.backends.base; print(json.dumps(sorted("
            f"m for m in sys.modules if m.split('.')[0] in {sorted(PROJECT)!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    loaded = json.loads(out)
    assert len(loaded) <= BASE_CLOSURE_MAX, loaded


def test_no_module_or_class_over_its_size_but_those_allowed():
    """A new big room fails here: split it by job, or add it to OVERSIZE with why."""
    found = oversize(ROOT, MAX_MODULE_LINES, MAX_CLASS_LINES)
    assert sorted(v for k, v in found.items() if k not in OVERSIZE) == []


def test_every_oversize_entry_has_a_reason_and_is_still_over():
    """A stale entry would let the room it names grow back unseen."""
    found = oversize(ROOT, MAX_MODULE_LINES, MAX_CLASS_LINES)
    assert all(why.strip() for why in OVERSIZE.values())
    assert sorted(k for k in OVERSIZE if k not in found) == [], "no longer over: remove them"


# -- the checks can fail ----------------------------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    for top in PRODUCT:
        (tmp_path / top).mkdir(exist_ok=True)
        (tmp_path / top / "__init__.py").touch()
    return tmp_path


def test_a_function_level_cycle_is_found_with_its_lines(tmp_path):
    root = _tree(tmp_path, {
        "runtime/ota/__init__.py": "",
        "runtime/ota/store.py": "import os\n\n\ndef add():\n    from runtime.ota import bundle\n",
        "runtime/ota/bundle.py": "from runtime.ota.store import fsync_dir\n",
        "runtime/ota/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                "    from runtime.ota import store\n",
    })
    assert cycles(root, set()) == [[
        "runtime/ota/bundle.py:1: runtime.ota.bundle imports runtime.ota.store",
        "runtime/ota/store.py:5: runtime.ota.store imports runtime.ota.bundle"]]
    assert cycles(root, {("runtime.ota.store", "runtime.ota.bundle")}) == []


def test_a_type_level_cycle_is_found_with_its_lines(tmp_path):
    """A cycle closed by an import under `if TYPE_CHECKING:` is still a cycle: the two
    modules must know each other to be read or type-checked."""
    root = _tree(tmp_path, {
        "runtime/device/__init__.py": "",
        "runtime/device/state.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from runtime.device.host import Host\n",
        "runtime/device/host.py": "from runtime.device import state\n",
    })
    assert cycles(root, set()) == [[
        "runtime/device/host.py:1: runtime.device.host imports runtime.device.state",
        "runtime/device/state.py:3: runtime.device.state imports runtime.device.host"]]
    # what importing a module loads: the block never runs
    assert imports(root / "runtime/device/state.py", root, top_level_only=True) == [
        (1, "typing")]


def test_a_wrong_way_import_is_named(tmp_path):
    root = _tree(tmp_path, {
        "runtime/coordinator/__init__.py": "",
        "runtime/coordinator/enroll.py": "def f():\n    from runtime.telemetry import x\n",
        "runtime/telemetry/__init__.py": "",
        "runtime/telemetry/x.py": "",
        "runtime/config/__init__.py": "import numpy\n",
        "power/control.py": "from runtime.choice import ladders\n",
    })
    assert offences(root, under(*COORDINATOR), under(*DEVICE_ONLY)) == [
        "runtime/coordinator/enroll.py:2: imports runtime.telemetry.x"]
    assert offences(root, under("power"), under("runtime")) == [
        "power/control.py:1: imports runtime.choice"]
    assert offences(root, under("runtime.config"), lambda m: m == "numpy") == [
        "runtime/config/__init__.py:1: imports numpy"]


def test_an_import_against_the_package_order_is_named(tmp_path):
    root = _tree(tmp_path, {
        "runtime/engine/__init__.py": "",
        "runtime/engine/cli.py": "def f():\n    from runtime.ota import install\n",
        "runtime/ota/__init__.py": "",
        "runtime/ota/install.py": "from runtime.engine import cli\n",
        "runtime/ota/store.py": "",
        "runtime/wire/__init__.py": "",
        "runtime/wire/x.py": "from runtime.ota import store\n",
        "runtime/new/__init__.py": "",
    })
    order = (("runtime.ota",), ("runtime.engine", "runtime.wire"), ("runtime", "power"))
    assert against_the_order(root, order) == [
        "runtime.new: not in the package order",
        "runtime/engine/cli.py:2: runtime.engine.cli imports runtime.ota.install",
        "runtime/wire/x.py:1: runtime.wire.x imports runtime.ota.store"]


def test_the_chain_to_a_library_names_each_import(tmp_path):
    root = _tree(tmp_path, {
        "runtime/cli.py": "from runtime.choice import report\n\n\ndef f():\n    import cv2\n",
        "runtime/choice/__init__.py": "",
        "runtime/choice/report.py": "import json\nimport numpy as np\n",
    })
    assert chain(root, "runtime.cli", "numpy") == [
        "runtime/cli.py:1: runtime.cli imports runtime.choice.report",
        "runtime/choice/report.py:2: runtime.choice.report imports numpy"]
    assert chain(root, "runtime.cli", "cv2") == []  # inside a function: not at import


def test_an_oversize_module_and_class_are_named_with_their_lines(tmp_path):
    body = "    def f(self):\n        return 1\n" * 3
    root = _tree(tmp_path, {
        "runtime/small.py": "x = 1\n",
        "runtime/big.py": "import os\n\n\nclass Big:\n" + body + "\n" * 3 + "y = 2\n",
    })
    assert oversize(root, 12, 5) == {
        "runtime/big.py": "runtime/big.py:1: module, 14 lines (limit 12)",
        "runtime/big.py::Big": "runtime/big.py:4: class Big, 7 lines (limit 5)"}
    assert oversize(root, 14, 7) == {}
