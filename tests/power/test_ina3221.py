"""Jetson's INA3221 rails in health (power/ina3221.py `report`), on a sysfs fixture laid out as
the Orin Nano's (tests/fixtures/sysfs/README.md), and the health message of a daemon on it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.daemon_harness import Serve, last_health, write_config
from support.waiting import wait

from power import ina3221
from runtime.device.profiles import load_profile
from runtime.wire import payloads

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sysfs"
INA = "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1"
RAILS = load_profile("jetson-orin-nano").sensors.ina3221_rails


@pytest.fixture
def orin(tmp_path) -> Path:
    root = tmp_path / "sysfs"
    shutil.copytree(FIXTURES / "jetson-orin-nano", root)
    return root


def test_every_rail_reported_in_watts_with_its_resolution(orin):
    r = ina3221.report(orin, RAILS)
    assert r is not None and r["reason"] is None and r["missing"] == []
    assert r["watts"] == pytest.approx({"VDD_IN": 5.064 * 1.120, "VDD_CPU_GPU_CV": 5.064 * 0.280,
                                        "VDD_SOC": 5.064 * 0.432}, abs=1e-3)  # V x A
    assert "8 ms" in r["resolution"] and "documented" in r["resolution"]


@pytest.mark.parametrize("breakage, missing, unread", [
    ((f"{INA}/in2_label", "VDD_5V0"), ["VDD_CPU_GPU_CV"], []),  # a rail the board lacks
    ((f"{INA}/curr3_input", "garbage"), [], ["VDD_SOC"]),         # a rail that reads garbage
])
def test_a_missing_or_unreadable_rail_is_named_never_0_w(orin, breakage, missing, unread):
    f, value = breakage
    (orin / f).write_text(f"{value}\n")
    r = ina3221.report(orin, RAILS)
    assert r["missing"] == missing
    assert all(r["watts"][k] is None for k in unread)
    assert all(k not in r["watts"] for k in missing)
    assert all(w > 0 for k, w in r["watts"].items() if k not in unread)


def test_no_rails_named_or_none_found(tmp_path):
    assert ina3221.report(tmp_path, ()) is None  # a profile without [sensors] ina3221_rails
    r = ina3221.report(tmp_path, RAILS)  # named, but no INA3221 on this board
    assert r["watts"] == {} and r["missing"] == list(RAILS) and "no INA3221" in r["reason"]


def test_a_daemon_on_the_orin_reports_its_rails_in_health(tmp_path, orin, profile_cache):
    """`edgerun serve` with the jetson-orin-nano profile on the fixture: health carries every
    rail, and the schema a coordinator validates with admits it."""
    cfg = write_config(tmp_path, profile_cache)
    cfg.write_text(cfg.read_text().replace('profile = "generic-x86"',
                                           'profile = "jetson-orin-nano"'))
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: (h := last_health(d.outbox)) and h.get("power_rails"), 90,
             "a health message with the rails", d)
        h = last_health(d.outbox)
    finally:
        assert d.stop() == 0
    payloads.check("health", h)
    assert h["power_rails"]["watts"] == pytest.approx(
        ina3221.report(orin, RAILS)["watts"])
    assert h["power_rails"]["missing"] == []
