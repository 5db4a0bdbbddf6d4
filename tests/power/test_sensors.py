"""Power meters and thermal sensor discovery against fake sysfs trees of real boards."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from power.device import DeviceProfile, PowerModel, SensorPaths
from power.sensors import (
    EstimatedMeter,
    HwmonEnergyMeter,
    IntegratingMeter,
    RaplMeter,
    SensorError,
    SensorSet,
    battery_power_reader,
    detect_meter,
    discover_thermal,
    find_ina3221_rail,
    hwmon_power_reader,
    ina3221_power_reader,
    read_int,
)
from power.sysfs import rel
from runtime.device.profiles import load_profile


def put(root: Path, rel: str, value) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(f"{value}\n")
    return p


RAPL = "sys/class/powercap/intel-rapl/intel-rapl:0"


def test_rapl_accumulates_and_unwraps(tmp_path):
    put(tmp_path, f"{RAPL}/max_energy_range_uj", 1_000_000)
    put(tmp_path, f"{RAPL}/energy_uj", 900_000)
    m = RaplMeter(tmp_path / RAPL)
    put(tmp_path, f"{RAPL}/energy_uj", 950_000)
    assert m.energy_j() == pytest.approx(0.05)
    put(tmp_path, f"{RAPL}/energy_uj", 20_000)  # wrapped: 50_000 to the top, +1, +20_000
    assert m.energy_j() == pytest.approx(0.05 + 0.070001)
    put(tmp_path, f"{RAPL}/energy_uj", 30_000)
    assert m.energy_j() == pytest.approx(0.05 + 0.070001 + 0.01)


def test_hwmon_energy(tmp_path):
    f = put(tmp_path, "sys/class/hwmon/hwmon0/energy1_input", 5_000_000)
    m = HwmonEnergyMeter(f)
    put(tmp_path, "sys/class/hwmon/hwmon0/energy1_input", 7_500_000)
    assert m.energy_j() == pytest.approx(2.5)


def test_integrating_hwmon_power(tmp_path):
    f = put(tmp_path, "sys/class/hwmon/hwmon1/power1_input", 4_000_000)  # 4 W
    now = [0.0]
    m = IntegratingMeter("hwmon", hwmon_power_reader(f), clock=lambda: now[0])
    now[0] = 2.0
    put(tmp_path, "sys/class/hwmon/hwmon1/power1_input", 6_000_000)  # 6 W
    assert m.energy_j() == pytest.approx(10.0)  # trapezoid (4+6)/2 * 2 s
    assert m.source == "hwmon"


def test_battery_power_now_and_vi(tmp_path):
    bat = tmp_path / "sys/class/power_supply/BAT0"
    put(tmp_path, "sys/class/power_supply/BAT0/voltage_now", 12_000_000)  # 12 V
    put(tmp_path, "sys/class/power_supply/BAT0/current_now", -500_000)  # 0.5 A, sign varies
    assert battery_power_reader(bat)() == pytest.approx(6.0)
    put(tmp_path, "sys/class/power_supply/BAT0/power_now", 7_000_000)
    assert battery_power_reader(bat)() == pytest.approx(7.0)


def test_garbage_and_missing_are_sensor_errors(tmp_path):
    f = put(tmp_path, "x/temp", "not-a-number")
    with pytest.raises(SensorError, match="expected an integer"):
        read_int(f)
    with pytest.raises(SensorError, match="cannot read"):
        read_int(tmp_path / "missing")


def test_estimated_meter_uses_cpu_time():
    wall, cpu = [0.0], [0.0]
    m = EstimatedMeter(idle_w=5.0, active_w_per_core=2.0, clock=lambda: wall[0],
                       cpu_clock=lambda: cpu[0])
    wall[0], cpu[0] = 10.0, 3.0  # 10 s wall, 3 CPU-seconds
    assert m.energy_j() == pytest.approx(5.0 * 10 + 2.0 * 3)


def profile(**sensors) -> DeviceProfile:
    return DeviceProfile("t", "test", PowerModel(3.0, 1.5), SensorPaths(**sensors))


def test_detect_prefers_rapl(tmp_path):
    put(tmp_path, f"{RAPL}/max_energy_range_uj", 1 << 32)
    put(tmp_path, f"{RAPL}/energy_uj", 1)
    assert detect_meter(tmp_path, profile()).source == "rapl"


def test_detect_battery_then_estimated(tmp_path):
    put(tmp_path, "sys/class/power_supply/BAT0/power_now", 1_000_000)
    assert detect_meter(tmp_path, profile(battery="sys/class/power_supply/BAT0")).source \
        == "battery"
    assert detect_meter(tmp_path / "empty", profile()).source == "estimated"


def test_detect_skips_garbage_sensor(tmp_path):
    put(tmp_path, f"{RAPL}/max_energy_range_uj", "garbage")
    put(tmp_path, f"{RAPL}/energy_uj", 1)
    put(tmp_path, "sys/class/hwmon/hwmon0/energy1_input", 10)
    m = detect_meter(tmp_path, profile(hwmon_energy=("sys/class/hwmon/hwmon0/energy1_input",)))
    assert m.source == "hwmon"


# -- thermal discovery on real layouts (fixture trees: tests/fixtures/sysfs/README.md) --------

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sysfs"


def trips_of(src) -> tuple[float, float, float]:
    return tuple(src.trip(k).temp_c for k in ("passive", "hot", "critical"))


@pytest.mark.parametrize(("layout", "profile_name", "temp_file", "label", "trips", "trips_from",
                          "meter"), [
    # Pi 5: only the critical trip and fan (active) trips in sysfs; hot/passive from profile.
    ("rpi5", "rpi5", "sys/class/thermal/thermal_zone0/temp", "thermal_zone0 (cpu-thermal)",
     (78.0, 82.0, 90.0), "sysfs+profile", "estimated"),
    # Intel: coretemp Package id 0 beats x86_pkg_temp (unset 0 trips) and acpitz; TjMax
    # (temp1_crit 100) is where the CPU throttles -> hot; critical keeps the profile's gap.
    ("x86-coretemp", "generic-x86", "sys/class/hwmon/hwmon2/temp1_input",
     "hwmon2 coretemp Package id 0", (96.0, 100.0, 110.0), "sysfs+profile", "rapl"),
    # AMD Zen: Tctl (temp1), no limits exported -> profile trips; acpitz not chosen.
    ("x86-k10temp", "generic-x86", "sys/class/hwmon/hwmon1/temp1_input", "hwmon1 k10temp Tctl",
     (86.0, 90.0, 100.0), "profile", "estimated"),
    # Orin Nano: tj-thermal (max of all sensors); no trips -> the profile's; INA3221 VDD_IN.
    ("jetson-orin-nano", "jetson-orin-nano", "sys/class/thermal/thermal_zone8/temp",
     "thermal_zone8 (tj-thermal)", (83.0, 87.0, 97.0), "profile", "hwmon"),
])
def test_discovery_on_real_layouts(layout, profile_name, temp_file, label, trips, trips_from,
                                   meter):
    root = FIXTURES / layout
    dev = load_profile(profile_name)
    src = discover_thermal(root, dev)
    assert (src.temp_file, src.label, trips_of(src), src.trips_from) == \
        (temp_file, label, trips, trips_from)
    r = SensorSet(root, temp_file=src.temp_file).read()
    assert r.valid and -40 < r.temp_c < 150
    assert detect_meter(root, dev).source == meter


def test_jetson_without_tj_zone_takes_the_hottest_readable_zone(tmp_path):
    root = tmp_path / "jetson"
    shutil.copytree(FIXTURES / "jetson-orin-nano", root)
    shutil.rmtree(root / "sys/class/thermal/thermal_zone8")  # no tj-thermal
    put(root, "sys/class/thermal/thermal_zone1/temp", 52000)  # gpu-thermal hottest
    src = discover_thermal(root, load_profile("jetson-orin-nano"))
    assert src.temp_file == "sys/class/thermal/thermal_zone1/temp"
    assert src.label.startswith("thermal_zone1 (gpu-thermal), hottest at start-up of")
    assert "cv0" not in src.label  # -256 °C (no CV cluster on Orin Nano) is not a reading
    assert any("-256" in n for n in src.notes)


def test_jetson_profile_fits_its_power_modes():
    dev = load_profile("jetson-orin-nano")
    full = dev.power.idle_w + dev.power.cores * dev.power.active_w_per_core
    assert full <= 15.0  # the Orin Nano 15 W mode; the old profile modelled 17 W
    assert dev.thermal.trip("critical").temp_c < 102.5  # not Tegra210's numbers any more


from power.device import Thermal, ThermalModel, TripPoint  # noqa: E402
from power.thermal_source import merge_trips  # noqa: E402

PROFILE_TRIPS = (TripPoint(75.0, "passive", 3.0), TripPoint(82.0, "hot", 3.0),
                 TripPoint(90.0, "critical", 0.0))


def thermal_profile(**kw) -> DeviceProfile:
    th = Thermal(trips=PROFILE_TRIPS, model=ThermalModel(1.0, 1.0, 1.0, 1.0), **kw)
    return DeviceProfile("t", "test", PowerModel(3.0, 1.5), thermal=th)


def zone(root: Path, n: int, ztype: str, temp, trips=()) -> None:
    z = f"sys/class/thermal/thermal_zone{n}"
    put(root, f"{z}/type", ztype)
    put(root, f"{z}/temp", temp)
    for k, trip in enumerate(trips):
        for attr, value in zip(("temp", "type", "hyst"), trip, strict=False):
            if value is not None:
                put(root, f"{z}/trip_point_{k}_{attr}", value)


@pytest.mark.parametrize(("ztype", "trips", "want", "hysts", "trips_from", "note"), [
    # kernel passive (throttling starts) -> edgerun hot; passive = hot - profile margin (7)
    ("cpu-thermal", [(85000, "passive"), (95000, "critical")], (78.0, 85.0, 95.0),
     (3.0, 3.0, 0.0), "sysfs", None),
    # sysfs hysteresis (m°C) is used when present
    ("cpu-thermal", [(85000, "passive", 5000), (95000, "critical", 1000)], (78.0, 85.0, 95.0),
     (3.0, 5.0, 1.0), "sysfs", None),
    # several passive trips (L4T-style): the lowest is where throttling starts
    ("cpu-thermal", [(99000, "passive"), (95000, "passive"), (104500, "critical")],
     (88.0, 95.0, 104.5), (3.0, 3.0, 0.0), "sysfs", None),
    # ACPI: _PSV passive -> hot; _HOT (hibernate) and _CRT -> critical, the lowest of them
    ("acpitz", [(95000, "passive"), (100000, "hot"), (105000, "critical"), (60000, "active")],
     (88.0, 95.0, 100.0), (3.0, 3.0, 0.0), "sysfs", "active (fan)"),
    # only critical in sysfs: hot and passive from the profile
    ("cpu-thermal", [(95000, "critical")], (75.0, 82.0, 95.0), (3.0, 3.0, 0.0),
     "sysfs+profile", None),
    # only passive: profile critical 90 would not be above 95 -> keeps the profile's 8 °C gap
    ("cpu-thermal", [(95000, "passive")], (88.0, 95.0, 103.0), (3.0, 3.0, 0.0),
     "sysfs+profile", "critical placed 8 °C above"),
    # sysfs critical below the profile's hot: hot keeps the profile's gap below it
    ("cpu-thermal", [(80000, "critical")], (65.0, 72.0, 80.0), (3.0, 3.0, 0.0),
     "sysfs+profile", "hot placed 8 °C below"),
    # a passive trip at or above critical is nonsense: ignored
    ("cpu-thermal", [(100000, "passive"), (95000, "critical")], (75.0, 82.0, 95.0),
     (3.0, 3.0, 0.0), "sysfs+profile", "not below the sysfs critical"),
    # garbage temperature, missing type file, garbage hysteresis -> profile fallback
    ("cpu-thermal", [("garbage", "passive"), (95000, None), (85000, "passive", "x")],
     (78.0, 85.0, 90.0), (3.0, 3.0, 0.0), "sysfs+profile", "expected an integer"),
    # x86_pkg_temp's unset trips read 0: not trips at all
    ("x86_pkg_temp", [(0, "passive"), (0, "passive")], (75.0, 82.0, 90.0), (3.0, 3.0, 0.0),
     "profile", "not a usable trip"),
    # unknown type and absurd values are ignored
    ("cpu-thermal", [(85000, "bogus"), (999000, "critical")], (75.0, 82.0, 90.0),
     (3.0, 3.0, 0.0), "profile", "unknown trip type"),
    # edgerun's own simulator writes trips in edgerun's terms (power/plant.py)
    ("edgerun-sim", [(75000, "passive", 3000), (82000, "hot", 3000), (90000, "critical", 0)],
     (75.0, 82.0, 90.0), (3.0, 3.0, 0.0), "sysfs", None),
])
def test_zone_trip_mapping(tmp_path, ztype, trips, want, hysts, trips_from, note):
    zone(tmp_path, 0, ztype, 50000, trips)
    src = discover_thermal(tmp_path, thermal_profile())
    assert trips_of(src) == want
    assert tuple(src.trip(k).hyst_c for k in ("passive", "hot", "critical")) == hysts
    assert src.trips_from == trips_from
    if note:
        assert any(note in n for n in src.notes), src.notes
    assert [t.type for t in src.trips] == ["passive", "hot", "critical"]


HW = "sys/class/hwmon/hwmon0"


@pytest.mark.parametrize(("files", "selector", "want_file", "want", "trips_from"), [
    # coretemp: crit (TjMax) -> hot; max (Tcontrol, a fan point) ignored
    ({"name": "coretemp", "temp1_label": "Core 0", "temp1_input": 50000,
      "temp2_label": "Package id 0", "temp2_input": 55000, "temp2_max": 70000,
      "temp2_crit": 85000}, {}, "temp2_input", (78.0, 85.0, 90.0), "sysfs+profile"),
    # two packages: Package id 0 even when it is not the first tempN
    ({"name": "coretemp", "temp1_label": "Package id 1", "temp1_input": 60000,
      "temp5_label": "Package id 0", "temp5_input": 55000}, {}, "temp5_input",
     (75.0, 82.0, 90.0), "profile"),
    # pre-Zen k10temp: no labels, temp1; HTC temp1_crit -> hot, crit_hyst is absolute (82)
    ({"name": "k10temp", "temp1_input": 50000, "temp1_max": 70000, "temp1_crit": 85000,
      "temp1_crit_hyst": 82000}, {}, "temp1_input", (78.0, 85.0, 90.0), "sysfs+profile"),
    # a profile may choose Tdie; its limits (on the Tctl scale) are not used
    ({"name": "k10temp", "temp1_label": "Tctl", "temp1_input": 70000, "temp1_crit": 95000,
      "temp2_label": "Tdie", "temp2_input": 50000},
     {"hwmon_name": "k10temp", "hwmon_label": "Tdie"}, "temp2_input", (75.0, 82.0, 90.0),
     "profile"),
    # any other chip named by the profile: generic hwmon ABI, max -> hot, crit -> critical
    ({"name": "it8686", "temp1_label": "CPU", "temp1_input": 50000, "temp1_max": 88000,
      "temp1_crit": 98000, "temp1_crit_hyst": 96000},
     {"hwmon_name": "it8686", "hwmon_label": "CPU"}, "temp1_input", (81.0, 88.0, 98.0), "sysfs"),
])
def test_hwmon_trip_mapping(tmp_path, files, selector, want_file, want, trips_from):
    for name, value in files.items():
        put(tmp_path, f"{HW}/{name}", value)
    src = discover_thermal(tmp_path, thermal_profile(**selector))
    assert src.temp_file == f"{HW}/{want_file}"
    assert trips_of(src) == want
    assert src.trips_from == trips_from


def test_k10temp_crit_hyst_is_absolute(tmp_path):
    for name, value in {"name": "k10temp", "temp1_input": 50000, "temp1_crit": 85000,
                        "temp1_crit_hyst": 82000}.items():
        put(tmp_path, f"{HW}/{name}", value)
    assert discover_thermal(tmp_path, thermal_profile()).trip("hot").hyst_c == 3.0


def test_unreadable_candidate_falls_through_to_the_next(tmp_path):
    put(tmp_path, f"{HW}/name", "coretemp")
    put(tmp_path, f"{HW}/temp1_label", "Package id 0")
    put(tmp_path, f"{HW}/temp1_input", "garbage")
    zone(tmp_path, 0, "acpitz", 30000)
    zone(tmp_path, 1, "x86_pkg_temp", 400000)  # 400 °C: not physical
    zone(tmp_path, 2, "x86_pkg_temp", 52000)
    src = discover_thermal(tmp_path, thermal_profile())
    assert src.temp_file == "sys/class/thermal/thermal_zone2/temp"


def test_nothing_found_names_every_place_tried(tmp_path):
    put(tmp_path, f"{HW}/name", "nvme")
    zone(tmp_path, 1, "iwlwifi_1", 40000)  # not the profile's zone0: no last resort either
    with pytest.raises(SensorError) as e:
        discover_thermal(tmp_path, thermal_profile())
    msg = str(e.value)
    for tried in ("hwmon coretemp", "hwmon k10temp", "'x86_pkg_temp'", "'tj-thermal'",
                  "cpu-thermal, gpu-thermal", "'acpitz'", "profile's zone"):
        assert tried in msg
    assert "names here: nvme" in msg and "zone types here: iwlwifi_1" in msg
    assert str(tmp_path / "sys/class/hwmon") in msg


def test_profile_named_sensor_is_the_only_one_tried(tmp_path):
    root = FIXTURES / "x86-coretemp"
    with pytest.raises(SensorError) as e:
        discover_thermal(root, thermal_profile(zone_type="cpu-thermal"))
    assert "named by the profile" in str(e.value)
    assert "zone types here: acpitz, x86_pkg_temp" in str(e.value)
    assert "hwmon coretemp" not in str(e.value)  # no silent fallback to another sensor
    src = discover_thermal(root, thermal_profile(zone_type="acpitz"))
    assert src.temp_file == "sys/class/thermal/thermal_zone0/temp"
    with pytest.raises(SensorError, match="no temp label 'Tdie'"):
        discover_thermal(FIXTURES / "x86-k10temp",
                         thermal_profile(hwmon_name="k10temp", hwmon_label="Tdie"))


@pytest.mark.parametrize(("selector", "msg"), [
    ({"hwmon_label": "Tctl"}, "key 'hwmon_label': needs hwmon_name"),
    ({"zone_type": "a", "hwmon_name": "b"}, "key 'zone_type': name either"),
])
def test_thermal_selector_validation(selector, msg):
    from runtime.config.schema import ConfigError, build

    data = {"trips": [{"temp_c": t.temp_c, "type": t.type} for t in PROFILE_TRIPS],
            "model": {"r_die_case": 1.0, "c_die": 1.0, "r_case_amb": 1.0, "c_case": 1.0}}
    assert build(Thermal, data).zone_type == ""
    with pytest.raises(ConfigError, match=msg):
        build(Thermal, {**data, **selector})


def test_merge_trips_keeps_profile_when_sysfs_has_nothing():
    trips, source, notes = merge_trips(None, None, PROFILE_TRIPS)
    assert trips == PROFILE_TRIPS and source == "profile" and notes == []


# -- SensorSet reads the discovered file ------------------------------------------------------

def test_sensorset_reads_a_temp_file_and_a_zone_dir(tmp_path):
    f = put(tmp_path, f"{HW}/temp1_input", 61500)
    assert SensorSet(tmp_path, temp_file=f"{HW}/temp1_input").read().temp_c == 61.5
    zone(tmp_path, 0, "cpu-thermal", 42000)
    assert SensorSet(tmp_path, "sys/class/thermal/thermal_zone0").read().temp_c == 42.0
    f.write_text("151000\n")
    r = SensorSet(tmp_path, temp_file=f"{HW}/temp1_input").read()
    assert r.temp_c is None and "outside" in r.problems[0]


# -- INA3221 (Jetson) power meter -------------------------------------------------------------

INA = "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1"


def test_ina3221_power_is_v_times_i(tmp_path):
    root = tmp_path / "j"
    shutil.copytree(FIXTURES / "jetson-orin-nano", root)
    d, n, rail = find_ina3221_rail(root)
    assert (rel(root, d), n, rail) == (INA, 1, "VDD_IN")
    assert ina3221_power_reader(d, n)() == pytest.approx(5.064 * 1.120)
    now = [0.0]
    m = IntegratingMeter("hwmon", ina3221_power_reader(d, n), clock=lambda: now[0])
    put(root, f"{INA}/curr1_input", 2240)  # 2.24 A
    now[0] = 10.0
    assert m.energy_j() == pytest.approx((5.671680 + 5.064 * 2.240) / 2 * 10)
    # the profile may name another rail
    assert find_ina3221_rail(root, ("VDD_SOC",))[1] == 3


def test_ina3221_without_the_input_rail_is_skipped(tmp_path):
    root = tmp_path / "j"
    shutil.copytree(FIXTURES / "jetson-orin-nano", root)
    put(root, f"{INA}/in1_label", "VDD_5V0")
    with pytest.raises(SensorError, match=r"no INA3221 channel labelled VDD_IN or POM_5V_IN "
                                          r"\(channels: .*in1 VDD_5V0"):
        find_ina3221_rail(root)
    dev = load_profile("jetson-orin-nano")
    assert detect_meter(root, dev).source == "estimated"
    put(root, f"{INA}/in1_label", "VDD_IN")
    m = detect_meter(root, dev)
    assert m.source == "hwmon" and "VDD_IN" in m.where


# -- edgerun check reports the sensors --------------------------------------------------------

def run_check(tmp_path, capsys, root: Path | str, profile="rpi5", policy="step_wise",
              simulator=False) -> tuple[int, str, str]:
    from runtime.cli import main

    cfg = tmp_path / "edgerun.toml"
    cfg.write_text(f'[device]\nprofile = "{profile}"\nsysfs_root = "{root}"\n'
                   f'[governor]\npolicy = "{policy}"\n'
                   f"[simulator]\nenabled = {'true' if simulator else 'false'}\n")
    rc = main(["check", str(cfg)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(("layout", "profile_name", "lines"), [
    ("rpi5", "rpi5", ["thermal: thermal_zone0 (cpu-thermal): sys/class/thermal/thermal_zone0/temp",
                      "trips from sysfs+profile: passive 78 °C (hyst 3), hot 82 °C (hyst 3), "
                      "critical 90 °C (hyst 0)", "now: 51.85 °C", "power: estimated"]),
    ("x86-coretemp", "generic-x86", ["hwmon2 coretemp Package id 0", "hot 100 °C",
                                     "power: rapl: sys/class/powercap/intel-rapl/intel-rapl:0"]),
    ("jetson-orin-nano", "jetson-orin-nano", [
        "thermal_zone8 (tj-thermal)", "trips from profile",
        f"power: hwmon: {INA}/in1_input x curr1_input (VDD_IN)"]),
])
def test_check_reports_sensors(tmp_path, capsys, layout, profile_name, lines):
    rc, out, err = run_check(tmp_path, capsys, FIXTURES / layout, profile_name)
    assert rc == 0, err
    for line in lines:
        assert line in err
    assert json.loads(out)["device"]["profile"] == profile_name  # stdout stays the config JSON


@pytest.mark.parametrize(("policy", "simulator", "rc", "says"), [
    ("step_wise", False, 1, ["ERROR: governor.policy is 'step_wise' but no temperature sensor",
                             "hwmon coretemp", "profile's zone", "config ok, sensors NOT ok"]),
    ("power_allocator", False, 1, ["ERROR: governor.policy is 'power_allocator'"]),
    ("off", False, 0, ["thermal: none (governor.policy is 'off'", ": ok"]),
    ("step_wise", True, 0, ["not probed (simulator.enabled"]),
])
def test_check_without_a_thermometer(tmp_path, capsys, policy, simulator, rc, says):
    empty = tmp_path / "empty-sysfs"
    empty.mkdir()
    got, _, err = run_check(tmp_path, capsys, empty, "rpi5", policy, simulator)
    assert got == rc, err
    for s in says:
        assert s in err
    if rc:
        assert str(empty / "sys/class/thermal/thermal_zone0/temp") in err


@pytest.mark.parametrize("name", ["rpi5", "generic-x86", "fanless-box", "jetson-orin-nano",
                                  "solar-node"])
def test_simulated_tree_discovers_the_profile_exactly(tmp_path, name):
    """The simulator's tree (power/plant.py) must give the governor the profile's own trips
    and meter, so simulated and pure runs act on the same numbers."""
    from power.plant import Plant, ambient

    dev = load_profile(name)
    plant = Plant(dev, ambient("constant", 30.0), root=tmp_path, battery_frac=0.5)
    plant.step(1.0, 1.0)
    src = discover_thermal(tmp_path, dev)
    assert src.temp_file == f"{dev.thermal.zone}/temp"
    assert src.trips == dev.thermal.trips and src.trips_from == "sysfs"
    assert SensorSet(tmp_path, src.temp_file).read().temp_c == pytest.approx(plant.s.die_c,
                                                                           abs=1e-3)


def test_unknown_board_falls_back_to_the_profile_zone_and_says_so(tmp_path):
    zone(tmp_path, 0, "soc-thermal", 48000, [(85000, "passive"), (95000, "critical")])
    src = discover_thermal(tmp_path, thermal_profile())
    assert src.temp_file == "sys/class/thermal/thermal_zone0/temp"
    assert trips_of(src) == (78.0, 85.0, 95.0)
    assert any("not a known die sensor" in n for n in src.notes)


def test_hwmon_listed_once_when_class_and_i2c_paths_link_the_same_device(tmp_path):
    """On a real board sys/class/hwmon/hwmonN and the i2c driver's hwmon node are links to one
    device directory; it must be probed once, under its class name."""
    from power.sysfs import hwmon_dirs

    dev = tmp_path / "sys/devices/platform/i2c/1-0040"
    put(tmp_path, "sys/devices/platform/i2c/1-0040/hwmon/hwmon1/name", "ina3221")
    (tmp_path / "sys/class/hwmon").mkdir(parents=True)
    (tmp_path / "sys/class/hwmon/hwmon1").symlink_to(dev / "hwmon/hwmon1")
    (tmp_path / "sys/bus/i2c/drivers/ina3221").mkdir(parents=True)
    (tmp_path / "sys/bus/i2c/drivers/ina3221/1-0040").symlink_to(dev)
    assert [rel(tmp_path, d) for d in hwmon_dirs(tmp_path)] == ["sys/class/hwmon/hwmon1"]


def test_ina3221_rails_one_by_one_on_the_orin_fixture(tmp_path):
    """Every Orin rail read on its own, P = mV x mA, with the driver's update interval as the
    rails' resolution; a rail the board lacks is named, never read as 0."""
    from power.ina3221 import Rails

    root = tmp_path / "j"
    shutil.copytree(FIXTURES / "jetson-orin-nano", root)
    dev = load_profile("jetson-orin-nano")
    rails = Rails(root, dev.sensors.ina3221_rails)
    assert rails.watts() == pytest.approx({"VDD_IN": 5.064 * 1.120,
                                           "VDD_CPU_GPU_CV": 5.064 * 0.280,
                                           "VDD_SOC": 5.064 * 0.432})
    assert rails.where["VDD_SOC"] == f"{INA}/in3_input x curr3_input"
    res = rails.resolution()
    assert res is not None and res.period_s == pytest.approx(0.008) and res.basis == "documented"
    put(root, f"{INA}/in2_label", "VDD_5V0")
    partial = Rails(root, dev.sensors.ina3221_rails)
    assert partial.missing == ("VDD_CPU_GPU_CV",) and "VDD_CPU_GPU_CV" not in partial.watts()
    with pytest.raises(SensorError, match="no INA3221 channel labelled VDD_GPU"):
        Rails(root, ("VDD_GPU",))


def test_the_orin_gpu_devfreq_from_its_profile(tmp_path):
    from power.accel_throttle import read_devfreq

    root = tmp_path / "j"
    shutil.copytree(FIXTURES / "jetson-orin-nano", root)
    dev = load_profile("jetson-orin-nano")
    s = read_devfreq(root / dev.sensors.gpu_devfreq)
    assert s is not None and s.throttled and "306 of 625 MHz" in s.why
    put(root, f"{dev.sensors.gpu_devfreq}/cur_freq", 624750000)
    assert not read_devfreq(root / dev.sensors.gpu_devfreq).throttled
