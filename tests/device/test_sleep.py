"""Sleeping across the stack: the suspend boundary (a fake sysfs tree), the plant while
suspended, a really stopped simulated process."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.under_test import child_env

from power.closed_loop import RunResult, run_load
from power.plant import Plant, ambient
from power.rungs import Rung
from power.suspend import SimulatedSuspend, SuspendError, SysfsSuspend
from runtime.coordinator import fleet
from runtime.device.profiles import load_profile

ROOT = Path(__file__).resolve().parents[2]


def fake_sysfs(root: Path, states: str = "freeze mem disk") -> SysfsSuspend:
    alarm = root / "sys/class/rtc/rtc0/wakealarm"
    alarm.parent.mkdir(parents=True)
    alarm.write_text("1700000000\n")  # an alarm armed by someone else: must be cleared
    state = root / "sys/power/state"
    state.parent.mkdir(parents=True)
    state.write_text(states + "\n")
    return SysfsSuspend(root)


def test_sysfs_suspend_arms_the_alarm_then_writes_mem(tmp_path):
    s = fake_sysfs(tmp_path)
    s.resume_s = 3.0  # the alarm fires early enough to be resumed by the deadline
    assert s.problems() == []
    woke = s.suspend_for(302.2)
    assert (tmp_path / "sys/class/rtc/rtc0/wakealarm").read_text() == "+300\n"
    assert (tmp_path / "sys/power/state").read_text() == "mem\n"
    assert woke.asked_s == 302.2 and woke.early  # a plain file returns at once


def test_sysfs_suspend_refuses_without_the_files_or_the_state(tmp_path):
    s = SysfsSuspend(tmp_path)
    problems = s.problems()
    assert len(problems) == 2 and "wakealarm does not exist" in problems[0]
    with pytest.raises(SuspendError, match="does not exist"):
        s.suspend_for(60)
    s = fake_sysfs(tmp_path / "b", states="freeze")
    assert s.problems() == [f"{s.state_path} offers ['freeze'], not 'mem'"]
    with pytest.raises(SuspendError, match="not 'mem'"):
        s.suspend_for(60)
    assert (tmp_path / "b/sys/power/state").read_text() == "freeze\n"  # nothing written


def test_an_alarm_that_cannot_be_armed_means_no_suspend(tmp_path):
    s = fake_sysfs(tmp_path)
    s.alarm_path.unlink()
    s.alarm_path.mkdir()  # exists, but writing fails
    with pytest.raises(SuspendError, match="cannot arm the wake alarm"):
        s.suspend_for(60)
    assert s.state_path.read_text().startswith("freeze")  # never suspended without an alarm


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write a read-only file")
def test_a_read_only_state_file_is_reported(tmp_path):
    s = fake_sysfs(tmp_path)
    s.state_path.chmod(0o444)
    assert any("not writable" in p for p in s.problems())


def test_plant_bills_suspended_power_and_infers_nothing():
    dev = load_profile("solar-node")
    plant = Plant(dev, ambient("constant", 20.0), battery_frac=0.5)
    rung = Rung("v", accuracy=0.9, latency_s=0.1, energy_j=0.5)
    res = RunResult("t")
    st = dev.states
    transition_wh = (st.suspend_j + st.resume_j - st.suspended_w * (st.suspend_s
                                                                   + st.resume_s)) / 3600
    start = plant.s.battery_wh
    plant.suspend(plant.s.t + 3600)
    for _ in range(60):
        run_load(plant, rung, 5.0, 1.0, 60.0, res)
    assert res.good == 0
    assert plant.s.suspended_s == pytest.approx(3600)
    assert start - plant.s.battery_wh == pytest.approx(st.suspended_w * 1.0 + transition_wh)
    # a step across the wake time is split: the rest is awake at idle + load
    before = plant.s.battery_wh
    plant.suspend(plant.s.t + 30)
    plant.step(90.0, 0.0)
    assert plant.s.suspended_s == pytest.approx(3630)
    assert plant.s.suspends == 2
    want = (st.suspended_w * 30 + dev.power.idle_w * 60) / 3600 + transition_wh
    assert before - plant.s.battery_wh == pytest.approx(want)
    assert not plant.suspended
    with pytest.raises(ValueError, match="cannot suspend"):
        Plant(load_profile("rpi5"), ambient("constant", 20.0)).suspend(100.0)


CHILD = textwrap.dedent("""
    import json, threading, time
    from runtime.device.profiles import load_profile
    from power.plant import Plant, ambient
    from power.suspend import SimulatedSuspend
    plant = Plant(load_profile("solar-node"), ambient("constant", 20.0), battery_frac=0.5)
    ticks = []
    def tick():
        while True:
            ticks.append(time.monotonic())
            time.sleep(0.01)
    threading.Thread(target=tick, daemon=True).start()
    time.sleep(0.2)
    print("sleeping", flush=True)
    woke = SimulatedSuspend(plant, speed=100.0).suspend_for(600.0)
    time.sleep(0.1)
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    print(json.dumps({"max_gap": max(gaps), "slept_s": woke.slept_s}), flush=True)
""")


def test_simulated_suspend_really_stops_the_process():
    env = child_env()
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True,
                         env=env, cwd=ROOT)
    try:
        assert p.stdout.readline().strip() == "sleeping"
        seen_stopped = False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and p.poll() is None:
            try:
                stat = Path(f"/proc/{p.pid}/stat").read_text()
            except OSError:
                break
            if stat.rsplit(")", 1)[1].split()[0] == "T":  # stopped by a signal
                seen_stopped = True
                break
            time.sleep(0.02)
        out = json.loads(p.stdout.readline())
        assert p.wait(10) == 0
    finally:
        if p.poll() is None:
            p.kill()
    assert seen_stopped
    # every thread stood still for the sleep's wall-clock length (600 s / 100x = 6 s) less
    # the helper's start-up (part of the sleep: the wake is at an absolute deadline; seconds
    # on this loaded machine)
    assert out["max_gap"] >= 3.0
    # the board slept exactly what was asked on the simulated clock, however long the host
    # took to stop and continue the process (lockstep, power/simclock.py)
    assert out["slept_s"] == pytest.approx(600.0, abs=1e-6)


def test_simulated_suspend_refuses_a_board_that_cannot():
    plant = Plant(load_profile("rpi5"), ambient("constant", 20.0))
    with pytest.raises(SuspendError, match="cannot suspend"):
        SimulatedSuspend(plant, 100.0).suspend_for(10)


# -- the coordinator's view of a sleeper (pure) ---------------------------------------------------

FCFG = fleet.FleetConfig(stale_after_s=30, offline_after_s=120, wake_margin_s=300)


def _state(t, online, **kw):
    return {"v": 1, "online": online, "boot": "b1", "t": t, **kw}


@pytest.mark.parametrize("events, now, status, codes", [
    # announced a sleep until t=1000: asleep, no alert, however long the silence before it
    ([("state", _state(0, True), 0), ("state", _state(10, False, asleep=True, wake_at=1000),
                                      10)], 900, "asleep", []),
    # still within the margin after the announced wake
    ([("state", _state(10, False, asleep=True, wake_at=1000), 10)], 1299, "asleep", []),
    # missed the wake by more than the margin: offline, one missed_wake alert
    ([("state", _state(10, False, asleep=True, wake_at=1000), 10)], 1301, "offline",
     ["missed_wake"]),
    # woke: its birth makes it online again
    ([("state", _state(10, False, asleep=True, wake_at=1000), 10),
      ("state", _state(1001, True), 1001)], 1010, "online", []),
    # woke and its traffic overtook the birth
    ([("state", _state(10, False, asleep=True, wake_at=1000), 10), ("activity", None, 1002)],
     1010, "online", []),
    # a plain will (connection lost) is still offline at once
    ([("state", _state(0, True), 0), ("state", _state(5, False, reason="connection lost"), 5)],
     6, "offline", ["offline"]),
    # a wake announced in the year 2286 (a clock gone wrong, a hostile state) is believed a
    # week from its arrival: then offline with missed_wake (was: asleep for ever)
    ([("state", _state(10, False, asleep=True, wake_at=1e10), 10)], 10 + 7 * 86400 + 299,
     "asleep", []),
    ([("state", _state(10, False, asleep=True, wake_at=1e10), 10)], 10 + 7 * 86400 + 301,
     "offline", ["missed_wake"]),
    # asleep=true without a wake time is not a sleep announcement
    ([("state", _state(5, False, asleep=True), 5)], 6, "offline", ["offline"]),
])
def test_fleet_view_of_a_sleeper(events, now, status, codes):
    v = fleet.DeviceView("d")
    for kind, msg, t in events:
        v = fleet.on_state(v, msg, t) if kind == "state" else fleet.on_activity(v, t)
    out = fleet.refresh({"d": v}, now, FCFG)["d"]
    assert out.status == status
    assert [c for c, _ in out.alerts] == codes


def test_status_text_names_the_next_wake():
    t = 1_700_000_000.0
    assert fleet.status_text("asleep", t) == (
        f"asleep (next wake {time.strftime('%H:%M', time.localtime(t))})")
    assert fleet.status_text("online", t) == "online"


# -- the daemon across real sleeps, with Mosquitto and the coordinator ----------------------------

def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "T"


@pytest.mark.skipif(not (ROOT / "models").exists(), reason="no models package")
def test_daemon_sleeps_announces_and_gets_commands_at_wake(tmp_path, broker):
    import shutil
    import socket
    import threading

    from support.daemon_harness import Serve, write_broker_config

    from models import bundled
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator
    from runtime.wire.commands import generate_keypair

    if not (bundled() / "manifest.json").exists():
        pytest.skip("bundled model not built")
    generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    coord = Coordinator(CoordinatorConfig(
        fleet="sys", broker=broker.coordinator("sys"), store=str(tmp_path / "coord.db"),
        signing_key=str(tmp_path / "k.pem"), device_keys=str(tmp_path / "keys"),
        wake_margin_s=30.0))
    coord.start()
    assert coord.connected.wait(30)
    cfg = write_broker_config(tmp_path, broker, tmp_path / "cache")
    text = cfg.read_text().replace('profile = "generic-x86"', 'profile = "solar-node"')
    # the synthetic camera offers frames per simulated second: 40 a wall second at 100x
    text = text.replace('kind = "synthetic"\nrate_hz = 40', 'kind = "synthetic"\nrate_hz = 0.4')
    text = text.replace("[telemetry]\n", f'[telemetry]\ntrusted_keys = ["{tmp_path / "k.pub"}"]\n')
    cfg.write_text(text + """
[simulator]
enabled = true
speed = 100.0
start_hour = 10.0
[sleep]
enabled = true
every_s = 600.0
burst = 2
flush_timeout_s = 10.0
""")
    # systemd's notify socket, to watch the watchdog being stretched and restored
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(0.2)
    notes: list[str] = []
    done = threading.Event()

    def listen():
        while not done.is_set():
            try:
                notes.append(sock.recv(4096).decode())
            except OSError:
                continue

    threading.Thread(target=listen, daemon=True).start()
    d = Serve(tmp_path, cfg, env={"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "4000000"})

    def until(cond, timeout_s, what):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if cond():
                return
            assert d.proc.poll() is None, d.text()[-3000:]
            time.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}\n{d.text()[-3000:]}")

    def row():
        return next((r for r in coord.fleet_view() if r["device"] == "box1"), None)

    try:
        until(lambda: (row() or {}).get("status") == "online", 180, "the device online")
        (tmp_path / "keys").mkdir()
        shutil.copy(tmp_path / "state" / "device.pub", tmp_path / "keys" / "box1.pub")
        until(lambda: (row() or {}).get("status") == "asleep", 60, "the first sleep")
        r = row()
        wake_at = r["wake_at"]
        assert wake_at > time.time()
        assert fleet.status_text(r["status"], wake_at).startswith("asleep (next wake ")
        # a command while it sleeps: queued at the broker, delivered at the wake
        reply = coord.send_command("box1", "set_rate", {"fps": 3})
        assert reply["status"] == "queued" and reply["deliver_at"] == wake_at, reply
        assert "asleep until" in reply["reason"]
        saw_stopped = False
        while row()["status"] == "asleep":
            codes = [c for c, _ in row()["alerts"]]  # no false offline alert (an SLO or
            assert not {"offline", "stale", "missed_wake"} & set(codes), codes  # hot may come)
            saw_stopped = saw_stopped or _stopped(d.proc.pid)
            time.sleep(0.05)
        assert saw_stopped, "the daemon process was never stopped during its sleep"
        until(lambda: row()["status"] == "online", 30, "the wake")
        until(lambda: any(e["type"] == "command_applied" and e.get("id") == reply["id"]
                          for e in coord.store.events("box1", 50)), 30,
              "the queued command applied after the wake")
        until(lambda: row()["health"].get("operator_rate_hz") == 3.0, 30,
              "health after the command")
        h = row()["health"]
        assert h["sleep"]["wakes"] >= 1 and h["sleep"]["mode"] == "sleep"
        assert h["mqtt"]["connects"] >= 2  # counted across the sleep's reconnect

        def caught_up():
            # The simulated board was suspended for the whole sleep, on the one simulated
            # clock: the wake moves it by exactly the sleep asked for (lockstep), so the
            # suspended time covers the sleep the daemon reports (to health's rounding,
            # 1e-4 h). The sleep's length is the period less what the start and the burst
            # took: compared with the sleep the daemon reports.
            h = row()["health"]
            return (h["simulated"]["suspends"] >= 1 and h["simulated"]["suspended_h"] * 3600
                    >= h["sleep"]["last_slept_s"] - 0.4 > 0)

        until(caught_up, 30, "the simulator's suspended time to cover the sleep")
        until(lambda: row()["status"] == "asleep", 60, "the second sleep")
    finally:
        code = d.stop()
        done.set()
    assert code == 0, d.text()[-3000:]
    results = coord.store.results("box1", 0, 100_000)
    coord.stop()
    results.sort(key=lambda r: r["seq"])
    seqs = [r["seq"] for r in results]
    # stored exactly once, nothing lost across the sleeps (the rest waits in the outbox)
    assert seqs == list(range(1, len(seqs) + 1))
    ts = [r["t"] for r in results]
    assert ts == sorted(ts)  # honest timestamps: the wall clock of each result's making
    gap = max(b - a for a, b in itertools.pairwise(ts))
    assert gap > 3.0  # nothing was inferred while asleep (~5.8 s of wall clock)
    usec = [int(n.split("WATCHDOG_USEC=")[1].split()[0]) for n in notes if "WATCHDOG_USEC" in n]
    assert usec[0] > 60_000_000 and usec[1] == 4_000_000, notes  # stretched, then restored


# -- configuration and the refusal to sleep on a board that cannot ------------------------------

def _fake_daemon(tmp_path, profile, **sleep):
    from types import SimpleNamespace

    from runtime.config import Config, DeviceConfig, SleepConfig

    events = []
    cfg = Config(device=DeviceConfig(profile=profile, sysfs_root=str(tmp_path)),
                 sleep=SleepConfig(enabled=True, **sleep))
    d = SimpleNamespace(cfg=cfg, device=load_profile(profile), sim=None,
                        event=lambda t, sev, **kw: events.append((t, sev, kw)))
    return d, events


@pytest.mark.parametrize("profile, tree, why", [
    ("rpi5", False, "device profile rpi5 cannot suspend"),
    ("solar-node", False, "wakealarm does not exist"),
    ("solar-node", True, ""),
])
def test_sleep_is_refused_loudly_where_the_board_cannot(tmp_path, profile, tree, why):
    from runtime.device import sleep as sleep_mod

    if tree:
        fake_sysfs(tmp_path)
    d, events = _fake_daemon(tmp_path, profile, every_s=300)
    s = sleep_mod.create(d.cfg, d, sleep_mod.Uplink(None, None, dict, print), d.sim)
    assert s is not None
    if why:
        assert why in s.disabled and "running awake" in s.disabled
        assert events[0][:2] == ("sleep_disabled", "critical")
        assert s.health()["mode"] == "disabled"
    else:
        assert s.disabled == "" and events == []
        assert s.suspender.resume_s == load_profile(profile).states.resume_s


@pytest.mark.parametrize("body, key", [
    ("enabled = true\n", "every_s"),
    ("enabled = true\nevery_s = 60\nper_hour = 10\n", "every_s"),
    ("enabled = true\nevery_s = 60\nmax_sleep_s = 10\n", "max_sleep_s"),
    ("enabled = true\nevery_s = 60\nmax_sleep_s = 700000\nsession_expiry_s = 800000\n",
     "max_sleep_s"),
    ("enabled = true\nevery_s = 60\nsession_expiry_s = 100\n", "session_expiry_s"),
])
def test_sleep_config_is_validated(tmp_path, body, key):
    from runtime.config import ConfigError, load

    p = tmp_path / "c.toml"
    p.write_text("[sleep]\n" + body)
    with pytest.raises(ConfigError, match=f"sleep.{key}"):
        load(p)


def test_fleet_ls_shows_the_next_wake():
    from runtime.coordinator import views

    t = 1_700_000_000.0
    row = {"device": "box1", "status": "asleep", "wake_at": t, "results_stored": 3,
           "health": {}, "choice": "m", "alerts": []}
    want = f"asleep (next wake {time.strftime('%H:%M', time.localtime(t))})"
    assert views.fleet_row(row, t - 60)["status"] == want
    assert want in views.fleet_table([row], width=200, now=t - 60)
    assert views.fleet_row({**row, "wake_at": "x"}, t)["status"] == "asleep"  # hostile value


# -- the sleeper's cycle against a fake daemon and a fake board ----------------------------------

class _Board:
    """A suspender that records the sleeps and moves the device clock across them."""

    def __init__(self, clock):
        self.clock, self.sleeps = clock, []

    def problems(self):
        return []

    def suspend_for(self, seconds):
        from power.suspend import Woke

        self.sleeps.append(seconds)
        self.clock["t"] += seconds
        return Woke(seconds, seconds)


def _cycle_daemon(every_s, burst=2, sources=("main",)):
    from types import SimpleNamespace

    from power import control
    from power.sensors import Reading
    from runtime.config import Config, SleepConfig
    from runtime.device.sleep import Sleeper
    from runtime.frames.multisource import Lane

    clock = {"t": 1000.0}
    notes, events, sent = [], [], []
    pipeline = SimpleNamespace(lanes=[Lane(n, open=lambda: None, state="running")
                                      for n in sources], rate_cap_hz=float("inf"))
    d = SimpleNamespace(
        cfg=Config(sleep=SleepConfig(enabled=True, every_s=every_s, burst=burst)),
        device=load_profile("solar-node"), sim=None, reading=Reading(clock["t"]),
        frame_rung=lambda: Rung("v", 0.9, 0.0004, 0.001), ccfg=None,
        cstate=control.ControlState(), pipeline=pipeline, publisher=None,
        outbox=SimpleNamespace(put=lambda *a: None, stats=lambda: {"results_held": 0}),
        notify=SimpleNamespace(watchdog_s=0.0, send=notes.append, status=notes.append),
        health=lambda: {"sleep": s.health()}, send_health=sent.append,
        event=lambda t, sev, **kw: events.append(t),
        sensors=SimpleNamespace(read=lambda: Reading(clock["t"])))
    board = _Board(clock)
    s = Sleeper(d.cfg.sleep, d, d, board)  # `d` is both what is served and the uplink

    def tick(dt=0.0):
        clock["t"] += dt
        d.reading = Reading(clock["t"])
        pipeline.rate_cap_hz = float("inf")  # what the control step set this tick
        s.after_control()

    d.sent = sent
    return s, d, board, tick, events


def test_sleeper_cycle_burst_deliver_sleep_warmup():
    s, d, board, tick, events = _cycle_daemon(600)
    tick()
    assert s.plan.mode == "sleep" and s.phase == "burst"
    assert d.pipeline.rate_cap_hz == float("inf")  # the burst runs at the control's rate
    d.pipeline.lanes[0].counters["results"] = 1
    tick(1.0)
    assert board.sleeps == []  # one of two inferences: not yet
    d.pipeline.lanes[0].counters["results"] = 2
    tick(1.0)
    # the burst took 2 s of the 600 s period: away until the next one is due
    assert board.sleeps == [pytest.approx(598.0)]
    assert events == ["sleeping", "woke"] and s.wakes == 1
    assert s.phase == "warmup" and s.health()["next_wake"] is None
    # the last health before the sleep names the wake, and goes where every health goes
    # (the outbox and the device's own history: `edgerun report --local` draws the sleep
    # from it; it went to the outbox alone, and the history never knew the node slept)
    [last] = d.sent
    assert last["sleep"]["next_wake"] == pytest.approx(time.time() + 598.0, abs=5)
    tick(0.5)
    assert d.pipeline.rate_cap_hz == 0.0  # the camera warms up: nothing captured
    tick(2.0)
    assert s.phase == "burst" and d.pipeline.rate_cap_hz == float("inf")


def test_a_burst_inspects_every_running_camera_before_the_sleep():
    s, d, board, tick, _ = _cycle_daemon(600, burst=2, sources=("a", "b", "dead"))
    a, b, dead = d.pipeline.lanes
    dead.state = "failed"  # being re-opened with backoff: it must not keep the box awake
    tick()
    a.counters["results"] = 3  # the fair queue served a more often: b has one of two
    b.counters["results"] = 1
    tick(1.0)
    assert board.sleeps == [] and s.phase == "burst"
    b.counters["results"] = 2
    tick(1.0)
    assert len(board.sleeps) == 1 and s.phase == "warmup"
    # staying up: the cap is the sources' total (each camera gets burst per period)
    s, d, board, tick, _ = _cycle_daemon(10, burst=1, sources=("a", "b"))
    tick()
    assert s.plan.mode == "stay_up" and d.pipeline.rate_cap_hz == pytest.approx(0.2)


def test_sleeper_stays_up_on_a_short_schedule_and_waits_out_a_long_cycle():
    s, d, board, tick, _ = _cycle_daemon(10, burst=1)
    tick()
    assert s.plan.mode == "stay_up" and d.pipeline.rate_cap_hz == pytest.approx(0.1)
    s, d, board, tick, _ = _cycle_daemon(600)
    tick()
    d.pipeline.lanes[0].counters["results"] = 2
    tick(595.0)  # the burst took almost the whole period: a sleep would cost more
    assert board.sleeps == [] and s.phase == "wait" and d.pipeline.rate_cap_hz == 0.0
    tick(6.0)  # the next period: a new burst
    assert s.phase == "burst" and d.pipeline.rate_cap_hz == float("inf")


def test_a_source_whose_model_failed_is_not_in_the_burst_plan():
    """A source refused at start (its own model failed, runtime/device/daemon.py) is never opened:
    the stay-up cap is the inspected sources' total, not one burst more (it was)."""
    s, d, _, tick, _ = _cycle_daemon(10, burst=1, sources=("a", "b"))
    d.pipeline.lanes[1].refused = "model 'x' cannot be used"
    tick()
    assert s.plan.mode == "stay_up" and d.pipeline.rate_cap_hz == pytest.approx(0.1)
