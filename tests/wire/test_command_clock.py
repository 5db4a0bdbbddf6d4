"""Commands while the clock is not synced (docs/clocks.md): expiry judged against the latest
time known to have passed, never an unsynced wall clock; no replay across clock steps and
restarts; and no refusing every command until the sync."""

from __future__ import annotations

import json
import time
from unittest import mock

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from runtime.telemetry.sidecar import Sidecar
from runtime.wire import clock, commands
from runtime.wire.commands import Floor

REAL = 1_790_000_000.0  # the real time of the scenario (the coordinator's clock)
DAY, SKEW = 86400.0, 60.0
KEY = Ed25519PrivateKey.generate()
TRUSTED = {commands.key_id(KEY.public_key()): KEY.public_key()}


@pytest.mark.parametrize("issued, expires, wall, synced, floor, refused", [
    # synced: the wall clock decides, as it always did
    (REAL, REAL + 60, REAL, True, 0.0, None),
    (REAL - 120, REAL - 60, REAL, True, 0.0, "expired 60 s ago"),
    (REAL + 600, REAL + 660, REAL, True, 0.0, "issued in the future"),
    (REAL, REAL + 10, REAL, True, REAL + 30, "expired"),  # never below a known time...
    # ... unless it is past the allowed skew: a floor raised by a coordinator's wrong clock
    (REAL, REAL + 60, REAL, True, REAL + 3600, None),
    (REAL, REAL + 60, REAL, True, 4.1e9, None),
    # unsynced at 1970: a fresh command is accepted (not "issued in the future")
    (REAL, REAL + 60, 0.0, False, 0.0, None),
    (REAL, REAL + 60, 0.0, False, REAL - DAY, None),
    # ... one expired before a time known to have passed is refused
    (REAL - 120, REAL - 60, 0.0, False, REAL, "expired 60 s ago (by the latest time known"),
    # unsynced at 2100: a fresh command is accepted (not "expired 74 years ago")
    (REAL, REAL + 60, 4.1e9, False, REAL - 5, None),
    # unsynced 7 days behind, no floor yet: judged on its lifetime and id only
    (REAL - 30, REAL + 30, REAL - 7 * DAY, False, 0.0, None),
    # synced, a floor within the skew ahead: "in the future" is judged on this clock's own
    # reading, not lifted by the floor (issued 80 s ahead of it, the skew 60 s)
    (REAL + 80, REAL + 140, REAL, True, REAL + 30, "issued in the future"),
])
def test_time_problem(issued, expires, wall, synced, floor, refused):
    why = commands.time_problem(issued, expires, wall, synced, floor, SKEW)
    assert (why is None) if refused is None else (refused in (why or "")), why


@pytest.mark.parametrize("floor, kb, bt, now", [
    (Floor(), "a", 5.0, 0.0),
    (Floor(REAL, "a", 100.0), "a", 160.0, REAL + 60),  # advanced by boottime, same boot
    (Floor(REAL, "a", 100.0), "b", 5.0, REAL),  # rebooted: the time down is unknown
    (Floor(REAL, "a", 100.0), "a", 50.0, REAL),  # boottime behind it: not moved back
    # another boot whose boottime is past the recorded one (a card moved to a device up for
    # a month, or a reboot that ran longer): its boottime says nothing about this floor
    (Floor(REAL, "a", 100.0), "b", 30 * DAY, REAL),
])
def test_floor_now(floor, kb, bt, now):
    assert floor.now(kb, bt) == now


class Device:
    """A device's command gate as the publisher runs it (Publisher._verify), with a clock
    the test sets: the wall reading, whether it is synced, the kernel boot and boottime."""

    def __init__(self, path):
        self.path = path
        self.side = self._open()
        self.wall, self.synced, self.kb, self.bt = REAL, True, "boot1", 100.0

    def _open(self, lost: bool = False) -> Sidecar:
        side = Sidecar(self.path, lost_history=lost)
        side.bound(commands.memory_bound(DAY, SKEW))
        return side

    def reboot(self, wall: float, synced: bool, lost: bool = False) -> None:
        """Restart on a new kernel boot; with `lost` the replay record is gone (deleted
        while the outbox stayed)."""
        if lost:
            self.path.unlink()
        self.side = self._open(lost)
        self.wall, self.synced, self.kb, self.bt = wall, synced, self.kb + "'", 10.0

    def elapse(self, s: float) -> None:
        self.wall += s
        self.bt += s

    def send(self, env: dict) -> str:
        side = self.side
        side.settle_not_before(self.synced, self.wall, self.kb, self.bt)
        if side.pending is not None:
            return "refused until the clock syncs"
        floor_now = side.floor.now(self.kb, self.bt)
        if commands.floor_wrong(self.wall, self.synced, floor_now, SKEW):
            side.lower_floor(self.wall, self.kb, self.bt)
            floor_now = side.floor.now(self.kb, self.bt)
        at = commands.judged_now(self.wall, self.synced, floor_now, SKEW)

        def remember(cid: str, expires: float) -> bool:
            known, by = commands.floor_source(self.synced, at, env["issued_at"])
            side.raise_floor(known, self.kb, self.bt, by=by)
            return side.remember(cid, expires, at, self.synced)

        try:
            commands.verify(env, "dev1", TRUSTED, self.wall, SKEW, remember,
                            side.not_before, DAY, synced=self.synced, floor_now=floor_now)
        except commands.CommandRefused as e:
            return str(e)
        return "ok"


def sign(issued: float, ttl: float = 600.0) -> dict:
    return commands.sign(KEY, "dev1", "ping", ttl_s=ttl, now=issued)


def test_no_replay_after_a_reboot_to_1970_or_a_step_to_2100(tmp_path):
    d = Device(tmp_path / "keep.json")
    cmd = sign(REAL)
    assert d.send(cmd) == "ok"
    d.reboot(wall=0.0, synced=False)  # no RTC battery: 1970
    assert "replayed" in d.send(cmd)
    d.wall = 4.1e9  # a bad time server: 2100, still unsynced
    assert "replayed" in d.send(cmd)
    d.reboot(wall=4.1e9, synced=True)  # even "synced" at 2100 refuses it (expired)
    assert "expired" in d.send(cmd)
    d.reboot(wall=REAL + 30, synced=True)  # the real clock back: the id was kept
    assert "replayed" in d.send(cmd)


def test_ids_dropped_by_a_synced_clock_stay_refused_after_a_step_back(tmp_path):
    """Ids are dropped only against a time that has passed, written with the floor, so a
    clock stepped back (reboot at a stale saved time) cannot bring a dropped id back."""
    d = Device(tmp_path / "keep.json")
    old = sign(REAL, ttl=60)
    assert d.send(old) == "ok"
    d.elapse(3600)
    assert d.send(sign(d.wall)) == "ok"  # prunes `old` (expired an hour ago)
    assert old["id"] not in d.side.seen
    d.reboot(wall=REAL - 7 * DAY, synced=False)  # fake-hwclock's stale time
    assert "expired" in d.send(old)


def test_unsynced_device_takes_fresh_commands_and_refuses_stale_ones(tmp_path):
    """Seven days behind and unsynced from the start: commands are not refused until the
    sync; the first verified command sets the floor, and one that expired before it is
    refused, by the coordinator's own clock."""
    d = Device(tmp_path / "keep.json")
    d.reboot(wall=REAL - 7 * DAY, synced=False)
    assert d.send(sign(REAL)) == "ok"
    stale = sign(REAL - 1200, ttl=600)  # held back by an attacker, expired 10 min ago
    assert "expired" in d.send(stale)
    d.elapse(30)
    assert d.send(sign(REAL + 30)) == "ok"


@pytest.mark.parametrize("wall", [0.0, REAL - 7 * DAY, REAL - 3600, 4.1e9])
def test_unsynced_clock_at_any_reading_accepts_once_refuses_again(tmp_path, wall):
    d = Device(tmp_path / "keep.json")
    d.reboot(wall=wall, synced=False)
    cmd = sign(REAL)
    assert d.send(cmd) == "ok"
    assert "replayed" in d.send(cmd)
    d.elapse(7 * DAY)  # boottime runs on: the floor moves with it
    assert "expired" in d.send(cmd)


@pytest.mark.parametrize("wall", [4.2e9, 0.0])  # an RTC reading 2103; one at 1970
def test_a_replay_record_lost_on_an_unsynced_clock_waits_for_the_sync(tmp_path, wall):
    """The record lost while the clock reads 2103: not_before must not stay there once
    synced (every command refused for good). At 1970: a captured command must not pass."""
    d = Device(tmp_path / "keep.json")
    captured = sign(REAL - 3600, ttl=DAY)  # accepted an hour ago, captured
    assert d.send(captured) == "ok"
    with mock.patch.object(time, "time", return_value=wall):
        d.reboot(wall=wall, synced=False, lost=True)
        d.bt = 10.0
        assert "until the clock syncs" in d.send(captured)
        assert "until the clock syncs" in d.send(sign(REAL))  # nothing passes before it
    assert json.loads(d.path.read_text())["not_before"] == 0.0  # nothing from that clock
    d.elapse(30)  # the sync, 30 s after the reset, same kernel boot
    d.wall, d.synced = REAL + 30, True
    assert "replay record was reset" in d.send(captured)
    assert d.send(sign(REAL + 5)) == "ok"  # issued after the reset: accepted
    assert d.side.not_before == REAL  # the reset's moment, by the synced clock
    saved = json.loads(d.path.read_text())["not_before"]
    assert clock.FLOOR_T <= saved <= clock.CEILING_T and "not_before_pending" not in \
        json.loads(d.path.read_text())
    d.reboot(wall=REAL + 60, synced=True)
    assert d.send(sign(REAL + 60)) == "ok"  # not refused for good after a restart


def test_a_pending_reset_survives_a_restart_and_an_old_implausible_not_before(tmp_path):
    path = tmp_path / "keep.json"
    path.write_text(json.dumps({"evicted_total": 0, "not_before": 4.2e9, "seen_commands": {}}))
    side = Sidecar(path, lost_history=False)  # written by an older version at 2103
    assert side.pending is not None and side.not_before == float("inf")
    assert Sidecar(path, lost_history=False).pending is not None  # still after a restart
    side.settle_not_before(True, REAL, "k", 5.0)
    assert side.not_before == REAL
    assert Sidecar(path, lost_history=False).not_before == REAL


@pytest.mark.parametrize("synced, judged, issued, known", [
    (True, REAL, REAL - 5, (REAL, "clock")),
    (True, REAL, REAL + 30, (REAL, "clock")),  # synced: this clock, whatever was signed
    (False, REAL, REAL + 30, (REAL + 30, "command")),  # unsynced: the coordinator's, later
    (False, REAL, REAL - 30, (REAL, "clock")),
])
def test_floor_source(synced, judged, issued, known):
    assert commands.floor_source(synced, judged, issued) == known


@pytest.mark.parametrize("by, says, not_says", [
    ("clock", "this clock stepped back", "coordinator"),
    ("command", "a command signed by a coordinator", "stepped back"),
    ("", "or a command", ""),
])
def test_floor_blame_names_what_raised_it(by, says, not_says):
    why = commands.floor_blame(by)
    assert says in why and (not not_says or not_says not in why)


def test_a_synced_clock_stepped_back_is_blamed_and_not_the_coordinator(tmp_path, caplog):
    """A device whose synced clock took commands, then stepped back an hour (a wrong time
    server): the ERROR said "or a command was signed by a coordinator clock ahead" when
    no command had raised the floor. What raised it is kept with the floor, restarts too."""
    d = Device(tmp_path / "keep.json")
    assert d.send(sign(REAL)) == "ok"
    assert d.side.floor.by == "clock"
    d.reboot(wall=REAL + 60, synced=True)  # kept across a restart
    assert d.side.floor.by == "clock"
    d.wall -= 3600
    with caplog.at_level("ERROR"):
        d.send(sign(d.wall))
    assert "this clock stepped back" in caplog.text and "coordinator" not in caplog.text


def test_a_floor_raised_by_a_coordinator_clock_at_2099_does_not_lock_out(tmp_path, caplog):
    """Unsynced, the floor follows verified commands' issue times; one signed by a
    coordinator reading 2099 left it there and, once synced, every command was expired."""
    d = Device(tmp_path / "keep.json")
    d.reboot(wall=REAL - 7 * DAY, synced=False)
    before = sign(REAL - 60, ttl=DAY)
    assert d.send(before) == "ok"
    assert d.send(sign(4_100_000_000.0)) == "ok"  # the coordinator's clock at 2099, once
    assert d.side.floor.t == 4_100_000_000.0
    d.elapse(60)
    d.wall, d.synced = REAL, True  # synced
    with caplog.at_level("ERROR"):
        assert "replay record was reset" in d.send(sign(REAL - 1))  # ids may have gone
    assert "signed by a coordinator whose clock was ahead" in caplog.text
    assert d.side.floor.t == REAL  # lowered to the synced clock, and written
    assert Sidecar(d.path, lost_history=False).floor.t == REAL
    d.elapse(1)
    assert d.send(sign(d.wall)) == "ok"  # a fresh command works again
    assert "replay" in d.send(before)  # the one accepted before is still refused


def test_the_floor_is_never_raised_past_2100():
    f = Floor(REAL, "a", 1.0)
    assert f.raised(clock.CEILING_T + 1, "a", 2.0) == f
    assert f.raised(float("nan"), "a", 2.0) == f
    assert f.raised(REAL + 5, "a", 2.0).t == REAL + 5


@pytest.mark.parametrize("t, by", [
    (REAL + 5, "command"),  # the floor carried forward by boottime: still the command's
    (REAL + 6, "clock"),  # later than it: the new reading raised it
])
def test_a_floor_carried_forward_keeps_what_raised_it(t, by):
    f = Floor(REAL, "a", 1.0, "command")
    assert f.raised(t, "a", 6.0, "clock") == Floor(t, "a", 6.0, by)


@pytest.mark.parametrize("t, kb, bt", [
    (REAL + 3, "a", 6.0),  # later than the recorded time, but behind it carried forward
    (REAL + 5, "a", 1000.0),
])
def test_a_floor_is_never_lowered_by_a_time_behind_it_carried_forward(t, kb, bt):
    """The floor at REAL recorded at boottime 1 is REAL + 5 at boottime 6: a time below that
    (a command signed a moment before it came) must not replace it, rebased on now, which
    would lower the floor and let expired commands and dropped ids pass again."""
    f = Floor(REAL, "a", 1.0, "command")
    assert f.raised(t, kb, bt, "clock") == f


def test_a_command_raised_floor_carried_forward_still_blames_the_coordinator(tmp_path, caplog):
    """Unsynced, a second command from a coordinator clock ahead arrives a little after it
    was signed (its issue time below the floor carried forward by boottime): the floor,
    still the coordinator's, was relabelled "clock", and once synced the ERROR blamed this
    clock stepping back, which had never been synced."""
    d = Device(tmp_path / "keep.json")
    d.reboot(wall=REAL - 7 * DAY, synced=False)
    assert d.send(sign(REAL + 3600, ttl=DAY)) == "ok"  # the coordinator an hour ahead
    assert d.side.floor.by == "command"
    d.elapse(10)
    assert d.send(sign(REAL + 3600 + 9, ttl=DAY)) == "ok"  # signed 1 s before it arrived
    assert d.side.floor.by == "command"
    d.elapse(10)
    d.wall, d.synced = REAL + 20, True
    with caplog.at_level("ERROR"):
        d.send(sign(d.wall))
    assert "signed by a coordinator whose clock was ahead" in caplog.text
    assert "this clock stepped back" not in caplog.text


@pytest.mark.parametrize("by, kept", [
    ("clock", "clock"), ("command", "command"),
    (None, ""), (123, ""), (["clock"], ""), ("x" * 1_000_000, ""),  # not one of ours
])
def test_a_replay_record_keeps_only_a_known_floor_source(tmp_path, by, kept):
    """`by` read back from the record is one this version wrote or nothing: any other value
    (a hand-edited or damaged record) was kept as its str() and written again with every id."""
    path = tmp_path / "keep.json"
    path.write_text(json.dumps({"evicted_total": 0, "not_before": 0, "seen_commands": {},
                                "floor": {"t": REAL, "kb": "k", "bt": 5.0, "by": by}}))
    assert Sidecar(path, lost_history=False).floor == Floor(REAL, "k", 5.0, kept)
