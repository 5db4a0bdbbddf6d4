"""Build this checkout's wheel for a test, offline where the environment allows it.

`pip wheel --no-build-isolation` builds with the environment's own setuptools and needs no
index, but only where that setuptools meets pyproject's `[build-system] requires` and can
make wheels (setuptools 70.1+ on its own, older ones with the `wheel` package): the `test`
extra installs both. A fresh venv on Debian 12 has setuptools 65.5 and no `wheel`; there
pip builds in isolation instead, fetching setuptools from the index, and a failure says
which of the two to fix.

It builds from a clean copy of the checkout (git's files, tracked or new, never ignored
ones): setuptools reuses a `build/` folder left in the source tree, so a wheel built in place
can carry files that pyproject no longer ships, or modules since deleted."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _version(dist: str) -> tuple[int, ...] | None:
    try:
        text = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def builds_offline() -> bool:
    """Whether the running environment can build the wheel without build isolation: it has
    the setuptools pyproject asks for and a bdist_wheel command."""
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    have = _version("setuptools")
    for req in requires:
        m = re.fullmatch(r"setuptools\s*>=\s*([\d.]+)", req.strip())
        if m is None:  # a requirement this check does not know: let pip's isolation handle it
            return False
        if have is None or have < tuple(int(x) for x in m.group(1).split(".")):
            return False
    return have >= (70, 1) or importlib.util.find_spec("wheel") is not None


_BUILD_OUTPUTS = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__",
                                        ".venv", ".pytest_cache", ".ruff_cache")


def clean_copy(dest: Path) -> Path:
    """The checkout's files as a clean clone plus uncommitted work would have them, in
    `dest`: git's tracked and untracked-but-not-ignored files, or (no git) the tree without
    build outputs and caches."""
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "-co", "--exclude-standard"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0 or not r.stdout:
        shutil.copytree(ROOT, dest, ignore=_BUILD_OUTPUTS, symlinks=True)
        return dest
    for name in filter(None, r.stdout.split("\0")):
        src = ROOT / name
        if src.is_file():  # a deleted file git still tracks is not there to copy
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def build_wheel(out: Path) -> Path:
    """This checkout as a wheel in `out` (`pip wheel --no-deps`, from a clean copy, which
    stays in `out/src`); returns its path. CI has built it already and names it in
    EDGERUN_TEST_WHEEL (.ci/run): that one is used, the very file it installed."""
    src = clean_copy(out / "src")
    if built := os.environ.get("EDGERUN_TEST_WHEEL"):
        if not Path(built).is_file():
            raise AssertionError(f"EDGERUN_TEST_WHEEL={built}: no such file")
        return Path(shutil.copy2(built, out))
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)]
    if builds_offline():
        cmd.insert(4, "--no-build-isolation")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError(
            f"building the wheel failed ({' '.join(cmd)}):\n{r.stdout}{r.stderr}\n"
            "offline builds need pyproject's setuptools and `wheel` in this environment "
            "(pip install '.[test]'); otherwise pip needs the index for an isolated build")
    return next(out.glob("edgerun-*.whl"))
