"""Build this checkout's wheel for a test, offline where the environment allows it.

`pip wheel --no-build-isolation` builds with the environment's own setuptools and needs no
index, but only where that setuptools meets pyproject's `[build-system] requires` and can
make wheels (setuptools 70.1+ on its own, older ones with the `wheel` package): the `test`
extra installs both. A fresh venv on Debian 12 has setuptools 65.5 and no `wheel`; there
pip builds in isolation instead, fetching setuptools from the index, and a failure says
which of the two to fix."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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


def build_wheel(out: Path) -> Path:
    """This checkout as a wheel in `out` (`pip wheel --no-deps`); returns its path."""
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)]
    if builds_offline():
        cmd.insert(4, "--no-build-isolation")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError(
            f"building the wheel failed ({' '.join(cmd)}):\n{r.stdout}{r.stderr}\n"
            "offline builds need pyproject's setuptools and `wheel` in this environment "
            "(pip install '.[test]'); otherwise pip needs the index for an isolated build")
    return next(out.glob("edgerun-*.whl"))
