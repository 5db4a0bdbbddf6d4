"""Sleeping across the stack: the suspend boundary (a fake sysfs tree), the plant while
suspended, a really stopped simulated process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from power.closed_loop import RunResult, run_load
from power.device import load_profile
from power.plant import Plant, ambient
from power.suspend import SimulatedSuspend, SuspendError, SysfsSuspend
from runtime.ladder import Rung

ROOT = Path(__file__).resolve().parents[1]


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
    assert s.problems() == []
    woke = s.suspend_for(299.2)
    assert (tmp_path / "sys/class/rtc/rtc0/wakealarm").read_text() == "+300\n"
    assert (tmp_path / "sys/power/state").read_text() == "mem\n"
    assert woke.asked_s == 299.2 and woke.early  # a plain file returns at once


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
    start = plant.s.battery_wh
    plant.suspend(plant.s.t + 3600)
    for _ in range(60):
        run_load(plant, rung, 5.0, 1.0, 60.0, res)
    assert res.good == 0
    assert plant.s.suspended_s == pytest.approx(3600)
    assert start - plant.s.battery_wh == pytest.approx(dev.states.suspended_w * 1.0)  # 1 h
    # a step across the wake time is split: the rest is awake at idle + load
    plant.suspend(plant.s.t + 30)
    before = plant.s.battery_wh
    plant.step(90.0, 0.0)
    assert plant.s.suspended_s == pytest.approx(3630)
    want = (dev.states.suspended_w * 30 + dev.power.idle_w * 60) / 3600
    assert before - plant.s.battery_wh == pytest.approx(want)
    assert not plant.suspended
    with pytest.raises(ValueError, match="cannot suspend"):
        Plant(load_profile("rpi5"), ambient("constant", 20.0)).suspend(100.0)


CHILD = textwrap.dedent("""
    import json, threading, time
    from power.device import load_profile
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
    woke = SimulatedSuspend(plant, speed=100.0).suspend_for(150.0)
    time.sleep(0.1)
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    print(json.dumps({"max_gap": max(gaps), "slept_s": woke.slept_s}), flush=True)
""")


def test_simulated_suspend_really_stops_the_process():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
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
    # every thread stood still for the sleep's wall-clock length (150 s / 100x = 1.5 s)
    assert out["max_gap"] >= 1.4
    assert out["slept_s"] >= 140


def test_simulated_suspend_refuses_a_board_that_cannot():
    plant = Plant(load_profile("rpi5"), ambient("constant", 20.0))
    with pytest.raises(SuspendError, match="cannot suspend"):
        SimulatedSuspend(plant, 100.0).suspend_for(10)
