"""`edgerun demo` (the README's main command) runs end to end and stops cleanly."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.under_test import child_env


@pytest.mark.timeout(300)  # 43 s on a loaded 2-core box (docs/testing-timing.md)
def test_demo_runs_and_reports(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path)}  # its own profile cache: a first run
    out = subprocess.run([sys.executable, "-m", "runtime.cli", "demo", "--duration", "40"],
                         capture_output=True, text=True, timeout=240, env=env)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert re.search(r"rung \d+/\d+ inspection/", text), text[-3000:]
    stored = re.search(r"results stored by the coordinator: (\d+); device offline \(clean "
                       r"shutdown\)", text)
    assert stored and int(stored.group(1)) > 50, text[-3000:] + _daemon_log_tail(text)
    # the governor acts in the shipped daemon: a step down, predicted before the 78 °C trip
    # (the first rung change is a step down, taken under the trip: the simulated board runs
    # in lockstep with the control loop, so a loaded machine slows it, never delays a tick;
    # tests/tools/test_lockstep.py runs it beside CPU hogs)
    down = re.search(r"rung -> \d+/\d+: .*\(([\d.]+) °C (rising|not falling) ", text)
    first = re.search(r"rung -> .*", text)
    assert down and first and first.start() == down.start(), text[-3000:]
    assert float(down.group(1)) < 78.0, text[-3000:]
    log = re.search(r"daemon log: (\S+)", text)
    with open(log.group(1)) as f:  # the daemon's log outlives the demo
        assert re.search(r"rung (\d+)/\1 -> ", f.read())


def _daemon_log_tail(text: str) -> str:
    """The kept daemon log's end: why a stop was not clean is there, not in the demo's output."""
    log = re.search(r"daemon log: (\S+)", text)
    try:
        with open(log.group(1)) as f:  # type: ignore[union-attr]
            return "\n--- daemon log ---\n" + f.read()[-4000:]
    except (AttributeError, OSError) as e:
        return f"\n(no daemon log: {e})"


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


def _kill_session(sid: int) -> None:
    """SIGKILL what is left of a failed run: every process of the session, since the demo
    puts the daemon and the broker in process groups of their own."""
    for pid in _session_members(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def sessions():
    """Session ids of demos a test started: whatever of them is still running at teardown
    (a failed test) is killed, so no daemon or broker outlives it."""
    sids: list[int] = []
    yield sids
    for sid in sids:
        _kill_session(sid)


def test_sigterm_stops_the_demo_and_everything_it_started(tmp_path, sessions):
    env = {**os.environ, "HOME": str(tmp_path)}
    p = subprocess.Popen([sys.executable, "-m", "runtime.cli", "demo", "--duration", "300"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         start_new_session=True)
    sessions.append(p.pid)
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
            _kill_session(p.pid)
    text = "".join(seen) + rest
    assert p.returncode == 0, text[-3000:]
    assert "results stored by the coordinator" in text, text[-3000:]
    deadline = time.monotonic() + 10
    while _session_members(p.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _session_members(p.pid)
    if left:
        _kill_session(p.pid)
    assert not left, f"left running after SIGTERM: {left}"


def test_ctrl_c_stops_everything_in_order_and_replies_are_verified(tmp_path, sessions):
    """One Ctrl-C (SIGINT to the terminal's whole foreground group) stops the daemon, the
    coordinator and the broker in that order: a clean goodbye, every result acked, no MQTT
    error, no crash report, no temp dir left. A `fleet send ... ping` while it runs comes back
    verified (the coordinator holds the device's key)."""
    env = {**os.environ, "HOME": str(tmp_path)}
    # its own session and group, as a shell puts a foreground job: killpg is the terminal's
    # Ctrl-C
    p = subprocess.Popen([sys.executable, "-m", "runtime.cli", "demo", "--duration", "300"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         start_new_session=True)
    sessions.append(p.pid)
    seen = []
    try:
        for line in p.stdout:
            seen.append(line)
            if re.search(r"rung \d+/\d+ inspection/", line):
                break
        text = "".join(seen)
        api = re.search(r"--api (\S+) --token-file (\S+) ls", text)
        assert api, text[-3000:]
        ping = subprocess.run([sys.executable, "-m", "runtime.cli", "fleet", "--api",
                               api.group(1), "--token-file", api.group(2), "send", "demo-box",
                               "ping", "--json"], capture_output=True, text=True, timeout=60,
                              env=env)
        assert ping.returncode == 0, ping.stdout + ping.stderr
        reply = json.loads(ping.stdout[ping.stdout.index("{"):])
        assert reply["verified"] is True and reply["ok"] is True, reply
        os.killpg(p.pid, signal.SIGINT)
        rest, _ = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            _kill_session(p.pid)
    text = "".join(seen) + rest
    assert p.returncode == 0, text[-3000:]
    assert re.search(r"results stored by the coordinator: \d+; device offline \(clean "
                     r"shutdown\)", text), text[-3000:] + _daemon_log_tail(text)
    assert re.search(r"device outbox: \d+ results made, every result acked", text), text[-3000:]
    assert "exited with code" not in text and "its log" not in text, text[-3000:]
    log = re.search(r"daemon log: (\S+)", text)
    with open(log.group(1)) as f:
        daemon_log = f.read()
    for said in (text, daemon_log):
        assert "Unspecified error" not in said and "Traceback" not in said, said[-3000:]
    workdir = Path(re.search(r"log: (\S+)/daemon\.log;", text).group(1))
    assert not workdir.exists(), f"{workdir} left behind"
    deadline = time.monotonic() + 10
    while _session_members(p.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = _session_members(p.pid)
    if left:
        _kill_session(p.pid)
    assert not left, f"left running after Ctrl-C: {left}"


def test_demo_without_any_broker_says_what_to_install(tmp_path):
    """Neither Mosquitto on PATH nor amqtt (the `[demo]` extra) importable: one line that
    names both ways out, exit 2, and nothing started."""
    # sys.modules[name] = None is how Python spells "not installed": `import amqtt` raises;
    # and no mosquitto on PATH nor in the sbin directories.
    code = ("import sys; sys.modules['amqtt'] = None; import runtime.wire.broker as b; "
            f"b.SBIN_DIRS = {str(tmp_path)!r}; from runtime.cli import main; "
            "sys.exit(main(['demo', '--duration', '5']))")
    env = child_env(PATH=str(tmp_path), HOME=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and out.stdout == "", out.stdout + out.stderr
    assert "apt install mosquitto" in lines[0] and "pip install '.[demo]'" in lines[0]
    assert list(tmp_path.iterdir()) == []  # no broker, no state, no daemon log


def test_demo_broker_lookup_finds_amqtt_off_path(tmp_path, monkeypatch):
    """A venv's bin/ is often not on PATH (`/opt/edgerun/venv/bin/edgerun demo`): amqtt
    counts when it imports, and starts through this interpreter, whatever PATH says."""
    pytest.importorskip("amqtt")
    from runtime.tools import demo
    from runtime.wire.broker import wait_port

    monkeypatch.setenv("PATH", str(tmp_path))
    assert demo.amqtt_available() and demo.broker_available()
    b = demo.EmbeddedBroker(tmp_path)
    b.device("demo", "box")
    b.start()
    try:
        wait_port(b.port, 5)
        assert b.proc.poll() is None
    finally:
        b.stop()


def test_mosquitto_in_sbin_counts_without_it_on_path(monkeypatch):
    """Debian and Raspberry Pi OS install mosquitto in /usr/sbin, which a normal user's PATH
    lacks: the demo must still use it, not ask to install it."""
    if not os.path.exists("/usr/sbin/mosquitto"):
        pytest.skip("mosquitto is not in /usr/sbin here")
    from runtime.tools import demo
    from runtime.wire.broker import mosquitto_path

    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin:/bin")  # Debian's default user PATH
    assert mosquitto_path() == "/usr/sbin/mosquitto"
    assert demo.broker_available()
