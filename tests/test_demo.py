"""`edgerun demo` (the README's main command) runs end to end and stops cleanly."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def test_demo_runs_and_reports(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path)}  # its own profile cache: a first run
    out = subprocess.run([sys.executable, "-m", "runtime.cli", "demo", "--duration", "25"],
                         capture_output=True, text=True, timeout=240, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert re.search(r"rung \d+/\d+ inspection/", text), text[-3000:]
    stored = re.search(r"results stored by the coordinator: (\d+); device offline \(clean "
                       r"shutdown\)", text)
    assert stored and int(stored.group(1)) > 50, text[-3000:]
