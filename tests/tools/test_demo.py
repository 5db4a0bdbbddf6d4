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


def test_demo_runs_and_reports(tmp_path):
    xdg = tmp_path / "xdg-cache"  # the user's cache, as XDG_CACHE_HOME names it
    logs = xdg / "edgerun" / "demo"
    logs.mkdir(parents=True)
    for day in range(1, 7):  # six earlier demos' logs: the oldest two go, four stay
        (logs / f"daemon-2020010{day}-120000.log").write_text("old\n")
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CACHE_HOME": str(xdg)}
    # 20 s: the first step-down comes ~6 s in on a quiet host (10:32 simulated); the two
    # demos of tests/tools/test_lockstep.py, quiet and beside two CPU hogs, reach theirs in
    # 15-17 s together in CI. 40 s added only later hours at the lower rung, unchecked here.
    out = subprocess.run([sys.executable, "-m", "runtime.cli", "demo", "--duration", "20"],
                         capture_output=True, text=True, timeout=150, env=env)
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
    # stopped by --duration, with no terminal: it says so, as it does for a Ctrl-C
    assert "stopping (--duration 20 s reached): the daemon, then" in text, text[-3000:]
    # the summary: the hottest die against the trip, and simulated time on each rung, the
    # top rung (where it starts) among them
    peak = re.search(r"summary: (\S+) simulated .*; highest die ([\d.]+) °C, ([\d.]+) °C "
                     r"(under|over) the 78 °C trip; (\d+) critical trips", text)
    assert peak, text[-3000:]
    assert abs(78.0 - float(peak.group(2)) - float(peak.group(3))
               * (1 if peak.group(4) == "under" else -1)) < 0.06
    assert float(peak.group(2)) >= float(down.group(1))  # it got at least as hot as the step
    rungs = re.findall(r"^  rung (\d+)/(\d+) inspection/\S+: (\d+h\d\dm|\d+m|\d+s)$", text,
                       re.M)
    assert rungs and rungs[0][0] == rungs[0][1], text[-3000:]  # the top rung's time first
    log = re.search(r"daemon log: (\S+) \(the last 5 demos' logs are kept in (\S+); "
                    r"2 older removed\)", text)
    assert log and Path(log.group(2)) == logs, text[-3000:]
    assert sorted(p.name for p in logs.iterdir()) == [
        *(f"daemon-2020010{day}-120000.log" for day in range(3, 7)), Path(log.group(1)).name]
    with open(log.group(1)) as f:  # the daemon's log outlives the demo
        daemon_log = f.read()
    assert re.search(r"rung (\d+)/\1 -> ", daemon_log)
    # one choice line at start-up (the ladder was built, and logged, twice: issue 32)
    start = daemon_log.split("ready in", 1)[0]
    assert len(re.findall(r"edgerun.daemon: choice: ", start)) == 1, start[-3000:]


def test_demo_help_says_every_default():
    out = subprocess.run([sys.executable, "-m", "runtime.cli", "demo", "--help"],
                         capture_output=True, text=True, timeout=60, env=child_env())
    assert out.returncode == 0, out.stderr
    said = " ".join(out.stdout.split())  # argparse wraps lines
    for default in ("--duration DURATION seconds to run, then stop (default: 0, until Ctrl-C)",
                    "(default: rpi5)", "(default: cabinet)", "(default: 480)",
                    "(default: 10)", "(default: 100)"):
        assert default in said, out.stdout


@pytest.mark.parametrize(("health", "rung_of", "expected"), [
    # under the trip, three rungs, the top rung first whatever the order they came in
    ({"passive_trip_c": 78.0, "rungs": 3,
      "simulated": {"elapsed_s": 22245.0, "die_max_c": 77.94, "critical_trips": 0,
                    "rung_changes": 2, "rung_s": {"m/small@ort:CPU/t1": 45.0,
                                                  "m/fp32@ort:CPU/t1": 21600.0,
                                                  "m/mid@ort:CPU/t1": 600.0}}},
     {"m/fp32@ort:CPU/t1": 3, "m/mid@ort:CPU/t1": 2, "m/small@ort:CPU/t1": 1},
     ["summary: 6h10m simulated (up to the last health); highest die 77.9 °C, 0.1 °C under "
      "the 78 °C trip; 0 critical trips, 2 rung changes",
      "  rung 3/3 m/fp32: 6h00m", "  rung 2/3 m/mid: 10m", "  rung 1/3 m/small: 45s"]),
    # over the trip; a rung the live view never saw; time paused (no rung)
    ({"passive_trip_c": 70.0, "rungs": 2,
      "simulated": {"elapsed_s": 120.0, "die_max_c": 71.26, "critical_trips": 1,
                    "rung_changes": 0, "rung_s": {"m/a@x:CPU/t1": 100.0, "": 20.0}}},
     {}, ["summary: 2m simulated (up to the last health); highest die 71.3 °C, 1.3 °C over "
          "the 70 °C trip; 1 critical trips, 0 rung changes",
          "  no rung (paused): 20s", "  rung ?/2 m/a: 1m"]),
    # a daemon without the tally
    ({"passive_trip_c": 70.0, "simulated": {"elapsed_s": 1.0}}, {},
     ["summary: the device sent no simulated tally (an older daemon?)"]),
])
def test_summary_says_the_peak_against_the_trip_and_time_per_rung(health, rung_of, expected):
    from runtime.tools.demo import summary_lines

    assert summary_lines(health, rung_of) == expected


def test_keep_last_removes_the_oldest_logs_only(tmp_path):
    from runtime.tools.demo import keep_last

    names = [f"daemon-2024010{d}-000000.log" for d in range(1, 8)]
    for n in names:
        (tmp_path / n).write_text("x")
    (tmp_path / "notes.txt").write_text("mine")  # not a demo log: never touched
    gone = keep_last(tmp_path, "daemon-*.log", 5)
    assert [p.name for p in gone] == names[:2]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*names[2:], "notes.txt"])
    assert keep_last(tmp_path, "daemon-*.log", 5) == []


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


def test_a_terminal_that_went_away_does_not_stop_the_stop(monkeypatch):
    """`edgerun demo | head`, or an SSH session dropped: the first print after the reader
    left raises BrokenPipeError; the stop must still run to the end (the children stopped)."""
    from runtime.tools import demo

    class Gone:
        def write(self, _):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr("sys.stdout", Gone())
    demo.say("stopping: the daemon, then the coordinator, then the broker...", flush=True)
    demo.say("results stored by the coordinator: 12", flush=True)  # no longer raises
    import sys

    assert not isinstance(sys.stdout, Gone)
