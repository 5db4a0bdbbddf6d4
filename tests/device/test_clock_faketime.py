"""End to end under libfaketime: a real `edgerun serve` whose wall clock reads a week behind
(a box without an RTC battery that booted at a stale saved time) publishes to a real
coordinator through Mosquitto; then its clock steps forward to the real time and timesyncd's
flag appears, as an NTP sync does. The results made before the sync land at the coordinator
placed at the real time they were made, the device's claim kept beside them; the daemon
keeps serving across the step, and across a later step back an hour (docs/clocks.md)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.daemon_harness import Serve, write_broker_config
from support.waiting import wait

from models import bundled
from runtime.wire import clock

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SHIM = Path(__file__).parents[1] / "support" / "faketime_shim"
WEEK = 7 * 86400.0

pytestmark = [
    pytest.mark.skipif(not LIBFAKETIME.exists(),
                       reason=f"libfaketime is not installed ({LIBFAKETIME}: Debian's faketime)"),
    pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                       reason="bundled model not built"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("start, state", [("-7d", "unsynced"),
                                          ("@1970-01-01 00:00:00", "implausible"),
                                          ("@2100-06-01 00:00:00", "implausible")],
                         ids=["week-behind", "from-1970", "in-2100"])
def test_serve_behind_then_synced_lands_placed(tmp_path, broker, coordinator, profile_cache,
                                               monkeypatch, start, state):
    cfg = write_broker_config(tmp_path, broker, profile_cache)
    root = tmp_path / "sysfs"
    flag = root / clock.TIMESYNC_FLAG
    flag.parent.mkdir(parents=True)  # timesyncd runs, not synced yet
    fake = tmp_path / "faketime"
    fake.write_text(f"{start}\n")
    monkeypatch.setenv("PYTHONPATH", f"{SHIM}:{__import__('os').environ.get('PYTHONPATH', '')}")
    began = time.time()
    d = Serve(tmp_path, cfg, env={
        "LD_PRELOAD": str(LIBFAKETIME), "FAKETIME_TIMESTAMP_FILE": str(fake),
        "FAKETIME_CACHE_DURATION": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"})
    try:
        wait(lambda: coordinator.store.counts().get("box1", 0) >= 20, 180, "results", d)
        before = coordinator.store.results("box1", 0, 20)
        for r in before:  # made by the wrong clock, unsynced, and not placeable yet
            assert r["clk"]["sync"] is False and "claimed" not in r["clk"], r
            if state == "unsynced":  # a week behind
                assert began - WEEK - 60 < r["t"] < time.time() - WEEK + 60, r
            elif start.startswith("@1970"):  # the first minutes of 1970
                assert 0 <= r["t"] < 3600, r
            else:  # the first minutes of June 2100
                assert clock.CEILING_T < r["t"] < clock.CEILING_T + 160 * 86400, r
        if "2100" in start:  # a claim past 2100 is refused (it would never age out), and
            # the refusal, kept in the quarantine, tells the operator why
            wait(lambda: coordinator.store.read(
                "SELECT reason FROM quarantine WHERE device = 'box1' AND reason LIKE "
                "'%past 2100 unsynced%'"), 60, "the health past 2100 quarantined", d)
            assert "after 2100" in d.text()
        else:  # the first health may be stored after the first results (a later commit)
            wait(lambda: "clock" in (coordinator.views["box1"].health or {}), 60,
                 "a health with its clock", d)
            health = coordinator.views["box1"].health
            assert health["clock"]["state"] == state and health["clk"]["sync"] is False
        if state == "implausible" and "1970" in start:  # said and counted, not a crash loop
            assert health["clock"]["implausible_total"] == 1
            assert "clock: the clock reads 1970-01-01" in d.text()
        # the NTP sync: the clock steps forward to the real time, then timesyncd's flag
        fake.write_text("+0\n")
        time.sleep(2.5)  # libfaketime re-reads the file at most every second
        synced_at = time.time()
        flag.touch()

        def placed() -> bool:
            got = {r["seq"]: r for r in coordinator.store.results("box1", 0, 20)}
            return all("claimed" in got[r["seq"]]["clk"] for r in before if r["seq"] in got)

        wait(placed, 60, "the results made before the sync placed", d)
        after = {r["seq"]: r for r in coordinator.store.results("box1", 0, 20)}
        for r in before:
            got = after[r["seq"]]
            assert began - 1 <= got["t"] <= synced_at + 1, got  # the real time it was made
            assert got["clk"]["claimed"] == r["t"]
        # the offsets agree to the second: every result moved by the same step
        steps = [after[r["seq"]]["t"] - r["t"] for r in before]
        assert max(steps) - min(steps) < 1.0, steps
        if state == "unsynced":
            assert abs(steps[0] - WEEK) < 5, steps
            errs = [st - WEEK for st in steps]  # the placing's error: faked exactly a week
            print(f"placed {len(errs)} results: error {min(errs) * 1e3:+.1f} to "
                  f"{max(errs) * 1e3:+.1f} ms")
        # the placed times are in the store's rows too, so every query sees them
        (lo, hi), = coordinator.store.read("SELECT MIN(t), MAX(t) FROM results WHERE "
                                           "device = 'box1' AND seq <= 20")
        assert began - 1 <= lo <= hi <= synced_at + 1
        # the device saw the step, says so, and serves on
        wait(lambda: (coordinator.views["box1"].health.get("clock") or {}).get("state")
             == "synced", 30, "a synced health", d)
        assert coordinator.views["box1"].health["clock"]["jumps_total"] >= 1
        assert "the wall clock jumped " + ("-" if "2100" in start else "+") in d.text()
        n = coordinator.store.counts()["box1"]
        wait(lambda: coordinator.store.counts()["box1"] > n + 20, 60, "results after the step",
             d)
        newest = coordinator.store.results("box1", n, 5)
        assert all(r["clk"]["sync"] is True and synced_at - 5 <= r["t"] for r in newest)
        # a step back an hour (a bad time source corrected): counted, nothing frozen
        jumps = coordinator.views["box1"].health["clock"]["jumps_total"]
        fake.write_text("-1h\n")
        wait(lambda: coordinator.views["box1"].health["clock"]["jumps_total"] > jumps, 60,
             "the step back counted", d)
        n = coordinator.store.counts()["box1"]
        wait(lambda: coordinator.store.counts()["box1"] > n + 20, 60,
             "results after the step back", d)
        assert "the wall clock jumped -36" in d.text()
    finally:
        assert d.stop() == 0
