"""Which edgerun a test run exercises: this checkout, or (CI: `.ci/run` sets
EDGERUN_TEST_INSTALLED=1) the wheel installed into the run's venv.

Tests that start `python -m runtime.cli ...` take their environment from `child_env()`: it
puts the checkout on PYTHONPATH for a checkout run and leaves it off when the installed wheel
is under test, so those subprocesses import what ships too."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = os.environ.get("EDGERUN_TEST_INSTALLED") == "1"


def child_env(*first: str | Path, **extra: str) -> dict[str, str]:
    """os.environ for a subprocess that imports edgerun: PYTHONPATH starts with `first`
    (e.g. tests/ for a helper backend), then the checkout unless the installed wheel is under
    test; `extra` sets further variables."""
    paths = [str(p) for p in first]
    if not INSTALLED:
        paths.append(str(ROOT))
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    env = {**os.environ, **extra}
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env
