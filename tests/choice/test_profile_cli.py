"""`edgerun profile` as a new user meets it: a bundled model by name from any directory, a
progress bar on a terminal and plain lines when piped, an error that names the argument."""

from __future__ import annotations

import fcntl
import io
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

from support.under_test import child_env

from models import ROOT as MODELS
from runtime.choice.progress import Progress

FAST = ('[profiler]\nwarmup_runs = 1\nmin_runs = 3\nmax_runs = 20\ntime_budget_s = 0.02\n'
        'idle_baseline_s = 0.05\n[backends.onnxruntime]\nspinning = [false]\n'
        'include_default = false\n')
ARGS = ("--engine", "onnxruntime", "--threads", "1", "--latency-ms", "1000", "--json")


def _setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A config that measures briefly, and an environment whose user cache is empty."""
    cfg = tmp_path / "fast.toml"
    cfg.write_text(FAST)
    return cfg, child_env(XDG_CACHE_HOME=str(tmp_path / "cache"))


def test_a_bundled_model_by_name_from_any_directory_with_plain_lines_when_piped(tmp_path):
    cfg, env = _setup(tmp_path)
    elsewhere = tmp_path / "elsewhere"  # not the checkout: models/inspection is not here
    elsewhere.mkdir()
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "profile", "inspection",
                        "--config", str(cfg), *ARGS], cwd=elsewhere, capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert Path(doc["model"]) == MODELS / "inspection"
    n = len(doc["variants"])
    steps = re.findall(r"^\[(\d+)/(\d+)\] (\S+)$", r.stderr, re.M)  # a line each, in order
    assert [(int(i), int(of)) for i, of, _ in steps] == [(i, n) for i in range(1, n + 1)]
    assert "\r" not in r.stderr
    # the profile cache went to the user's cache (XDG_CACHE_HOME), keyed by content
    assert len(list((tmp_path / "cache" / "edgerun" / "profiles").glob("*.json"))) == n


def test_a_terminal_gets_one_progress_bar_not_a_line_per_variant(tmp_path):
    cfg, env = _setup(tmp_path)
    master, slave = pty.openpty()  # stderr a terminal, as a user's shell gives it
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # 120 columns
    p = subprocess.Popen([sys.executable, "-m", "runtime.cli", "profile", "defects",
                          "--config", str(cfg), *ARGS], cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=slave, env=env)
    os.close(slave)
    seen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                return
            if not chunk:
                return
            seen.extend(chunk)

    reader = threading.Thread(target=read)
    reader.start()
    out, _ = p.communicate(timeout=300)
    reader.join(30)
    os.close(master)
    text = seen.decode(errors="replace")
    assert p.returncode == 0, text[-3000:]
    n = len(json.loads(out)["variants"])
    assert not re.search(r"^\[\d+/\d+\] ", text, re.M), text[-3000:]  # no line per variant
    assert "\r" in text and "profiling" in text  # one line redrawn in place
    assert re.search(rf"\b{n}/{n}\b", text), text[-3000:]  # ... ending full


def test_a_missing_model_is_an_error_about_the_argument(tmp_path):
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "profile", "no-such-model"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=child_env())
    assert r.returncode == 2
    assert ("argument model: 'no-such-model': no such file or directory, nor a bundled "
            "model (defects, inspection)") in r.stderr, r.stderr
    assert "[model]" not in r.stderr and "Traceback" not in r.stderr


def test_progress_off_a_terminal_is_one_line_per_variant():
    out = io.StringIO()  # no terminal
    with Progress(out) as progress:
        for i in range(1, 4):
            progress(i, 3, f"m/v{i}")
    assert out.getvalue() == "[1/3] m/v1\n[2/3] m/v2\n[3/3] m/v3\n"


def test_progress_on_a_terminal_is_a_bar_that_ends_full():
    out = io.StringIO()
    with Progress(out, bar=True) as progress:
        for i in range(1, 108):
            progress(i, 107, f"m/v{i}")
    text = out.getvalue()
    assert "[1/107]" not in text and "\n" not in text.rstrip("\n")  # redrawn, never a line each
    assert "107/107" in text.split("\r")[-1] and "done" in text.split("\r")[-1]
