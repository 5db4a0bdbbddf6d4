"""Every file path and dotted module named in the code's docstrings and comments, the docs
and the README exists: a reference that no longer resolves sends a reader to nothing."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

from support.under_test import ROOT

# a path under one of the project's top-level folders, not inside a longer word or path
PATH = re.compile(
    r"(?<![\w/.-])((?:docs|runtime|power|bench|tests|firmware_config|models|systemd)/[\w./-]*\w)")
# a dotted name of three parts or more under a package (runtime.device.state.DeviceState);
# two parts are too often a config key (`power.idle_w`)
DOTTED = re.compile(r"(?<![\w./-])((?:runtime|power)(?:\.[A-Za-z_]\w*){2,})")


def _sources() -> list[Path]:
    return sorted([*ROOT.glob("runtime/**/*.py"), *ROOT.glob("power/**/*.py"),
                   *ROOT.glob("bench/*.py"), *ROOT.glob("docs/*.md"), ROOT / "README.md"])


def _module_exists(parts: list[str]) -> bool:
    """Whether `parts` names a module here or a name in one: the longest prefix that is a
    module is imported and the rest looked up in it."""
    for k in range(len(parts), 1, -1):
        rel = Path(*parts[:k])
        if (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file():
            obj: object = importlib.import_module(".".join(parts[:k]))
            for name in parts[k:]:
                if not _has(obj, name):
                    return False
                obj = getattr(obj, name, None)
            return True
    return False


def _has(obj: object, name: str) -> bool:
    """An attribute, a declared field, or an instance attribute a class's methods set."""
    if hasattr(obj, name) or name in getattr(obj, "__annotations__", {}):
        return True
    return inspect.isclass(obj) and f"self.{name} " in inspect.getsource(obj)


def _path_exists(ref: str) -> bool:
    """A file or folder; `a/b.py`'s `a/b.attr` form names an attribute of a module."""
    ref = ref.rstrip(".")
    if any(c in ref for c in "*{<"):  # a pattern, not a path
        return True
    if (ROOT / ref).exists():
        return True
    stem, _, _ = ref.rpartition(".")
    return bool(stem) and (ROOT / stem).with_suffix(".py").is_file()


def dangling(path: Path) -> list[str]:
    """The references in one file that resolve to nothing, as 'file:line: ref'."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{n}"
        out += [f"{where}: {m.group(1)}" for m in PATH.finditer(line)
                if not _path_exists(m.group(1))]
        out += [f"{where}: {m.group(1)}" for m in DOTTED.finditer(line)
                if not _module_exists(m.group(1).split("."))]
    return out


def test_every_named_path_and_module_exists():
    bad = [ref for path in _sources() for ref in dangling(path)]
    assert not bad, "references to nothing:\n" + "\n".join(bad)


def test_a_dangling_reference_is_found(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("see docs/no-such-page.md, docs/daemon.md, runtime.device.box.Box and "
                   "runtime.device.model_ladder.Box\n")
    assert [r.split(": ", 1)[1] for r in dangling(doc)] == [
        "docs/no-such-page.md", "runtime.device.box.Box"]
