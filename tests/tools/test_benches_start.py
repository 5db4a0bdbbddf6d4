"""Every bench in bench/ starts: its imports and arguments are whole (`--help`).

The benches are run by hand and quoted in the docs, not in CI, so a rename in the product
they import went unseen: bench/opcua_sessions.py imported `overhead.CONFIG` long after it
had become `config_text()`, and docs/plc.md still quoted it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.under_test import child_env

ROOT = Path(__file__).parents[2]
BENCHES = sorted(p.name for p in (ROOT / "bench").glob("*.py"))


def test_the_benches_are_found():
    assert len(BENCHES) >= 20 and "overhead.py" in BENCHES


@pytest.mark.parametrize("name", BENCHES)
def test_the_bench_starts(name):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / name), "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120,
                         env=child_env(ROOT / "tests"))
    assert out.returncode == 0 and "usage:" in out.stdout, (out.stdout[-500:],
                                                           out.stderr[-2000:])
