"""The one simulated clock (power/simclock.py) and the lockstep board (runtime/device/simdevice.py):
the plant moves by exactly the time ticked, whatever the wall clock does."""

from __future__ import annotations

import threading

import pytest

from power.rungs import Rung
from power.simclock import Pace, SimClock
from runtime.device.profiles import load_profile
from runtime.device.simdevice import SimulatedDevice


class FakeWall:
    """The wall clock, moved by hand (the boundary the simulator paces against)."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# (speed, wall times at which ticks 1, 2, ... of 1 simulated s are reached, line per tick)
PACE_CASES = [
    # on pace: 10 ms a tick
    (100.0, [0.01, 0.02, 0.03], [None, None, None]),
    # late by under the slack: no line, and the next tick is due at once
    (100.0, [0.5, 0.51], [None, None]),
    # late by more than the slack: one line, then counted afresh from there (no sprint)
    (100.0, [1.5, 1.51, 1.52], ["slowed", None, None]),
    # still late after that: no second line
    (100.0, [1.5, 1.51, 4.0], ["slowed", None, None]),
    # slowed, then on pace for recover_s: one line back
    (1.0, [2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5], ["slowed", None, None, None, None, "back", None]),
]


@pytest.mark.parametrize("speed, walls, lines", PACE_CASES)
def test_pace_says_once_when_it_falls_behind_and_when_it_is_back(speed, walls, lines):
    p = Pace(speed, sim_t0=0.0, wall_t0=0.0, slack_s=1.0, recover_s=5.0)
    got = []
    for k, w in enumerate(walls, start=1):
        line = p.reached(float(k), w)
        got.append(None if line is None else ("slowed" if "slowed" in line else "back"))
    assert got == lines
    assert p.slowdowns == lines.count("slowed")


def test_pace_waits_for_early_ticks_and_rebases_after_a_fall_behind():
    p = Pace(100.0, sim_t0=0.0, wall_t0=0.0)
    assert p.due_in(1.0, 0.0) == pytest.approx(0.01)
    assert p.due_in(1.0, 0.5) == 0.0 and p.late_s(1.0, 0.5) == pytest.approx(0.49)
    p.reached(1.0, 3.0)  # 3 s behind: counted from here
    assert p.slowed and p.due_in(2.0, 3.0) == pytest.approx(0.01)
    assert p.speed_x() == pytest.approx(1 / 3)  # 1 simulated second in 3 wall seconds
    with pytest.raises(ValueError, match="speed must be > 0"):
        Pace(0.0, 0.0, 0.0)


def test_sim_clock_wakes_a_waiter_only_when_its_time_comes():
    clock = SimClock(0.0)
    assert clock.wait_until(0.0, 0.0)  # already there
    assert not clock.wait_until(5.0, 0.01)  # the wall timeout: nothing moved it
    got: list[bool] = []
    waiting = threading.Event()

    def wait() -> None:
        waiting.set()
        got.append(clock.wait_until(5.0, 30.0))

    th = threading.Thread(target=wait)
    th.start()
    waiting.wait(10)
    clock.advance_to(4.0)
    clock.advance_to(5.0)
    th.join(10)
    assert got == [True] and clock.now() == 5.0
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance_to(4.0)
    th = threading.Thread(target=lambda: got.append(clock.wait_until(50.0, 30.0)))
    th.start()
    clock.close()  # the end of the simulation releases whoever waits
    th.join(10)
    assert got == [True, False] and not th.is_alive()


def test_the_plant_moves_by_exactly_the_time_ticked_however_late_the_host_is(tmp_path):
    """Lockstep: two boards ticked the same way, one on a quiet host and one whose every
    tick comes late (a busy host), end in exactly the same state; only the pace differs."""
    dev = load_profile("rpi5")
    rung = Rung("v", accuracy=0.9, latency_s=0.004, energy_j=0.02)
    states = []
    for k, late in enumerate((0.0, 0.5)):
        wall = FakeWall()
        sim = SimulatedDevice(dev, tmp_path / str(k), "hot", 300.0, 8.0,
                              lambda: (rung, 200.0), 0.02, wall=wall)
        sim.start()
        for _ in range(600):
            wall.t += 2.0 / 300 + late  # the tick's due time, plus what the host adds
            sim.advance(2.0)
        assert sim.clock.now() == pytest.approx(sim.t0 + 1200.0)
        report = sim.report()
        assert report["elapsed_s"] == pytest.approx(1200.0)
        assert report["slowed"] == bool(late) and report["speed"] == 300.0
        if late:
            assert sim.pace.speed_x() == pytest.approx(2.0 / (2.0 / 300 + late), rel=1e-6)
        temp = (tmp_path / str(k) / dev.thermal.zone / "temp").read_text()
        states.append((sim.plant.s, report["good_weighted"], temp))
    assert states[0] == states[1]


def test_ticks_due_counts_the_overdue_ticks_bounded(tmp_path):
    dev = load_profile("rpi5")
    wall = FakeWall()
    sim = SimulatedDevice(dev, tmp_path, "hot", 100.0, 8.0, lambda: (None, 0.0), 0.02, wall=wall)
    sim.start()
    assert sim.ticks_due(1.0) == 0  # due in 10 ms
    wall.t += 0.01
    assert sim.ticks_due(1.0) == 1
    wall.t += 0.045
    assert sim.ticks_due(1.0) == 5
    wall.t += 10
    assert sim.ticks_due(1.0) == 20  # the loop's other duties get their turn


def test_the_clock_stops_after_the_hours_asked_even_in_a_batch(tmp_path):
    wall = FakeWall()
    sim = SimulatedDevice(load_profile("rpi5"), tmp_path, "hot", 100.0, 8.0,
                          lambda: (None, 0.0), 0.02, wall=wall, duration_s=5.0)
    sim.start()
    wall.t += 60  # far behind: 20 ticks due, but only 5 s are left
    assert sim.ticks_due(1.0) == 5
    for _ in range(5):
        sim.advance(1.0)
    assert sim.finished and sim.ticks_due(1.0) == 0
    assert sim.due_in(1.0) == float("inf")  # the loop naps as usual: no spinning
    assert sim.report()["elapsed_s"] == 5.0


def test_the_end_of_the_simulated_run_is_said_once(tmp_path, caplog):
    """A sleep that crosses the end (SimulatedSuspend advances the board by the whole
    sleep) and a tick after it: the clock-stops line once, where it stopped (was: once a
    call, a batch of ~20 lines at the end of a loaded run, 2026-12-08)."""
    wall = FakeWall()
    sim = SimulatedDevice(load_profile("rpi5"), tmp_path, "hot", 100.0, 8.0,
                          lambda: (None, 0.0), 0.02, wall=wall, duration_s=5.0)
    sim.start()
    with caplog.at_level("INFO", logger="edgerun.sim"):
        sim.advance(4.0)
        sim.advance(30.0)  # a sleep past the end
        sim.advance(1.0)
    said = [r for r in caplog.records if "the simulated clock stops here" in r.getMessage()]
    assert len(said) == 1 and "simulated 0.009444 h" in said[0].getMessage()


@pytest.mark.parametrize("body, key", [
    ("speed = 0\n", "speed"),
    ("speed = -3\n", "speed"),
    ("speed = inf\n", "speed"),
    ("hours = -1\n", "hours"),
    ("hours = inf\n", "hours"),
    ("weather_seed = -2\n", "weather_seed"),
    ("battery_frac = 1.5\n", "battery_frac"),
    ("battery_frac = -0.1\n", "battery_frac"),
])
def test_simulator_config_is_validated(tmp_path, body, key):
    from runtime.config import ConfigError, load

    p = tmp_path / "c.toml"
    p.write_text("[simulator]\n" + body)
    with pytest.raises(ConfigError, match=f"simulator.{key}"):
        load(p)
    p.write_text("[simulator]\nspeed = 480\nhours = 1.5\n")
    assert load(p).simulator.hours == 1.5


def test_the_demo_says_once_when_the_simulation_slows_and_once_when_it_is_back():
    from runtime.tools.demo import PaceNotice

    n = PaceNotice()
    seen = [n.seen(sim) for sim in (
        {}, {"slowed": False, "speed": 480.0, "speed_x": 480.0},
        {"slowed": True, "speed": 480.0, "speed_x": 102.4},
        {"slowed": True, "speed": 480.0, "speed_x": 95.0},
        {"slowed": False, "speed": 480.0, "speed_x": 470.0}, {"slowed": False})]
    assert seen[:2] == [None, None] and seen[3] is None and seen[5] is None
    assert seen[2] == ("  pace: this host is too busy for 480x: the simulation runs at 102x "
                       "(slower, same decisions)")
    assert seen[4] == "  pace: back at 480x"


def test_a_failing_load_still_moves_the_clock_by_the_tick(tmp_path):
    def broken():
        raise RuntimeError("the daemon's load is broken")

    sim = SimulatedDevice(load_profile("rpi5"), tmp_path, "hot", 100.0, 8.0, broken, 0.02,
                          wall=FakeWall())
    sim.advance(2.0)
    assert sim.clock.now() == sim.t0 + 2.0 == sim.plant.s.t


def test_the_report_tallies_the_hottest_die_and_time_on_each_rung(tmp_path):
    """What the demo's summary says: simulated seconds per rung (by variant, "" for none)
    summing to the time simulated, and the die's maximum over every plant step."""
    dev = load_profile("rpi5")
    top = Rung("m/top@e:CPU/t1", 0.9, 0.02, 0.005)
    low = Rung("m/low@e:CPU/t1", 0.8, 0.005, 0.002)
    running: list = [top]
    wall = FakeWall()
    sim = SimulatedDevice(dev, tmp_path, "hot", 100.0, 13.0, lambda: (running[0], 200.0),
                          0.02, wall=wall)
    sim.start()
    temps = [sim.plant.s.die_c]
    for rung, ticks in ((top, 300), (low, 100), (None, 50), (top, 20)):
        running[0] = rung
        for _ in range(ticks):
            sim.advance(2.0)  # two plant steps a tick: the maximum is over steps, not ticks
            temps.append(sim.plant.s.die_c)
    r = sim.report()
    assert r["rung_s"] == {"m/top@e:CPU/t1": 640.0, "m/low@e:CPU/t1": 200.0, "": 100.0}
    assert sum(r["rung_s"].values()) == pytest.approx(r["elapsed_s"])
    assert max(temps) <= r["die_max_c"] + 0.005 and r["die_max_c"] > temps[0] + 5


def _solar_board(tmp_path, seed: int, start_hour: float, battery_frac: float = 1.0):
    """The solar node `simulate` makes from `[simulator]` (the config's path, not a copy)."""
    from runtime.config import load
    from runtime.device.simdevice import simulate

    tmp_path.mkdir()
    p = tmp_path / "c.toml"
    p.write_text(f"[device]\nprofile = \"solar-node\"\n[simulator]\nenabled = true\n"
                 f"start_hour = {start_hour}\nweather_seed = {seed}\n"
                 f"battery_frac = {battery_frac}\n")
    return simulate(load(p), load_profile("solar-node"), tmp_path / "state",
                    lambda: (None, 0.0))


def test_a_solar_node_under_a_sky_charges_by_day_and_not_by_night(tmp_path):
    """`[simulator] weather_seed` puts power.plant.solar_trace's sky over the panel: at noon
    of a sunny day the panel gives power and the battery charges while idle; at midnight it
    gives none. Without it (-1) there is no sun, as before."""
    noon = _solar_board(tmp_path / "noon", 2, 12.0, battery_frac=0.5)
    night = _solar_board(tmp_path / "night", 2, 24.0, battery_frac=0.5)
    dark = _solar_board(tmp_path / "dark", -1, 12.0, battery_frac=0.5)
    for sim in (noon, night, dark):
        sim.start()
        for _ in range(600):
            sim.advance(1.0)
    bat0 = 0.5 * load_profile("solar-node").battery.capacity_wh
    assert noon.plant.s.harvest_w > 0 and noon.plant.s.battery_wh > bat0
    assert night.plant.s.harvest_w == 0 and night.plant.s.battery_wh < bat0
    assert dark.plant.s.harvest_w == 0 and dark.plant.s.battery_wh < bat0
    assert noon.report()["battery_frac"] > 0.5 > night.report()["battery_frac"]


def test_a_later_start_meets_the_same_sky(tmp_path):
    """A life started again at a later hour (the field soak's after a kill -9) meets the same
    weather on the same day: the sky counts from simulated hour 0; past its year the same year
    comes again (a run without an end never goes dark); another seed, another sky."""
    from runtime.device.simdevice import SKY_DAYS

    first = _solar_board(tmp_path / "first", 2, 9.0)
    later = _solar_board(tmp_path / "later", 2, 30.0)
    other = _solar_board(tmp_path / "other", 3, 9.0)
    days = [d * 86400 + 12 * 3600 for d in range(14)]  # noon of each of two weeks
    sun = [first.plant.harvest_w(t) for t in days]
    assert [later.plant.harvest_w(t) for t in days] == sun and max(sun) > 0
    year = SKY_DAYS * 86400
    assert [first.plant.harvest_w(t + 3 * year) for t in days] == sun
    assert [other.plant.harvest_w(t) for t in days] != sun
