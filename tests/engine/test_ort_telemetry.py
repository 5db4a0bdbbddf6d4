"""ONNX Runtime's own telemetry stays off in every edgerun process: no device id, no event cache
under the user's home, unless the operator asks for it (ORT_DISABLE_TELEMETRY=0)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.daemon_harness import TESTS, write_config
from support.under_test import child_env

ORT_DIR = Path(".cache/Microsoft/DeveloperTools/.onnxruntime")

# a fresh process: edgerun's package first (as every `edgerun` command starts), then a real
# ONNX Runtime session that runs once
SESSION = """
import os, sys
from pathlib import Path
import runtime
import numpy as np
import onnxruntime as ort
sys.path.insert(0, sys.argv[2])
from support.modelgen import tiny_cnn
path = tiny_cnn(Path(sys.argv[1]) / "tiny.onnx", hw=(32, 32))
s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
i = s.get_inputs()[0]
s.run(None, {i.name: np.zeros([d if isinstance(d, int) else 1 for d in i.shape], np.float32)})
print("ORT_DISABLE_TELEMETRY=" + os.environ.get("ORT_DISABLE_TELEMETRY", "<unset>"))
"""


def _env(home: Path, **extra: str) -> dict[str, str]:
    """A child's environment with HOME at `home` and no ORT_DISABLE_TELEMETRY inherited from
    this test process (which imported runtime, so it has it)."""
    env = child_env(**extra)
    if "ORT_DISABLE_TELEMETRY" not in extra:
        env.pop("ORT_DISABLE_TELEMETRY", None)
    # ONNX Runtime keeps its telemetry off by itself where CI is set (as CI's run sets it):
    # unset, the child is the field's process and the operator's "0" case shows ORT writing
    env.pop("CI", None)
    env["HOME"] = str(home)
    return env


def _files(home: Path) -> list[str]:
    return sorted(str(p.relative_to(home)) for p in home.rglob("*") if p.is_file())


@pytest.mark.parametrize("operator, written", [
    (None, False),  # edgerun's default: off
    ("1", False),
    ("0", True),  # the operator's own choice is kept: ORT writes (and this test sees it)
])
def test_ort_writes_nothing_under_home_unless_the_operator_asks(tmp_path, operator, written):
    home = tmp_path / "home"
    home.mkdir()
    extra = {} if operator is None else {"ORT_DISABLE_TELEMETRY": operator}
    out = subprocess.run([sys.executable, "-c", SESSION, str(tmp_path), str(TESTS)],
                         env=_env(home, **extra), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"ORT_DISABLE_TELEMETRY={operator or '1'}" in out.stdout
    ort_files = [f for f in _files(home) if f.startswith(str(ORT_DIR))]
    assert bool(ort_files) == written, ort_files


def _serve_until_ready(tmp_path: Path, home: Path) -> str:
    """`edgerun serve` (brokerless, its profile measured) with HOME at `home`, until ready;
    returns its log."""
    cfg = write_config(tmp_path, tmp_path / "cache")
    log = tmp_path / "daemon.log"
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--config", str(cfg)],
                            stdout=log.open("a"), stderr=subprocess.STDOUT,
                            env=_env(home) | {"PYTHONPATH": child_env(TESTS)["PYTHONPATH"]})
    try:
        deadline = time.monotonic() + 150
        while "ready in" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "not ready in 150 s"
            time.sleep(0.2)
        time.sleep(1.0)  # serving: results and health written
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return log.read_text(errors="replace")


@pytest.mark.timeout(240)
def test_serving_and_profiling_write_nothing_of_ort_under_home(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    _serve_until_ready(tmp_path, home)
    assert not (home / ORT_DIR).exists(), _files(home)


@pytest.mark.timeout(240)
def test_a_service_user_without_a_home_serves(tmp_path):
    missing = tmp_path / "no-such-home"
    text = _serve_until_ready(tmp_path, missing)
    assert "Traceback" not in text
    assert not missing.exists()
    assert os.path.isdir(tmp_path / "state")  # its state where the config says
