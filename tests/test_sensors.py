"""Power meters against a fake sysfs tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from power.device import DeviceProfile, PowerModel, SensorPaths
from power.sensors import (
    EstimatedMeter,
    HwmonEnergyMeter,
    IntegratingMeter,
    RaplMeter,
    SensorError,
    battery_power_reader,
    detect_meter,
    hwmon_power_reader,
    read_int,
)


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
