"""Every path a log line takes reaches journald with its priority (issue 14, item 7): a
submodule's logger (named by module, not under `edgerun`), a library's `warnings.warn`, and
an exception that kills a thread — not only the `edgerun.*` loggers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from support.under_test import child_env

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import logging, sys, threading, warnings
from runtime import journal
from runtime.engine.backends import discover
from runtime.config import BackendsConfig

journal.setup(logging.INFO)
# a real submodule path: runtime.engine.backends warns (logger "runtime.engine.backends")
# that a plugin backend cannot be imported and is disabled
discover(BackendsConfig(enabled=(), plugins=("no_such_vendor_sdk:Backend",)))
warnings.warn("a library's runtime warning", RuntimeWarning)
t = threading.Thread(target=lambda: 1 / 0, name="worker-7")
t.start()
t.join()
logging.getLogger("power.sensors").info("still logging after the thread died")
"""


def _run(tmp_path: Path, on_journal: bool) -> list[str]:
    err = tmp_path / "stderr.txt"
    err.write_text("")
    st = os.stat(err)
    env = {k: v for k, v in child_env().items() if k != "JOURNAL_STREAM"}
    if on_journal:
        env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
    with err.open("w") as f:
        subprocess.run([sys.executable, "-c", SCRIPT], stderr=f, env=env, check=True,
                       timeout=120)
    return err.read_text().splitlines()


def test_every_path_carries_its_priority_on_the_journal(tmp_path):
    lines = _run(tmp_path, on_journal=True)
    assert lines and all(line[:3] in ("<2>", "<4>", "<6>") for line in lines), lines
    backend = [x for x in lines if "no_such_vendor_sdk" in x]
    assert backend and backend[0].startswith("<4>WARNING runtime.engine.backends: backend "), lines
    warned = [x for x in lines if "a library's runtime warning" in x]
    assert warned and warned[0].startswith("<4>WARNING py.warnings: "), lines
    died = [i for i, x in enumerate(lines) if "thread worker-7 died" in x]
    assert died and lines[died[0]].startswith("<2>CRITICAL edgerun: "), lines
    tb = lines[died[0]:]
    assert any(x == "<2>ZeroDivisionError: division by zero" for x in tb), tb
    assert lines[-1] == "<6>INFO power.sensors: still logging after the thread died"


def test_off_the_journal_python_writes_as_usual(tmp_path):
    lines = _run(tmp_path, on_journal=False)
    assert not any(re.match(r"<\d>", line) for line in lines), lines
    assert any(x.startswith("WARNING runtime.engine.backends: backend ") for x in lines), lines
    assert any("RuntimeWarning: a library's runtime warning" in x for x in lines), lines
    assert any(x.startswith("Exception in thread worker-7") for x in lines), lines
