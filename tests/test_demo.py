"""`edgerun demo` (the README's main command) runs end to end and stops cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time


def test_demo_runs_and_reports(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path)}  # its own profile cache: a first run
    out = subprocess.run([sys.executable, "-m", "runtime.cli", "demo", "--duration", "40"],
                         capture_output=True, text=True, timeout=240, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert re.search(r"rung \d+/\d+ inspection/", text), text[-3000:]
    stored = re.search(r"results stored by the coordinator: (\d+); device offline \(clean "
                       r"shutdown\)", text)
    assert stored and int(stored.group(1)) > 50, text[-3000:]
    # the governor acts in the shipped daemon: a step down, predicted before the 78 °C trip
    # (the first rung change is a step down, taken at or under the trip: predicted from the
    # trend on a quiet machine; a loaded one delays the ticks by a few simulated seconds)
    down = re.search(r"rung -> \d+/\d+: .*\(([\d.]+) °C (rising|not falling) ", text)
    first = re.search(r"rung -> .*", text)
    assert down and first and first.start() == down.start(), text[-3000:]
    assert float(down.group(1)) <= 78.5, text[-3000:]
    log = re.search(r"daemon log: (\S+)", text)
    with open(log.group(1)) as f:  # the daemon's log outlives the demo
        assert re.search(r"rung (\d+)/\1 -> ", f.read())


def _session_members(sid: int) -> list[int]:
    """Pids still alive in session `sid` (field 6 of /proc/PID/stat)."""
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                pids.append(int(d))
    return pids


def test_sigterm_stops_the_demo_and_everything_it_started(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-m", "runtime.cli", "demo", "--duration", "300"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         start_new_session=True)
    seen = []
    try:
        for line in p.stdout:  # wait for the first live line: broker, coordinator, daemon up
            seen.append(line)
            if re.search(r"rung \d+/\d+ inspection/", line):
                break
        p.send_signal(signal.SIGTERM)
        rest, _ = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    text = "".join(seen) + rest
    assert p.returncode == 0, text[-3000:]
    assert "results stored by the coordinator" in text, text[-3000:]
    deadline = time.monotonic() + 10
    while _session_members(p.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _session_members(p.pid)
    if left:
        os.killpg(p.pid, signal.SIGKILL)
    assert not left, f"left running after SIGTERM: {left}"
