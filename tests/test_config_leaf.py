"""The leaves stay leaves: runtime/config/ imports only itself and the standard library,
power/ imports nothing of runtime/, and the backend protocol file loads almost nothing.

Read with ast (every import statement, at module level or inside a function), so an import
moved into a function to hide a dependency still counts. A failure names file:line.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = {"runtime", "power", "models", "firmware_config"}  # top-level packages we ship
# Importing the backend protocol loads runtime, runtime.engine, runtime.engine.backends and
# base itself; a few more would be a dependency creeping back into "the small protocol".
BASE_CLOSURE_MAX = 4


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, wherever it stands."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the file's package
                pkg = path.relative_to(ROOT).parent.parts
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join((*pkg, base) if base else pkg)
            found.append((node.lineno, base))
    return found


def offences(folder: str, allowed: typing.Callable[[str], bool]) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{line}: imports {mod}"
            for p in sorted((ROOT / folder).rglob("*.py"))
            for line, mod in imports(p) if not allowed(mod)]


def _stdlib_or(prefix: str) -> typing.Callable[[str], bool]:
    def ok(mod: str) -> bool:
        top = mod.split(".")[0]
        return top == "__future__" or top in sys.stdlib_module_names or mod == prefix \
            or mod.startswith(prefix + ".")
    return ok


def test_config_imports_only_itself_and_the_standard_library():
    assert offences("runtime/config", _stdlib_or("runtime.config")) == []


def test_power_imports_nothing_of_runtime():
    def ok(mod: str) -> bool:
        return mod.split(".")[0] != "runtime"
    assert offences("power", ok) == []


def test_the_scan_sees_function_level_imports(tmp_path, monkeypatch):
    """The check above cannot pass by accident: a hidden import is found, with its line."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "runtime" / "config").mkdir(parents=True)
    (tmp_path / "runtime" / "config" / "x.py").write_text(
        "import os\n\n\ndef f():\n    from runtime.frames import sources\n")
    assert offences("runtime/config", _stdlib_or("runtime.config")) == [
        "runtime/config/x.py:5: imports runtime.frames"]


def test_backend_protocol_loads_almost_nothing_of_the_project():
    code = ("import json, sys; import runtime.engine.backends.base; print(json.dumps(sorted("
            f"m for m in sys.modules if m.split('.')[0] in {sorted(PROJECT)!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    loaded = json.loads(out)
    assert len(loaded) <= BASE_CLOSURE_MAX, loaded


def test_bundled_models_is_where_the_models_package_is():
    import models
    from runtime.config.source import BUNDLED_MODELS

    assert BUNDLED_MODELS == models.ROOT


@pytest.mark.parametrize("name", ["onnxruntime", "openvino", "opencv"])
def test_each_backend_names_its_own_config_class(name):
    """[backends.<name>] is typed by the class the backend's own file names."""
    import importlib

    from runtime.config.backends import BackendsConfig
    from runtime.engine.backends import REGISTRY

    module, cls = REGISTRY[name]
    backend = getattr(importlib.import_module(module), cls)
    hints = typing.get_type_hints(BackendsConfig)
    assert hints[name] is backend.config_class
    assert dataclasses.is_dataclass(backend.config_class)
