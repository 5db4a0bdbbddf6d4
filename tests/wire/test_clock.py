"""The clock's judgement (synced, unsynced, implausible), its reads through a root, the stamp
and the placing arithmetic (runtime/wire/clock.py, docs/clocks.md)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from runtime.wire import clock, payloads
from runtime.wire.clock import Reading

NOW = 1_790_000_000.0  # 2026-09: a plausible wall time
KB = "5f5dcc99-04fd-4ed9-8148-1f8082f1e005"


@pytest.mark.parametrize("wall, timesync, kernel, state", [
    (NOW, True, False, "synced"),  # timesyncd's flag alone
    (NOW, None, True, "synced"),  # chrony / ntpd: the kernel's status alone
    (NOW, False, True, "synced"),  # timesyncd not yet, but the kernel disciplined
    (NOW, False, False, "unsynced"),  # this VM: adjtimex says TIME_ERROR / STA_UNSYNC
    (NOW, None, None, "unsynced"),  # nothing to ask: never assumed synced
    (0.0, True, True, "implausible"),  # 1970 with a flag left from before: not believed
    (86400.0 * 365, False, False, "implausible"),  # 1971
    (clock.FLOOR_T - 1, True, True, "implausible"),
    (clock.FLOOR_T, False, False, "unsynced"),
    (4_200_000_000.0, True, True, "implausible"),  # 2103
    (clock.CEILING_T, True, False, "synced"),
    (clock.CEILING_T + 1, True, True, "implausible"),  # the ceiling is 2100, not later
])
def test_judge(wall, timesync, kernel, state):
    s = clock.judge(Reading(wall, 12.5, KB, timesync, kernel))
    assert s.state == state, s
    assert s.synced == (state == "synced")
    assert s.reason


def test_implausible_reasons_name_the_reading():
    assert "1970-01-01" in clock.judge(Reading(0.0, 1.0, KB, True, True)).reason
    assert "after 2100" in clock.judge(Reading(4.2e9, 1.0, KB, None, None)).reason


def test_read_through_a_root(tmp_path):
    """The flag file under the root decides timesyncd's view; a root without /proc keeps the
    kernel's own boot id; a folder with no flag is "timesyncd runs, not synced"."""
    r = clock.read(tmp_path, kernel=False)
    assert r.timesync is None and r.kernel is None
    whole = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert r.boot_id == whole.replace("-", "")[:12] and len(r.boot_id) == 12
    flag = tmp_path / clock.TIMESYNC_FLAG
    flag.parent.mkdir(parents=True)
    assert clock.read(tmp_path, kernel=False).timesync is False
    flag.touch()
    r = clock.read(tmp_path, kernel=False)
    assert r.timesync is True and clock.judge(r).synced
    assert abs(r.boottime - time.clock_gettime(time.CLOCK_BOOTTIME)) < 5
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp_path / clock.BOOT_ID).write_text("fake-boot\n")
    assert clock.read(tmp_path, kernel=False).boot_id == "fakeboot"


def test_kernel_adjtimex_answers():
    """adjtimex is asked read-only and answers here (this VM: unsynced, REFERENCE.md)."""
    assert clock.kernel_synced() in (True, False)


@pytest.mark.parametrize("t, clk, off", [
    (NOW, {"sync": True, "kb": KB, "bt": 100.0}, NOW - 100.0),
    (NOW, {"sync": False, "kb": KB, "bt": 100.0}, None),  # an unsynced claim gives nothing
    (NOW, None, None),  # an older device: no stamp
    (NOW, {"sync": True, "kb": KB, "bt": True}, None),  # malformed
    (0.0, {"sync": True, "kb": KB, "bt": 5.0}, None),  # "synced" at 1970: not believed
])
def test_offset_of(t, clk, off):
    assert clock.offset_of(t, clk) == off


@pytest.mark.parametrize("clk, off, at", [
    ({"sync": False, "kb": KB, "bt": 40.0}, NOW - 100.0, NOW - 60.0),
    ({"sync": False, "kb": KB, "bt": 40.0}, None, None),  # no offset yet
    ({"sync": True, "kb": KB, "bt": 40.0}, NOW, None),  # synced: its own t stands
    ({"sync": False, "kb": KB, "bt": -1.0}, NOW, None),
    (None, NOW, None),
])
def test_placed(clk, off, at):
    assert clock.placed(NOW - 7 * 86400, clk, off) == at


def test_stamp_each_moves_boottime_back_by_each_results_age():
    clk = {"sync": False, "kb": KB, "bt": 1000.0}
    items = [{"t": NOW - 0.04}, {"t": NOW}, {"t": NOW - 7 * 86400}, {"t": NOW + 5}]
    clock.stamp_each(items, clk, NOW)
    assert [it["clk"]["bt"] for it in items] == [999.96, 1000.0, 1000.0, 1000.0]
    for it in items:  # each a valid stamp on the wire
        payloads.check("result", {"v": 1, "stream": "s", "boot": "b", "floor": 1,
                                  "results": [{"seq": 1, **it}]})


@pytest.mark.parametrize("bt, age, want", [
    (1e6, 7200.0, 1e6),  # older than an hour (a step between): the stamp's own boottime
    (1e6, 3600.0, 1e6 - 3600.0),  # an hour old: moved back by its age
    (10.0, 60.0, 10.0),  # older than the boot itself: never a negative boottime
])
def test_stamp_each_keeps_the_stamp_where_the_age_cannot_be_right(bt, age, want):
    items = [{"t": NOW - age}]
    clock.stamp_each(items, {"sync": False, "kb": KB, "bt": bt}, NOW)
    assert items[0]["clk"]["bt"] == want


def test_a_stamp_s_boottime_is_to_the_millisecond():
    """Placing at the coordinator adds the stamp's boottime to an offset: whole seconds put
    a result up to half a second off its frame."""
    r = Reading(NOW, 12.3456, KB, True, None)
    assert clock.stamp(clock.judge(r), r) == {"sync": True, "kb": KB, "bt": 12.346}


def test_schemas_take_the_stamp_and_old_payloads_without_it():
    clk = {"sync": False, "kb": KB, "bt": 12.0}
    payloads.check("event", {"v": 1, "t": NOW, "type": "x", "clk": clk})
    payloads.check("event", {"v": 1, "t": NOW, "type": "x"})
    payloads.check("health", {"v": 1, "t": NOW, "boot": "b", "clk": clk, "clock": {
        "state": "implausible", "reason": "1970", "implausible_total": 1, "jumps_total": 2,
        "last_jump_s": 604800.0}})
    payloads.check("health", {"v": 1, "t": NOW, "boot": "b"})
    with pytest.raises(payloads.PayloadError, match="clk"):
        payloads.check("event", {"v": 1, "t": NOW, "type": "x", "clk": {"sync": "yes"}})


class _Root:
    """A fake root whose timesyncd flag the test sets."""

    def __init__(self, path):
        self.path = path
        (path / clock.TIMESYNC_FLAG).parent.mkdir(parents=True)

    def sync(self, on: bool) -> None:
        flag = self.path / clock.TIMESYNC_FLAG
        flag.touch() if on else flag.unlink(missing_ok=True)


def test_clock_logs_changes_once_and_counts(tmp_path, caplog):
    """A clock at 1970 is logged once as an error and counted; a jump of the wall clock
    against boottime is counted with its size; the sync is logged."""
    root = _Root(tmp_path)
    walls = iter([0.0, 0.0, NOW, NOW, NOW + 1, NOW + 1])  # two reads per `now`
    c = clock.Clock(tmp_path, every_s=0.0, kernel=False, wall=lambda: next(walls))
    with caplog.at_level(logging.INFO, "edgerun.clock"):
        s, _ = c.now()
        assert s.state == "implausible" and c.implausible_total == 1
        root.sync(True)
        s, _ = c.now()
        assert s.synced and c.jumps_total == 1 and c.last_jump_s > 1.7e9
        s, _ = c.now()
        assert s.synced and c.jumps_total == 1  # a second on: no jump
    text = caplog.text
    assert text.count("1970-01-01") == 1 and "jumped" in text and "synchronised" in text
    h = c.health()
    assert h["state"] == "synced" and h["implausible_total"] == 1 and h["jumps_total"] == 1


def test_a_step_back_is_a_jump_counted_with_its_sign(tmp_path):
    """A wall clock stepped back an hour (a wrong time server) is as much a jump as one
    forward: counted, and health's last_jump_s says which way."""
    _Root(tmp_path).sync(True)
    walls = iter([NOW, NOW, NOW - 3600.0, NOW - 3600.0])  # two reads per `now`
    c = clock.Clock(tmp_path, every_s=0.0, kernel=False, wall=lambda: next(walls))
    c.now()
    c.now()
    assert c.jumps_total == 1 and c.last_jump_s == pytest.approx(-3600.0, abs=1.0)
    assert c.health()["last_jump_s"] == pytest.approx(-3600.0, abs=1.0)


@pytest.mark.parametrize("a, b, after", [
    # one kernel boot: boottime decides, whatever the wall clock claimed
    ((NOW - 7 * 86400, {"sync": False, "kb": "k", "bt": 20.0}),
     (NOW, {"sync": True, "kb": "k", "bt": 10.0}), True),
    ((NOW, {"sync": True, "kb": "k", "bt": 10.0}),
     (NOW - 1, {"sync": True, "kb": "k", "bt": 20.0}), False),
    # two kernel boots, both synced: wall time decides
    ((NOW, {"sync": True, "kb": "k2", "bt": 1.0}),
     (NOW - 60, {"sync": True, "kb": "k", "bt": 900.0}), True),
    # a reboot a week behind, unsynced: nothing can tell (the later arrival wins)
    ((NOW - 7 * 86400, {"sync": False, "kb": "k2", "bt": 1.0}),
     (NOW, {"sync": True, "kb": "k", "bt": 900.0}), None),
    # older devices without stamps: wall time, as before; one stamped and one not: unknown
    ((NOW, None), (NOW - 1, None), True),
    ((NOW - 1, None), (NOW, None), False),
    ((NOW, {"sync": True, "kb": "k", "bt": 1.0}), (NOW - 1, None), None),
])
def test_made_after(a, b, after):
    assert clock.made_after(a[0], a[1], b[0], b[1]) is after


@pytest.mark.parametrize("step", [7 * 86400.0, -3600.0, -NOW])  # forward a week, back an
def test_steady_clock_never_steps(step):  # hour, back to 1970
    """The control loop's clock (holds, dwells, the governor's integral) advances by what
    the monotonic clock counted, whatever the wall clock does."""
    wall, mono = [NOW], [500.0]
    tick = clock.steady(lambda: wall[0], lambda: mono[0])
    assert tick() == NOW
    mono[0] += 1.0
    wall[0] += 1.0 + step  # a second passes and the wall clock steps
    assert tick() == NOW + 1.0
    mono[0] += 0.2
    assert tick() == pytest.approx(NOW + 1.2)


def test_steady_wall_follows_a_step_back_then_holds_a_step_forward_from_there():
    """Stepped back a day, the wall clock is followed (data kept longer) and becomes the
    base: a week's step forward after that is held to the stepped-back time plus what the
    monotonic clock counted, not to the old base a day ahead (data deleted a day early)."""
    wall, mono = [NOW], [100.0]
    sw = clock.SteadyWall(lambda: wall[0], lambda: mono[0])
    assert sw.now() == NOW
    wall[0], mono[0] = NOW - 86400.0, 110.0  # back a day, 10 s later
    assert sw.now() == NOW - 86400.0
    wall[0], mono[0] = NOW - 86400.0 + 20.0 + 7 * 86400.0, 130.0  # a week ahead, 20 s on
    assert sw.now() == pytest.approx(NOW - 86400.0 + 20.0)
    assert sw.jumps_total == 1
