"""A full disk degrades, it does not crash (runtime/telemetry/held.py, outbox.py).

The disk is real: a small tmpfs mounted for the test (root only; the tests skip elsewhere,
saying so), filled with a file until it refuses writes (ENOSPC), then freed. First the outbox
alone, then a real `edgerun serve` whose state directory is on that tmpfs."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from support.daemon_harness import (
    Serve,
    events,
    result_seqs,
    write_broker_config,
    write_config,
)
from support.daemon_harness import results as results_of
from support.waiting import wait
from support.web import gauges

from models import bundled
from runtime.config.telemetry import OutboxConfig
from runtime.telemetry import resultlog
from runtime.telemetry.held import OutboxFull, unwritable
from runtime.telemetry.outbox import MEMORY_STREAM_PREFIX, Outbox
from runtime.wire.broker import free_port


class Disk:
    """A tmpfs of `size_mb` (and `inodes` files, when given) at `path`; `fill()` takes every
    free byte, `free()` gives it back, `take_inodes()` takes every inode left."""

    def __init__(self, path: Path, size_mb: int, inodes: int = 0):
        self.path = path
        path.mkdir(parents=True)
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs (a real full disk) needs root")
        opts = f"size={size_mb}m" + (f",nr_inodes={inodes}" if inodes else "")
        got = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)],
                             capture_output=True, text=True)
        if got.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()}")
        self.filler = path / "filler"

    def fill(self) -> None:
        """Write until the file system says ENOSPC (unbuffered: every byte is really asked
        for), in big blocks then small ones, so not even a page is left."""
        with self.filler.open("ab", buffering=0) as f:
            for size in (1 << 20, 64 << 10, 4096, 512, 1):
                block = b"\0" * size
                try:
                    while f.write(block):
                        pass
                except OSError as e:
                    assert e.errno == errno.ENOSPC, e

    def free(self) -> None:
        self.filler.unlink()

    def take_inodes(self) -> None:
        """Make empty files until no inode is left (bytes stay free)."""
        n = 0
        with contextlib.suppress(OSError):
            while True:
                (self.path / f"f{n}").touch()
                n += 1

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False)


@pytest.fixture
def disk(tmp_path):
    d = Disk(tmp_path / "disk", 8)
    yield d
    d.unmount()


def _result(i: int) -> dict:
    return {"t": 1.0 + i, "label": "ok", "score": 0.5, "pad": "x" * 200}


def test_unwritable_table():
    import sqlite3

    full = sqlite3.OperationalError("database or disk is full")
    full.sqlite_errorcode = 13
    ioerr = sqlite3.OperationalError("disk I/O error")
    ioerr.sqlite_errorcode = 778  # SQLITE_IOERR_WRITE (extended)
    locked = sqlite3.OperationalError("database is locked")
    locked.sqlite_errorcode = 5
    assert unwritable(full) and unwritable(ioerr) and not unwritable(locked)
    assert unwritable(OSError(errno.ENOSPC, "full")) and unwritable(OSError(errno.EFBIG, "big"))
    assert not unwritable(OSError(errno.EACCES, "denied")) and not unwritable(ValueError("x"))


def test_an_outage_is_timed_on_the_monotonic_clock():
    """The recovery event's `down_s` was the wall clock's difference: a box that began an
    outage at a stale time (no RTC) and synced during it reported a week of outage for 0 s."""
    from runtime.telemetry.held import Held

    h = Held(max_bytes=1 << 20, retry_s=5.0)
    week = 7 * 86400
    assert h.start(OSError(errno.ENOSPC, "full"), time.time() - week)  # a week behind then
    done = h.clear()  # the clock synced meanwhile
    assert 0 <= done["down_s"] < 60, done


def test_outbox_holds_in_memory_and_flushes_when_space_returns(disk):
    seen: list[dict] = []
    ob = Outbox(OutboxConfig(path=str(disk.path / "outbox.db"), memory_max_bytes=64 << 10,
                             retry_s=0.1), on_event=seen.append)
    first = ob.append_many([_result(i) for i in range(10)])
    assert first == list(range(1, 11))
    disk.fill()
    seqs, i = [], 10
    while not ob.stats()["disk_full"]:  # the WAL may have room left for a few more
        seqs += ob.append_many([_result(i)])
        i += 1
        assert i < 100_000, "the full disk never refused a write"
    assert [e["type"] for e in seen] == ["outbox_disk_full"]
    # the result log's ENOSPC or SQLite's "database or disk is full": the first write refused
    assert seen[0]["severity"] == "critical" and ("full" in seen[0]["error"]
                                                  or "No space" in seen[0]["error"])
    on_disk = ob.last_seq()
    # results keep getting seqs, in order, held in memory up to the bound
    while True:
        try:
            seqs += ob.append_many([_result(i)])
        except OutboxFull as e:
            assert "memory_max_bytes" in str(e)
            break
        i += 1
    assert seqs == list(range(11, seqs[-1] + 1)) and seqs[-1] > on_disk
    st = ob.stats()
    assert st["held_in_memory"] == seqs[-1] - on_disk and st["refused_full_total"] == 1
    assert 0 < st["held_bytes"] <= 64 << 10
    # nothing held is published before it is on disk
    assert [p.seq for p in ob.pending(0, 10_000)][-1] == on_disk
    # health and events are sent from memory meanwhile (the operator hears of it at once)
    hid = ob.put("health", {"v": 1, "t": 2.0})
    assert (hid, "health") in [(r[0], r[1]) for r in ob.others(64)]
    ob.remove([hid])
    assert hid not in [r[0] for r in ob.others(64)]
    ob.ack(3)  # the coordinator acked: applied now or with the flush
    assert ob.retry() is False  # still full

    disk.free()
    deadline_tries = 200
    while not ob.retry():
        deadline_tries -= 1
        assert deadline_tries, "the outbox never wrote again after space returned"
        time.sleep(0.05)
    assert seen[-1]["type"] == "outbox_disk_recovered" and seen[-1]["results"] > 0
    st = ob.stats()
    assert not st["disk_full"] and st["held_in_memory"] == 0
    held = [p.seq for p in ob.pending(0, 100_000)]
    assert held == list(range(4, seqs[-1] + 1))  # contiguous, the ack applied, nothing lost
    assert json.loads(ob.pending(seqs[-2], 1)[0].json)["t"] == 1.0 + seqs[-1] - 1
    assert ob.append_many([_result(0)]) == [seqs[-1] + 1]  # back to normal
    ob.close()
    reopened = Outbox(OutboxConfig(path=str(disk.path / "outbox.db")))
    assert reopened.last_seq() == seqs[-1] + 1
    reopened.close()


def test_an_idle_daemons_outage_ends_with_its_health(disk):
    """The flush of what waits in memory was tried only at the next result (or a retry()
    nothing called): a source gone idle (a folder at the end of a shift) left the outbox
    saying disk_full, its held results unpublished and lost to a kill -9, for as long as no
    new result came, though the disk had space again. Health, put every interval, retries."""
    ob = Outbox(OutboxConfig(path=str(disk.path / "outbox.db"), retry_s=0.01))
    ob.append_many([_result(0)])
    disk.fill()
    i = 1
    while not ob.stats()["disk_full"]:
        ob.append_many([_result(i)])
        i += 1
        assert i < 100_000, "the full disk never refused a write"
    held = ob.stats()["held_in_memory"]
    assert held >= 1
    disk.free()
    for _ in range(200):  # the daemon's health ticks, no result between them
        time.sleep(0.02)
        ob.put("health", {"v": 1, "t": 2.0})
        if not ob.stats()["disk_full"]:
            break
    assert not ob.stats()["disk_full"], "the outage never ended without a result"
    assert [p.seq for p in ob.pending(0, 100_000)][-1] == i  # on disk: publishable
    ob.close()


def _flushed(ob: Outbox) -> None:
    """Retry until what the outbox held in memory is stored (space is back), at most 10 s."""
    tries = 200
    while not ob.retry():
        tries -= 1
        assert tries, "what was held in memory never reached the disk"
        time.sleep(0.05)


def test_outbox_opened_on_a_full_disk_starts_degraded(disk):
    """A restart (the old process killed: its WAL files are still there) on a full disk runs
    degraded instead of exiting. (One whose WAL files are gone cannot even open the database
    on a full disk: it exits with one line, OutboxUnavailable, and systemd retries.)"""
    path = disk.path / "outbox.db"
    killed = Outbox(OutboxConfig(path=str(path)))  # left open: as after kill -9
    killed.append_many([_result(0)])
    disk.fill()
    seen: list[dict] = []
    ob = Outbox(OutboxConfig(path=str(path), retry_s=0.1), on_event=seen.append)
    start = ob.take_startup_event()
    assert start is not None and start["type"] == "outbox_disk_full", start
    assert ob.stats()["disk_full"] and ob.append_many([_result(1)]) == [2]
    disk.free()
    _flushed(ob)
    assert [p.seq for p in ob.pending(0, 10)] == [1, 2]
    ob.close()
    killed.close()


def test_an_outbox_opened_on_a_full_disk_after_a_clean_stop_starts_degraded(disk, caplog):
    """A cleanly stopped outbox (no -wal or -shm file left) on a disk that filled meanwhile:
    SQLite cannot make its shared-memory file (`disk I/O error`), and the daemon exited to be
    retried, every 5 s for as long as the disk stayed full, inspecting nothing. It opens the
    database for this process alone (its WAL index in memory, no -shm needed), starts
    degraded as after a crash, and stores what it held once space returns. (Other readers,
    `edgerun report`, see the database locked until the next start: said in the log.)"""
    path = disk.path / "outbox.db"
    box = Outbox(OutboxConfig(path=str(path)))
    box.append_many([_result(0)])
    box.close()
    assert not Path(f"{path}-shm").exists()
    disk.fill()
    seen: list[dict] = []
    with caplog.at_level("WARNING", logger="edgerun.outbox"):
        ob = Outbox(OutboxConfig(path=str(path), retry_s=0.1), on_event=seen.append)
    start = ob.take_startup_event()
    assert start is not None and start["type"] == "outbox_disk_full", start
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "this process alone" in said and str(disk.path) in said, said
    assert ob.stats()["disk_full"] and ob.append_many([_result(1)]) == [2]
    disk.free()
    _flushed(ob)
    assert [p.seq for p in ob.pending(0, 10)] == [1, 2]
    ob.close()
    reopened = Outbox(OutboxConfig(path=str(path)))  # shared again: a normal open
    assert [p.seq for p in reopened.pending(0, 10)] == [1, 2]
    reopened.close()


def _memory_only_outbox(path: Path, disk_stream: str, caplog) -> None:
    """An outbox at `path` (one result stored there before) that can make no file: it runs
    in memory under the boot's memory stream instead of exiting into a restart loop (every
    5 s, nothing inspected, until someone repairs the disk); health says the disk refuses
    writes; its unacked results are counted lost at close; the disk's outbox is left as it
    was."""
    seen: list[dict] = []
    with caplog.at_level("CRITICAL", logger="edgerun.outbox"):
        ob = Outbox(OutboxConfig(path=str(path), memory_max_bytes=4096), on_event=seen.append)
    start = ob.take_startup_event()
    assert start is not None and start["type"] == "outbox_disk_full" and start["memory_only"]
    assert start["severity"] == "critical" and ob.memory_only
    said = " ".join(r.getMessage() for r in caplog.records)
    assert str(path) in said and "memory only" in said and ob.stream in said, said
    assert ob.stream != disk_stream  # the disk's seqs may be above what it can read
    assert ob.stream.startswith(MEMORY_STREAM_PREFIX)
    q = ob.append_many([_result(i) for i in range(3)])
    assert q == [q[0], q[0] + 1, q[0] + 2] and q[0] > 1  # from CLOCK_BOOTTIME (us)
    assert ob.ack(q[0]) == 1 and [p.seq for p in ob.pending(0, 10)] == q[1:]
    st = ob.stats()
    assert st["disk_full"] and st["held_in_memory"] == 2 and st["results_held"] == 2, st
    assert st["held_bytes"] == st["bytes"] > 0, st  # all of it is in memory
    for i in range(40):  # past memory_max_bytes: the oldest evicted, said, as on disk
        ob.append_many([_result(10 + i)])
    assert ob.stats()["bytes"] <= 4096 and any(e["type"] == "outbox_evicting" for e in seen)
    held = ob.stats()["held_in_memory"]
    with caplog.at_level("CRITICAL", logger="edgerun.outbox"):
        assert ob.close() == held
    lost = [r.getMessage() for r in caplog.records if "closing an outbox" in r.getMessage()]
    assert len(lost) == 1 and f"{held} results" in lost[0] and ob.stream in lost[0], lost
    assert not [r for r in caplog.records if "cannot write" in r.getMessage()]  # said once
    # the disk's outbox as it was: its one result in its log (no -shm can be made to read
    # the database but immutably)
    assert [q for q, _ in resultlog.read(Path(f"{path}.log")).results] == [1]
    disk = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    assert disk.execute("SELECT v FROM meta WHERE k='stream'").fetchall() == [(disk_stream,)]
    disk.close()


@pytest.mark.parametrize("fault", ["no inodes", "read-only"])
def test_an_outbox_whose_disk_can_make_no_file_at_start_runs_in_memory(tmp_path, caplog, fault):
    """A restart on a disk that can make no file: bytes free but no inode left (a snapshot
    folder on the state partition can take them all), or a card's ext4 gone read-only
    (errors=remount-ro) that will not come back by itself. SQLite cannot make its -wal and
    -shm files, and the daemon exited to be retried every 5 s, inspecting nothing. It runs
    in memory (_memory_only_outbox), the line naming the cause."""
    disk = Disk(tmp_path / "disk", 8, inodes=8) if fault == "no inodes" else \
        Ext4(tmp_path / "ext4", 16)
    try:
        path = disk.path / "outbox.db"
        box = Outbox(OutboxConfig(path=str(path)))
        box.append_many([_result(0)])
        box.close()
        if isinstance(disk, Disk):
            disk.take_inodes()
        else:
            disk.fail()
        _memory_only_outbox(path, box.stream, caplog)
        said = " ".join(r.getMessage() for r in caplog.records)
        assert ("no free inodes" if fault == "no inodes" else "read-only") in said, said
        assert str(disk.path) in said, said
    finally:
        disk.unmount()


def test_restarts_in_memory_in_one_boot_carry_on_one_stream(tmp_path, monkeypatch):
    """A daemon on a card that can make no file, restarted by systemd every 5 s (each start
    crashes or is killed): each start made a new random stream, and the coordinator keeps at
    most 256 a device (MAX_STREAMS_PER_DEVICE), refusing every result past them from ~21
    minutes on. A start in the same kernel boot carries on the boot's memory stream, its
    seqs above every one an earlier start gave (CLOCK_BOOTTIME in microseconds); a new boot
    (another kernel boot id) is another stream."""
    from runtime.telemetry import outbox as outbox_mod

    boot = tmp_path / "boot_id"
    boot.write_text("5d8a0c1e-0f9b-4c8e-9d7a-1b2c3d4e5f60\n")
    monkeypatch.setattr(outbox_mod, "BOOT_ID", boot)  # the kernel's, as a file a test writes
    disk = Disk(tmp_path / "disk", 8, inodes=8)
    try:
        path = disk.path / "outbox.db"
        box = Outbox(OutboxConfig(path=str(path)))
        box.append_many([_result(0)])
        box.close()
        disk.take_inodes()
        starts, seqs = [], []
        for i in range(3):  # killed each time: nothing closed, its unacked results gone
            ob = Outbox(OutboxConfig(path=str(path)))
            assert ob.memory_only
            starts.append(ob.stream)
            seqs.append(ob.append_many([_result(i), _result(i + 1)]))
        assert starts == [starts[0]] * 3 and starts[0].startswith(MEMORY_STREAM_PREFIX)
        assert seqs[0][0] < seqs[0][1] < seqs[1][0] < seqs[1][1] < seqs[2][0] < seqs[2][1]
        assert all(b == a + 1 for a, b in seqs)  # consecutive within a start
        boot.write_text("0e4f27aa-3b11-4a52-8f00-aa55aa55aa55\n")  # rebooted
        other = Outbox(OutboxConfig(path=str(path)))
        assert other.memory_only and other.stream != starts[0]
        assert other.stream.startswith(MEMORY_STREAM_PREFIX)
        other.close()
    finally:
        disk.unmount()


def test_a_memory_stream_without_a_boot_id_is_one_a_start(tmp_path):
    """Where the kernel gives no boot id (not Linux), a memory stream cannot be carried on
    safely: a random one each start, from seq 1 (still `mem-`: its outbox dies with it)."""
    from runtime.telemetry.outbox import memory_stream

    none = tmp_path / "no-boot-id"
    (a, first_a), (b, first_b) = (memory_stream(tmp_path / "o.db", none) for _ in range(2))
    assert a != b and a.startswith(MEMORY_STREAM_PREFIX) and b.startswith(MEMORY_STREAM_PREFIX)
    assert first_a == first_b == 1
    boot = tmp_path / "boot_id"
    boot.write_text("5d8a0c1e-0f9b-4c8e-9d7a-1b2c3d4e5f60\n")
    (c, first_c), (d, first_d) = (memory_stream(tmp_path / "o.db", boot) for _ in range(2))
    assert c == d and first_d >= first_c > 1  # CLOCK_BOOTTIME (us): never back
    assert memory_stream(tmp_path / "other.db", boot)[0] != c  # another outbox, its own


def _body_bytes(ob: Outbox) -> int:
    """The bytes of the results `ob` holds on disk (pending()'s JSON less its '"seq":N,')."""
    return sum(len(p.json) - len(f'"seq":{p.seq},') for p in ob.pending(0, 1_000_000))


def test_a_spill_the_full_disk_refused_evicts_nothing_it_kept(disk, caplog):
    """Results in the log, under max_bytes, the disk filling: each spill into SQLite the
    disk refused counted the log's bytes twice (the rollback's recount had them already),
    and the flush once space returned counted them a third time. Measured before the fix:
    151 of 152 unacked results, 40 KB under a 64 KiB cap, deleted on recovery. Nothing
    under the cap is evicted."""
    ob = Outbox(OutboxConfig(path=str(disk.path / "outbox.db"), max_bytes=65536,
                             spill_after_s=3600, retry_s=0.05))
    i = 0
    with caplog.at_level("WARNING", logger="edgerun.outbox"):
        while ob.stats()["bytes"] < 31000:  # in the log, near the spill threshold (32 KiB)
            ob.append_many([_result(i)])
            i += 1
        disk.fill()
        while not ob.stats()["disk_full"]:  # spills the disk refuses, the log's last page
            ob.append_many([_result(i)])
            i += 1
            assert i < 100_000, "the full disk never refused a write"
            assert ob.stats()["bytes"] == _body_bytes(ob)  # counted once, refused or not
        for _ in range(20):
            ob.append_many([_result(i)])
            i += 1
        assert ob.stats()["evicted_total"] == 0
        disk.free()
        _flushed(ob)
    assert [p.seq for p in ob.pending(0, 10_000)] == list(range(1, i + 1))
    st = ob.stats()
    assert st["evicted_total"] == 0 and st["bytes"] < 65536, st
    assert not [r for r in caplog.records if "evicted" in r.getMessage()]
    ob.close()


def test_an_eviction_the_full_disk_rolled_back_is_neither_said_nor_counted(disk, caplog):
    """An outbox at its cap (no broker for a while) when the disk fills: the insert that
    evicts the oldest is refused and rolled back, but evicted_total had been raised and
    "evicted N oldest unacked results" said for results still there (the coordinator's
    alert on evicted_total then names a loss that did not happen)."""
    ob = Outbox(OutboxConfig(path=str(disk.path / "outbox.db"), max_bytes=65536,
                             spill_after_s=0, retry_s=3600))
    i = 0
    while ob.stats()["evicted_total"] == 0:  # at the cap: each insert evicts
        ob.append_many([_result(i)])
        i += 1
    committed = ob.stats()["evicted_total"]
    held = [p.seq for p in ob.pending(0, 10_000)]
    disk.fill()
    caplog.clear()
    with caplog.at_level("WARNING", logger="edgerun.outbox"):
        while not ob.stats()["disk_full"]:  # batches past 10 % of the cap: each evicts
            ob.append_many([_result(i + k) for k in range(30)])
            i += 30
            assert i < 100_000, "the full disk never refused a write"
    on_disk = [p.seq for p in ob.pending(0, 10_000)]
    evicted = ob.stats()["evicted_total"] - committed  # by the inserts the disk took
    assert on_disk[0] - held[0] == evicted, (on_disk[:3], held[:3], evicted)
    said = sum(int(re.search(r"evicted (\d+)", r.getMessage())[1]) for r in caplog.records
               if "evicted" in r.getMessage())
    assert said == evicted, (said, evicted)
    ob.close()
    disk.free()


@pytest.mark.parametrize("memory_max_bytes", [4096, 0])
def test_a_result_over_the_memory_bound_does_not_delete_the_ones_after_it(tmp_path, caplog,
                                                                          memory_max_bytes):
    """An outbox in memory (a read-only disk at start) bounded below one result's size
    (memory_max_bytes = 0 is a valid setting): the eviction deleted the result just
    written, said "evicted 0", and its bytes stayed counted, so every later result was
    deleted as it was written, none ever published. The newest result is kept (over the
    bound) and those before it go, counted."""
    disk = Ext4(tmp_path / "ext4", 16)
    try:
        path = disk.path / "outbox.db"
        box = Outbox(OutboxConfig(path=str(path)))
        box.append_many([_result(0)])
        box.close()
        disk.fail()
        ob = Outbox(OutboxConfig(path=str(path), memory_max_bytes=memory_max_bytes))
        assert ob.memory_only
        with caplog.at_level("WARNING", logger="edgerun.outbox"):
            (q,) = ob.append_many([{"t": 1.0, "big": "x" * 5000}])
            assert [p.seq for p in ob.pending(0, 10)] == [q]  # kept, though over the bound
            for i in range(3):
                ob.append_many([_result(i)])
        # the big one evicted by the next; under a bound of 0 each by the next
        kept = [q + 1, q + 2, q + 3] if memory_max_bytes else [q + 3]
        assert [p.seq for p in ob.pending(0, 10)] == kept
        st = ob.stats()
        assert st["evicted_total"] == 4 - len(kept), st
        assert st["bytes"] == sum(len(p.json) - len(f'"seq":{p.seq},')  # no '"seq":N,'
                                  for p in ob.pending(0, 10)), st
        said = [r.getMessage() for r in caplog.records if "evicted" in r.getMessage()]
        assert not [m for m in said if "evicted 0 " in m], said
        ob.close()
    finally:
        disk.unmount()


def _killed_and_damaged(path: Path) -> str:
    """An outbox at `path` holding 200 results in its database, its process killed (its -wal
    and -shm left), then a page of its results' table overwritten (meta whole); its stream."""
    box = Outbox(OutboxConfig(path=str(path), spill_after_s=0))
    box.append_many([_result(i) for i in range(200)])
    box.close()
    killed = (f"import os, sqlite3\ndb = sqlite3.connect({str(path)!r})\n"
              "db.execute('CREATE TABLE z (x)')\ndb.commit()\nos._exit(9)\n")
    subprocess.run([sys.executable, "-c", killed], check=False)
    with path.open("r+b") as f:
        f.seek(40960)
        f.write(b"\xff" * 4096)
    return box.stream


def test_a_damaged_outbox_on_a_read_only_disk_at_start_runs_in_memory(tmp_path, caplog):
    """A card failing: the daemon killed (its -wal and -shm left), the database damaged, the
    ext4 gone read-only (errors=remount-ro). Moving the corrupt database aside raised
    OSError (EROFS) out of the outbox: a traceback, and systemd started the daemon into the
    same one every 5 s, inspecting nothing. It runs in memory, under a new stream (not the
    damaged one's: its log's seqs are not read back), the damaged files left as they were."""
    disk = Ext4(tmp_path / "ext4", 16)
    try:
        path = disk.path / "outbox.db"
        stream = _killed_and_damaged(path)
        assert Path(f"{path}-wal").exists() and Path(f"{path}-shm").exists()
        before = sorted(p.name for p in disk.path.iterdir())
        disk.fail()
        with caplog.at_level("CRITICAL", logger="edgerun.outbox"):
            ob = Outbox(OutboxConfig(path=str(path)))
        start = ob.take_startup_event()
        assert ob.memory_only and start is not None and start["memory_only"], start
        assert ob.stream != stream
        assert ob.append_many([_result(0)]) == [ob.last_seq()]
        assert sorted(p.name for p in disk.path.iterdir()) == before
        ob.close()
    finally:
        disk.unmount()


def test_a_damaged_outbox_on_a_disk_out_of_inodes_runs_in_memory(tmp_path, caplog):
    """The daemon killed, its database damaged, no inode left: the corrupt database was
    moved aside (a rename needs no inode) and the empty outbox meant to replace it could not
    be made: SQLite's OperationalError out of the outbox, a traceback; the next start found
    no outbox (moved) and exited as at a first start, every 5 s. It runs in memory, the
    line naming where the damaged outbox went."""
    disk = Disk(tmp_path / "disk", 8, inodes=16)
    try:
        path = disk.path / "outbox.db"
        stream = _killed_and_damaged(path)
        disk.take_inodes()
        with caplog.at_level("CRITICAL", logger="edgerun.outbox"):
            ob = Outbox(OutboxConfig(path=str(path)))
        assert ob.memory_only and ob.stream != stream
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "memory only" in said and ".corrupt-" in said, said
        assert ob.append_many([_result(0)]) == [ob.last_seq()]
        ob.close()
    finally:
        disk.unmount()


def test_closing_on_a_full_disk_stores_held_results_or_says_which_are_lost(disk, caplog):
    """close() gives what waits in memory one last try: space back, nothing lost; the disk
    still full, one critical line naming how many results and which seqs are lost."""
    def degraded(path: Path) -> tuple[Outbox, list[int]]:
        ob = Outbox(OutboxConfig(path=str(path), retry_s=3600))  # no retry before close
        ob.append_many([_result(0)])
        disk.fill()
        seqs, i = [], 1
        while not ob.stats()["disk_full"] or len(seqs) < 3:
            seqs += ob.append_many([_result(i)])
            i += 1
            assert i < 100_000, "the full disk never refused a write"
        return ob, [s for s in seqs if s > ob.last_seq()]

    ob, held = degraded(disk.path / "a.db")
    assert held, "nothing waited in memory"
    disk.free()
    assert ob.close() == 0  # nothing lost
    reopened = Outbox(OutboxConfig(path=str(disk.path / "a.db")))
    assert reopened.last_seq() == held[-1]  # stored at close
    reopened.close()

    ob, held = degraded(disk.path / "b.db")
    with caplog.at_level("CRITICAL", logger="edgerun.outbox"):
        ob.close()
    lost = [r.getMessage() for r in caplog.records if "are lost" in r.getMessage()]
    assert len(lost) == 1 and f"{len(held)} results" in lost[0], lost
    assert f"seq {held[0]}-{held[-1]}" in lost[0], lost
    disk.free()


class Ext4:
    """An ext4 on a loop device at `path`, mounted `errors=remount-ro` as a Raspberry Pi's root
    is; `fail()` makes the kernel see a filesystem error (its sysfs `trigger_fs_error`), so it
    turns read-only under the open files, as a failing SD card's does (a plain `mount -o
    remount,ro` is refused while a file is open for writing)."""

    def __init__(self, path: Path, size_mb: int):
        self.path, self.image = path, path.with_suffix(".img")
        path.mkdir(parents=True)
        if os.geteuid() != 0:
            pytest.skip("mounting an ext4 image needs root")
        with self.image.open("wb") as f:
            f.truncate(size_mb << 20)
        for cmd in (["mkfs.ext4", "-q", "-F", str(self.image)],
                    ["mount", "-o", "loop,errors=remount-ro", str(self.image), str(path)]):
            got = subprocess.run(cmd, capture_output=True, text=True)
            if got.returncode != 0:
                pytest.skip(f"cannot make an ext4 here ({cmd[0]}): {got.stderr.strip()}")
        dev = subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(path)], capture_output=True,
                             text=True).stdout.strip()
        self.trigger = Path("/sys/fs/ext4") / Path(dev).name / "trigger_fs_error"

    def fail(self) -> None:
        os.sync()  # what was written reaches the image (an aborted journal drops the rest)
        self.trigger.write_text("1\n")

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False)

    def repair(self) -> None:
        """What the operator does: unmount, fsck, mount again (writable)."""
        subprocess.run(["umount", str(self.path)], check=True)
        subprocess.run(["e2fsck", "-fy", str(self.image)], capture_output=True)  # 1: fixed
        subprocess.run(["mount", "-o", "loop,errors=remount-ro", str(self.image),
                        str(self.path)], check=True)


def test_a_state_disk_turned_read_only_holds_results_in_memory(tmp_path, caplog):
    """A card's ext4 gone read-only under the daemon (errors=remount-ro): the result log's
    append fails with EROFS, which was not taken as a refusing disk, so every result appended
    was lost with an ERROR (`could not store 1 results: [Errno 30] Read-only file system`)
    until something else (a health spilled into SQLite) happened to put the outbox in its
    full-disk state. It is one: results wait in memory and it says so."""
    disk = Ext4(tmp_path / "ext4", 16)
    try:
        seen: list[dict] = []
        ob = Outbox(OutboxConfig(path=str(disk.path / "outbox.db"), retry_s=3600),
                    on_event=seen.append)
        assert ob.append_many([_result(i) for i in range(3)]) == [1, 2, 3]
        disk.fail()
        assert ob.append_many([_result(3)]) == [4]  # held, not lost
        st = ob.stats()
        assert st["disk_full"] and st["held_in_memory"] == 1
        assert [e["type"] for e in seen] == ["outbox_disk_full"]
        assert "Read-only file system" in seen[0]["error"], seen
        with caplog.at_level("CRITICAL", logger="edgerun.outbox"):
            assert ob.close() == 1  # the count the daemon's last line leaves out of those kept
        lost = [r.getMessage() for r in caplog.records if "are lost" in r.getMessage()]
        assert len(lost) == 1 and "1 results" in lost[0] and "seq 4-4" in lost[0], lost
    finally:
        disk.unmount()


def _serve_config(tmp_path: Path, tmp_path_factory) -> tuple[int, Path]:
    """A local API port and a config for `serve` retrying a full disk every 0.2 s, holding
    up to 4 MiB in memory meanwhile."""
    port = free_port()
    return port, write_config(tmp_path, tmp_path_factory.mktemp("profiles"),
                              extra=f"retry_s = 0.2\nmemory_max_bytes = 4194304\n"
                                    f"[local_api]\nport = {port}\n")


def _metrics(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return gauges(r.read().decode())


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(), reason="bundled model not built")
def test_a_daemon_survives_its_state_disk_filling_up(tmp_path, tmp_path_factory):
    """`edgerun serve` with its state directory on a tmpfs: filled while it runs, it keeps
    inferring (results_total grows), says so (critical event, health's disk_full), and when
    the space returns it stores what it held, contiguous; no traceback, no restart."""
    disk = Disk(tmp_path / "state", 16)
    try:
        port, cfg = _serve_config(tmp_path, tmp_path_factory)
        d = Serve(tmp_path, cfg)
        try:
            wait(lambda: d.ready() and len(result_seqs(d.outbox)) > 20, 120,
                 "the daemon storing results", d)
            disk.fill()
            wait(lambda: "the disk refuses writes" in d.text(), 60, "the outbox degrading", d)
            wait(lambda: _metrics(port).get("edgerun_device_outbox_disk_full") == 1, 30,
                 "disk_full in health", d)
            stored = len(result_seqs(d.outbox))
            before = _metrics(port)["edgerun_device_results_total"]
            wait(lambda: _metrics(port)["edgerun_device_results_total"] > before + 20, 30,
                 "inference going on while the disk is full", d)
            assert _metrics(port)["edgerun_device_backlog_results"] > stored
            disk.free()
            wait(lambda: "the disk takes writes again" in d.text(), 60, "the outbox recovering",
                 d)
            wait(lambda: _metrics(port).get("edgerun_device_outbox_disk_full") == 0, 30,
                 "disk_full cleared in health", d)
            seqs = result_seqs(d.outbox)
            assert len(seqs) > stored and seqs == list(range(seqs[0], seqs[-1] + 1))
            full = events(d.outbox, "outbox_disk_full")
            assert full and full[0]["severity"] == "critical"
            assert events(d.outbox, "outbox_disk_recovered")
            assert d.proc.poll() is None  # the same process throughout
            assert d.stop() == 0
            assert "Traceback" not in d.text(), d.text()[-3000:]
        finally:
            d.stop()
    finally:
        disk.unmount()


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(), reason="bundled model not built")
def test_a_daemon_started_on_a_full_disk_after_a_clean_stop_serves_degraded(
        tmp_path, tmp_path_factory):
    """The disk filled while the daemon was down (cleanly stopped): the next start crashed
    on its own start-up event (exit 1; test_an_outbox_opened_on_a_full_disk_after_a_clean_
    stop_starts_degraded has the other way it failed, exit 2), and systemd restarted it into
    the same failure every 5 s: nothing was inspected until space returned. It now starts
    degraded, holds results in memory, and stores them once space returns."""
    disk = Disk(tmp_path / "state", 16)
    try:
        port, cfg = _serve_config(tmp_path, tmp_path_factory)
        d = Serve(tmp_path, cfg)
        try:
            wait(lambda: d.ready() and len(result_seqs(d.outbox)) > 5, 120,
                 "the daemon storing results", d)
        finally:
            assert d.stop() == 0
        assert not Path(f"{d.outbox}-shm").exists()  # a clean stop: SQLite removed it
        before = result_seqs(d.outbox)
        disk.fill()
        d = Serve(tmp_path, cfg)
        try:
            wait(lambda: d.ready() or d.proc.poll() is not None, 120, "the daemon starting", d)
            assert d.proc.poll() is None, d.text()[-3000:]
            wait(lambda: _metrics(port).get("edgerun_device_results_total", 0) > 20, 60,
                 "inference on a full disk", d)
            assert _metrics(port)["edgerun_device_outbox_disk_full"] == 1
            assert "the disk refuses writes" in d.text() and "is full" in d.text()
            disk.free()
            wait(lambda: "the disk takes writes again" in d.text(), 60, "the outbox recovering",
                 d)
            assert d.stop() == 0 and "Traceback" not in d.text(), d.text()[-3000:]
        finally:
            d.stop()
        seqs = result_seqs(d.outbox)
        assert seqs[:len(before)] == before and len(seqs) > len(before) + 20
        assert seqs == list(range(seqs[0], seqs[-1] + 1))  # held, then stored: no gap
    finally:
        disk.unmount()


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(), reason="bundled model not built")
def test_a_daemon_whose_state_disk_turns_read_only_says_what_it_lost(tmp_path, tmp_path_factory):
    """`edgerun serve` on an ext4 that turns read-only (a failing card, errors=remount-ro):
    it serves on degraded, and a stop says how many held results were lost; its last line
    said they all "stay in the outbox for the next start" (they were just lost)."""
    disk = Ext4(tmp_path / "state", 32)
    try:
        cfg = write_config(tmp_path, tmp_path_factory.mktemp("profiles"), extra="retry_s = 0.2\n")
        d = Serve(tmp_path, cfg)
        try:
            wait(lambda: d.ready() and len(result_seqs(d.outbox)) > 20, 120,
                 "the daemon storing results", d)
            disk.fail()
            wait(lambda: "the disk refuses writes" in d.text(), 60, "the outbox degrading", d)
            assert "could not store" not in d.text(), d.text()[-3000:]  # nothing lost serving
            assert d.stop() == 0 and "Traceback" not in d.text(), d.text()[-3000:]
        finally:
            d.stop()
        lost = int(re.search(r"(\d+) results held in memory are lost", d.text())[1])
        last = d.text().strip().splitlines()[-1]
        assert lost > 0 and f"({lost} held in memory were lost" in last, last
    finally:
        disk.unmount()


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(), reason="bundled model not built")
def test_a_folder_file_is_not_done_while_its_result_waits_in_memory(tmp_path, tmp_path_factory):
    """A folder source with a done_dir, the state disk full: results wait in memory (not
    durable), but each file was moved to done_dir at once (a rename needs no space), so a
    kill -9 (a power cut) during the outage lost the result and the file was never inspected
    again. A file is done only once its result is on disk; until then it stays, and a restart
    inspects it again; space back while serving, it is done with the next file's store."""
    import signal

    import cv2

    from models.synthetic import samples

    disk = Disk(tmp_path / "state", 8)
    inbox, done = tmp_path / "inbox", tmp_path / "done"
    inbox.mkdir()
    images = [s.image for s in samples(seed=5, count=120)]
    names: list[str] = []

    def drop() -> str:
        name = f"part{len(names)}.png"
        cv2.imwrite(str(tmp_path / name), images[len(names)])
        os.utime(tmp_path / name, (0, 0))  # settled: inspected at once
        os.replace(tmp_path / name, inbox / name)
        names.append(name)
        return name

    def until_held(d: Serve, made: int) -> str:
        """Drop files one at a time, each inspected, until one stays not done: its result
        waits in memory. (A result log has room in its last page: results reach the disk,
        and their files are done, until one needs a new page.) A file is moved in the same
        store that counts its result, before any health can say so."""
        while True:
            assert made < 100, "no file stayed not done while the disk refused its result"
            name = drop()
            made += 1
            wait(lambda n=made: _metrics(port).get("edgerun_device_results_total") == n, 30,
                 "the file inspected", d)
            if (inbox / name).exists():
                assert _metrics(port)["edgerun_device_outbox_disk_full"] == 1
                return name

    try:
        port = free_port()
        cfg = write_config(tmp_path, tmp_path_factory.mktemp("profiles"),
                           source=f'kind = "folder"\npath = "{inbox}"\ndone_dir = "{done}"',
                           extra=f"retry_s = 0.2\n[local_api]\nport = {port}\n")
        d = Serve(tmp_path, cfg)
        try:
            wait(d.ready, 120, "the daemon serving", d)
            drop()
            wait(lambda: [p.name for p in done.glob("*.png")] == names, 30, "a file done", d)
            disk.fill()
            held = until_held(d, 1)
            assert [p.name for p in inbox.iterdir()] == [held]  # not done: not durable
            d.proc.send_signal(signal.SIGKILL)  # a power cut: what waits in memory is lost
            d.proc.wait(30)
        finally:
            d.stop()
        disk.free()
        d = Serve(tmp_path, cfg)
        try:
            wait(lambda: not any(inbox.iterdir()), 60, "the held file inspected again", d)
            assert sorted(p.name for p in done.glob("*.png")) == sorted(names)
            assert {r["ref"] for r in results_of(d.outbox)} >= {held}
            disk.fill()  # again, and space comes back while the daemon serves
            held = until_held(d, 1)
            disk.free()
            wait(lambda: _metrics(port).get("edgerun_device_outbox_disk_full") == 0, 30,
                 "the idle daemon writing again", d)
            wait(lambda: not any(inbox.iterdir()), 30, "the held file done, no new file", d)
            assert held in {p.name for p in done.glob("*.png")}
        finally:
            assert d.stop() == 0
    finally:
        disk.unmount()


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(), reason="bundled model not built")
def test_a_daemon_started_on_a_read_only_state_disk_serves_from_memory(
        tmp_path, broker, coordinator, profile_cache):
    """`edgerun serve` started again on a card gone read-only (errors=remount-ro) after a
    clean stop: it exited with "cannot open the outbox" (exit 2) and systemd started it into
    the same exit every 5 s, inspecting nothing, while a read-only card stays so until
    someone repairs it. It serves with its outbox in memory: its results reach the
    coordinator, every one, under the boot's memory stream, which a second start in the
    same boot carries on; health says the disk refuses writes."""
    disk = Ext4(tmp_path / "state", 32)
    try:
        cfg = write_broker_config(tmp_path, broker, profile_cache)
        d = Serve(tmp_path, cfg)
        try:
            wait(lambda: coordinator.store.counts().get("box1", 0) > 5, 120,
                 "results at the coordinator", d)
        finally:
            assert d.stop() == 0
        (first,), = coordinator.store.read("SELECT DISTINCT stream FROM results WHERE "
                                           "device = 'box1'")
        disk.fail()
        d = Serve(tmp_path, cfg)
        try:
            wait(lambda: d.ready() or d.proc.poll() is not None, 120, "the daemon starting", d)
            assert d.proc.poll() is None, d.text()[-3000:]
            assert "kept in memory only" in d.text() and "read-only" in d.text()
            new = "SELECT seq FROM results WHERE device = 'box1' AND stream != ? ORDER BY seq"
            wait(lambda: len(coordinator.store.read(new, (first,))) > 20, 60,
                 "results from memory at the coordinator", d)
            wait(lambda: ((coordinator.views["box1"].health or {}).get("backlog") or {}
                          ).get("disk_full"), 30, "disk_full in health", d)
            assert d.stop() == 0 and "Traceback" not in d.text(), d.text()[-3000:]
        finally:
            d.stop()
        seqs = [q for (q,) in coordinator.store.read(new, (first,))]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs  # nothing lost
        # started again in the same boot (systemd, after a crash): the same memory stream
        # carried on above the jump, its results stored and acked past it, no new stream
        d = Serve(tmp_path, cfg)
        try:
            wait(lambda: coordinator.store.read(new, (first,))[-1][0] > seqs[-1] + 1e6
                 and len(coordinator.store.read(new, (first,))) > len(seqs) + 20, 120,
                 "the second start's results at the coordinator", d)
            assert d.stop() == 0 and "Traceback" not in d.text(), d.text()[-3000:]
        finally:
            d.stop()
        (mem,), = coordinator.store.read("SELECT DISTINCT stream FROM results WHERE device = "
                                         "'box1' AND stream != ?", (first,))
        again = [q for (q,) in coordinator.store.read(new, (first,))][len(seqs):]
        assert again == list(range(again[0], again[0] + len(again))), again
        assert coordinator.store.acks()[("box1", mem)] > again[0]  # acked past the jump
        # the card repaired: the next start takes up the disk's own stream where it stood,
        # each of its results at the coordinator once, none lost, the memory's untouched
        disk.repair()
        old = "SELECT seq FROM results WHERE device = 'box1' AND stream = ? ORDER BY seq"
        top = coordinator.store.read(old, (first,))[-1][0]
        d = Serve(tmp_path, cfg)
        try:
            wait(lambda: coordinator.store.read(old, (first,))[-1][0] > top + 20, 120,
                 "the disk's stream going on at the coordinator", d)
            assert "kept in memory only" not in d.text()
            assert d.stop() == 0 and "Traceback" not in d.text(), d.text()[-3000:]
        finally:
            d.stop()
        kept = [q for (q,) in coordinator.store.read(old, (first,))]
        assert kept == list(range(1, len(kept) + 1)), kept
        assert [q for (q,) in coordinator.store.read(new, (first,))] == seqs + again
        (streams,), = coordinator.store.read("SELECT COUNT(DISTINCT stream) FROM results "
                                             "WHERE device = 'box1'")
        assert streams == 2
    finally:
        disk.unmount()
