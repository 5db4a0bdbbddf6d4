"""The replay record's bounds where they lie exactly (runtime/telemetry/sidecar.py): how many
ids it keeps, how far ahead, what a refused write leaves, and the eviction counter."""

from __future__ import annotations

import errno

import pytest

from runtime.telemetry import sidecar
from runtime.telemetry.sidecar import Sidecar
from runtime.wire.commands import CommandRefused

NOW = 1_790_000_000.0


def _side(tmp_path) -> Sidecar:
    return Sidecar(tmp_path / "o.db.keep.json", lost_history=False)


def test_at_most_max_ids_are_remembered(tmp_path, monkeypatch):
    monkeypatch.setattr(sidecar, "MAX_IDS", 2)
    side = _side(tmp_path)
    assert side.remember("a", NOW + 60, NOW) and side.remember("b", NOW + 60, NOW)
    with pytest.raises(CommandRefused, match="2 unexpired command ids"):
        side.remember("c", NOW + 60, NOW)


@pytest.mark.parametrize(("ahead_s", "ok"), [(100.0, True), (100.5, False)])
def test_an_id_is_remembered_up_to_exactly_keep_s_ahead(tmp_path, ahead_s, ok):
    side = _side(tmp_path)
    side.bound(100.0)
    if ok:
        assert side.remember("a", NOW + ahead_s, NOW)
    else:
        with pytest.raises(CommandRefused, match="past the 100 s"):
            side.remember("a", NOW + ahead_s, NOW)


def test_an_id_the_disk_refused_to_record_is_not_remembered(tmp_path, monkeypatch):
    """Refused, not half-kept: the command sent again once the disk takes writes is taken,
    not refused as a replay of itself."""
    side = _side(tmp_path)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(sidecar, "write_atomic", full)
        with pytest.raises(CommandRefused, match="cannot record the command id"):
            side.remember("a", NOW + 60, NOW)
    assert side.remember("a", NOW + 60, NOW)
    assert not side.remember("a", NOW + 60, NOW)  # now a replay


def test_the_eviction_counter_never_goes_back(tmp_path):
    side = _side(tmp_path)
    side.set_evicted_total(5)
    side.set_evicted_total(3)
    assert side.evicted_total == 5 == _side(tmp_path).evicted_total


@pytest.mark.parametrize(("kb", "bt", "want"), [
    ("k1", 100.0, NOW - 95.0),  # the same kernel boot: the reset was 95 s of boottime ago
    ("k2", 100.0, NOW),  # another boot: its boottime says nothing of the reset's moment
])
def test_a_lost_record_s_moment_by_the_first_synced_reading(tmp_path, kb, bt, want):
    """A replay record lost at kernel boot k1, boottime 5 s; the first synced reading, NOW, at
    boottime 100 s of boot `kb`: commands issued before the loss's moment are refused."""
    side = Sidecar(tmp_path / "o.db.keep.json", lost_history=True)
    side.settle_not_before(False, 0.0, "k1", 5.0)  # the publisher first sees it unsynced
    side.settle_not_before(True, NOW, kb, bt)
    assert side.not_before == want


def test_settling_a_lost_record_never_moves_not_before_back(tmp_path):
    """The synced clock lowered a wrong floor (lower_floor: commands before it are refused)
    while the lost record's moment waited: settling it at an earlier moment keeps the later
    refusal."""
    side = Sidecar(tmp_path / "o.db.keep.json", lost_history=True)
    side.settle_not_before(False, 0.0, "k1", 5.0)
    side.lower_floor(NOW + 50.0, "k1", 50.0)
    side.settle_not_before(True, NOW, "k1", 100.0)  # the loss was at NOW - 95
    assert side.not_before == NOW + 50.0
