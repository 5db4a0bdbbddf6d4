"""power/box_energy.py: the box's energy per frame from stage CPU time and a meter (issue 23)."""

from __future__ import annotations

import math

import pytest

from power.box_energy import STAGES, BoxEnergy, Window, fit, meter_problem, per_frame
from power.sensors import SensorError

ALL = dict.fromkeys(STAGES, 0.001)  # 1 ms of CPU per stage per window


def test_the_estimate_counts_every_stage_and_the_idle_floor_share():
    # 10 windows of 1 s, 100 frames each, 1 ms CPU per stage: 8 ms x 2 W per CPU-second
    # = 16 mJ of stages over 100 frames = 0.16 mJ a frame; idle 3 W / 100 fps = 30 mJ a frame
    w = [Window(1.0, 100, ALL)] * 10
    r = per_frame(w, idle_w=3.0, w_per_cpu_s=2.0, source="estimated")
    assert r["stages_mj"]["infer"] == r["model_mj"] == pytest.approx(0.02)
    assert r["idle_mj"] == pytest.approx(30.0)
    assert r["box_mj"] == pytest.approx(30.16)
    assert r["source"] == "estimated" and r["split"] == "estimated" and r["reason"] is None


@pytest.mark.parametrize("windows, reason", [
    ([], "no frames"),
    ([Window(1.0, 0, ALL)] * 3, "no frames in the last 3 s"),
])
def test_nothing_to_measure_is_null_with_a_reason_never_zero(windows, reason):
    r = per_frame(windows, 3.0, 2.0, "estimated")
    assert r["box_mj"] is None and r["model_mj"] is None and r["idle_mj"] is None
    assert all(v is None for v in r["stages_mj"].values())
    assert reason in r["reason"]


def test_a_stage_without_counters_is_null_not_zero_and_named():
    cpu = {**ALL, "decode": None}
    r = per_frame([Window(1.0, 100, cpu)] * 3, 3.0, 2.0, "estimated")
    assert r["stages_mj"]["decode"] is None and r["stages_mj"]["capture"] == pytest.approx(0.02)
    assert r["unmeasured"] == ["decode"] and "decode" in r["reason"]


def _metered(floor_w, per_cpu, rates):
    """Windows of 1 s whose meter reads floor + per_cpu x CPU exactly."""
    out = []
    for fps in rates:
        cpu = {s: 0.0002 * fps for s in STAGES}  # 0.2 ms a stage a frame
        out.append(Window(1.0, fps, cpu, floor_w + per_cpu * sum(cpu.values())))
    return out


def test_a_meter_gives_the_box_and_the_regression_splits_it():
    w = _metered(4.0, 6.0, [50, 100, 150, 200, 250, 300])
    floor_w, per_cpu = fit(w)
    assert floor_w == pytest.approx(4.0) and per_cpu == pytest.approx(6.0)
    r = per_frame(w, idle_w=1.0, w_per_cpu_s=2.0, source="rapl")
    frames = 1050
    assert r["box_mj"] == pytest.approx(sum(x.meter_j for x in w) / frames * 1e3, rel=1e-3)
    assert r["stages_mj"]["infer"] == pytest.approx(6.0 * 0.0002 * 1e3, rel=1e-3)
    assert r["idle_mj"] == pytest.approx(4.0 * 6 / frames * 1e3, rel=1e-3)
    assert r["source"] == "rapl" and r["split"].startswith("rapl regression")


@pytest.mark.parametrize("rates, why", [
    ([100, 100, 100, 100, 100, 100], "did not vary"),
    ([50, 100, 150], "3 metered windows"),
])
def test_without_a_fit_the_split_is_the_estimate_and_says_why(rates, why):
    w = _metered(4.0, 6.0, rates)
    r = per_frame(w, idle_w=1.0, w_per_cpu_s=2.0, source="hwmon")
    assert r["box_mj"] == pytest.approx(sum(x.meter_j for x in w) / sum(rates) * 1e3,
                                        rel=1e-3)
    assert r["stages_mj"]["infer"] == pytest.approx(2.0 * 0.0002 * 1e3, rel=1e-3)
    assert why in r["split"]


def test_an_unphysical_fit_is_refused():
    w = _metered(-5.0, 6.0, [50, 100, 150, 200, 250, 300])  # a negative floor: other load
    assert "not physical" in fit(w)


@pytest.mark.parametrize("delta, t, bad", [
    (1.0, 1.0, None), (float("nan"), 1.0, "nan"), (-0.5, 1.0, "went back"),
    (5000.0, 1.0, "5000 W"), (float("inf"), 1.0, "inf"),
])
def test_meter_readings_are_validated(delta, t, bad):
    got = meter_problem(delta, t)
    assert (got is None) if bad is None else (bad in got)


class Meter:
    """A meter at the hardware boundary: a script of readings (a float, or an exception)."""

    source = "rapl"

    def __init__(self, script):
        self.script = list(script)

    def energy_j(self):
        x = self.script.pop(0)
        if isinstance(x, Exception):
            raise x
        return x


@pytest.mark.parametrize("script, why", [
    ([0.0, 5.0, SensorError("energy_uj: No such file")], "reading it failed"),
    ([0.0, 5.0, 4.0], "went back"),
    ([0.0, 5.0, float("nan")], "nan"),
    ([0.0, 5.0, *[5.0] * 10], "did not move in 10 windows"),
])
def test_a_meter_that_goes_away_or_reads_garbage_falls_back_to_the_estimate_with_an_event(
        script, why):
    events = []
    box = BoxEnergy(Meter(script), idle_w=3.0, w_per_cpu_s=2.0,
                    on_event=lambda t, s, f: events.append((t, s, f)))
    box.tick(1.0, 100, ALL)
    assert box.source == "rapl" and not events
    while not events:
        box.tick(1.0, 100, ALL)
    assert [e[0] for e in events] == ["energy_meter_lost"] and why in events[0][2]["error"]
    r = box.report()
    assert r["source"] == "estimated" and why in r["meter_lost"]
    box.tick(1.0, 100, ALL)  # from now on the estimate: a figure, never 0
    r = box.report()
    assert r["box_mj"] == pytest.approx(30.16) and math.isfinite(r["model_mj"])
    assert len(events) == 1  # said once


def test_no_meter_is_the_estimate():
    class Estimated:
        source = "estimated"

        def energy_j(self):
            raise AssertionError("the estimate's meter is not read")

    box = BoxEnergy(Estimated(), 3.0, 2.0, lambda *a: None)
    box.tick(1.0, 100, ALL)
    assert box.report()["box_mj"] == pytest.approx(30.16)


def test_sample_makes_windows_from_the_control_ticks_and_the_publisher_total():
    box = BoxEnergy(None, 3.0, 2.0, lambda *a: None)
    cpu = {s: 0.001 for s in STAGES if s != "publish"}
    totals = iter([5.0, 5.002, None])
    asked = []

    def publish():
        asked.append(1)
        return next(totals)

    box.sample(10.0, 0, cpu, publish)  # starts the first window
    assert box.report()["reason"].startswith("no frames")
    for k in range(1, 10):  # a fast (simulated) tick: accumulated, the publisher not read
        box.sample(10.0 + k * 0.1, 10, cpu, publish)
    assert len(asked) == 1
    box.sample(11.0, 10, cpu, publish)  # 1 s: the window closes with all 100 frames
    r = box.report()
    assert r["frames"] == 100 and r["window_s"] == 1.0 and len(asked) == 2
    assert r["stages_mj"]["publish"] == pytest.approx(0.002 * 2.0 / 100 * 1e3)
    assert r["stages_mj"]["infer"] == pytest.approx(0.010 * 2.0 / 100 * 1e3)
    box.sample(12.0, 100, cpu, publish)  # the publisher gone: publish unmeasured, not 0
    r = box.report()
    assert r["stages_mj"]["publish"] is None and "publish" in r["unmeasured"]


def test_named_threads_cpu_reads_a_live_thread_and_none_for_a_missing_one():
    import threading

    from power.cputime import named_threads_cpu_s

    go, done = threading.Event(), threading.Event()

    def spin():
        x = 0
        while not go.is_set():
            x += 1
        done.wait(5)

    t = threading.Thread(target=spin, name="box-energy-test")
    t.start()
    try:
        a = named_threads_cpu_s("box-energy-test")
        go.set()
        assert a is not None and a >= 0.0
    finally:
        done.set()
        t.join()
    assert named_threads_cpu_s("no-such-thread") is None


def test_a_serving_daemon_reports_every_stage_and_falls_back_when_its_meter_goes_away(
        tmp_path):
    # a real `edgerun serve` on folder frames, its box with a RAPL counter (the hardware
    # boundary: a file this test advances by ~5 W) that is then removed mid-run
    import threading
    import time

    import cv2
    from support.daemon_harness import Serve, events, last_health, write_config
    from support.waiting import wait

    from models import bundled
    from models.synthetic import samples

    if not (bundled() / "manifest.json").exists():
        pytest.skip("bundled model not built")
    folder = tmp_path / "inbox"
    folder.mkdir()
    zone = tmp_path / "sysfs" / "sys/class/powercap/intel-rapl/intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    (zone / "energy_uj").write_text("1000\n")
    stop = threading.Event()

    def hardware():
        uj = 1000
        while not stop.is_set() and zone.exists():
            uj += 250_000  # 5 W in 50 ms
            tmp = zone / ".e"
            tmp.write_text(f"{uj}\n")
            tmp.replace(zone / "energy_uj")
            time.sleep(0.05)

    hw = threading.Thread(target=hardware, daemon=True)
    hw.start()
    cfg = write_config(tmp_path, tmp_path / "cache",
                       source=f'kind = "folder"\npath = "{folder}"\nwatch = true')
    images = [s.image for s in samples(seed=5, count=20)]
    d = Serve(tmp_path, cfg)
    try:
        wait(d.ready, 120, "ready", d)
        for i in range(60):
            tmp = folder / f".f{i}.png"
            cv2.imwrite(str(tmp), images[i % len(images)])
            tmp.rename(folder / f"f{i:03d}.png")

        def box():
            h = last_health(d.outbox)
            return (h or {}).get("box_energy") or {}

        wait(lambda: box().get("frames", 0) > 0 and box().get("box_mj") is not None, 60,
             "a health message with the box's energy per frame", d)
        b = box()
        assert b["source"] == "rapl", b
        st = b["stages_mj"]
        for s in ("capture", "decode", "preprocess", "infer", "postprocess", "persist"):
            assert st[s] is not None and st[s] > 0, (s, b)
        assert st["publish"] is None and "publish" in b["unmeasured"]  # no broker here
        assert b["box_mj"] > b["model_mj"] > 0
        # the meter goes away: one event, the estimate from then on (never 0 mJ); the
        # "hardware" stops first, or its next write races the removal (Directory not empty)
        stop.set()
        hw.join(10)
        for f in zone.iterdir():
            f.unlink()
        zone.rmdir()
        wait(lambda: events(d.outbox, "energy_meter_lost"), 30, "energy_meter_lost", d)
        n = len(list(folder.glob("f*.png")))
        for i in range(n, n + 40):
            tmp = folder / f".f{i}.png"
            cv2.imwrite(str(tmp), images[i % len(images)])
            tmp.rename(folder / f"f{i:03d}.png")
        wait(lambda: box().get("source") == "estimated" and box().get("box_mj"), 60,
             "the estimated box energy after the meter went away", d)
        b = box()
        assert b["box_mj"] > 0 and b["model_mj"] > 0 and "meter_lost" in b
        assert len(events(d.outbox, "energy_meter_lost")) == 1
    finally:
        stop.set()
        assert d.stop() == 0
