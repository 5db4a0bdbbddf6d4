"""Commands while the clock is not synced (docs/clocks.md): expiry judged against the latest
time known to have passed, never an unsynced wall clock; no replay across clock steps and
restarts; and no refusing every command until the sync."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from runtime.telemetry.sidecar import Sidecar
from runtime.wire import commands
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
    (REAL, REAL + 60, REAL, True, REAL + 3600, "expired"),  # never below a known time
    # unsynced at 1970: a fresh command is accepted (not "issued in the future")
    (REAL, REAL + 60, 0.0, False, 0.0, None),
    (REAL, REAL + 60, 0.0, False, REAL - DAY, None),
    # ... one expired before a time known to have passed is refused
    (REAL - 120, REAL - 60, 0.0, False, REAL, "expired 60 s ago (by the latest time known"),
    # unsynced at 2100: a fresh command is accepted (not "expired 74 years ago")
    (REAL, REAL + 60, 4.1e9, False, REAL - 5, None),
    # unsynced 7 days behind, no floor yet: judged on its lifetime and id only
    (REAL - 30, REAL + 30, REAL - 7 * DAY, False, 0.0, None),
])
def test_time_problem(issued, expires, wall, synced, floor, refused):
    why = commands.time_problem(issued, expires, wall, synced, floor, SKEW)
    assert (why is None) if refused is None else (refused in (why or "")), why


@pytest.mark.parametrize("floor, kb, bt, now", [
    (Floor(), "a", 5.0, 0.0),
    (Floor(REAL, "a", 100.0), "a", 160.0, REAL + 60),  # advanced by boottime, same boot
    (Floor(REAL, "a", 100.0), "b", 5.0, REAL),  # rebooted: the time down is unknown
    (Floor(REAL, "a", 100.0), "a", 50.0, REAL),  # boottime behind it: not moved back
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

    def _open(self) -> Sidecar:
        side = Sidecar(self.path, lost_history=False)
        side.bound(commands.memory_bound(DAY, SKEW))
        return side

    def reboot(self, wall: float, synced: bool) -> None:
        self.side = self._open()
        self.wall, self.synced, self.kb, self.bt = wall, synced, self.kb + "'", 10.0

    def elapse(self, s: float) -> None:
        self.wall += s
        self.bt += s

    def send(self, env: dict) -> str:
        side = self.side
        floor_now = side.floor.now(self.kb, self.bt)
        at = commands.judged_now(self.wall, self.synced, floor_now)

        def remember(cid: str, expires: float) -> bool:
            side.raise_floor(at if self.synced else max(at, env["issued_at"]), self.kb,
                             self.bt)
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
