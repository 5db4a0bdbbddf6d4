"""Review R3: an outbox that cannot be opened *now* is not a corrupt one."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys

import pytest
from support.under_test import child_env

from runtime.config.telemetry import OutboxConfig
from runtime.telemetry.outbox import Outbox, OutboxUnavailable


def _need_setpriv() -> None:
    """Skip unless this runs as root with setpriv (to drop the capability that bypasses file
    modes: a root-owned file is then as it is to a service user)."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to drop the capability that bypasses file modes")


def _open_without_override(path) -> subprocess.CompletedProcess:
    """Open the outbox at `path` in a child without CAP_DAC_OVERRIDE; it prints
    `UNAVAILABLE <message>` and exits 0 where the outbox refused to open (asserted)."""
    code = ("import sys; from runtime.config.telemetry import OutboxConfig\n"
            "from runtime.telemetry.outbox import Outbox, OutboxUnavailable\n"
            f"try: Outbox(OutboxConfig(path={str(path)!r}))\n"
            "except OutboxUnavailable as e: print('UNAVAILABLE', e); sys.exit(0)\n"
            "print('opened'); sys.exit(3)\n")
    r = subprocess.run(["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--",
                        sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=child_env())
    assert r.returncode == 0, r.stdout + r.stderr[-2000:]
    return r


def test_a_locked_outbox_is_kept_with_its_results_not_moved_aside(tmp_path, monkeypatch):
    """Another process holding the outbox locked past the busy timeout (an operator's sqlite3
    shell, a backup) made the daemon declare it corrupt, move it aside and start empty: its
    unacked results were never sent. Now: a clear error, the file untouched, and the next
    start (systemd restarts the daemon) finds every result."""
    path = tmp_path / "outbox.db"
    box = Outbox(OutboxConfig(path=str(path)))
    box.append_many([{"t": 1.0, "ref": f"r{i}"} for i in range(50)])
    box.close()
    holder = subprocess.Popen([sys.executable, "-c", f"""
import sqlite3, sys
c = sqlite3.connect({str(path)!r}, isolation_level=None)
c.execute('PRAGMA locking_mode=EXCLUSIVE'); c.execute('BEGIN EXCLUSIVE')
c.execute("INSERT INTO meta VALUES ('lock', '1')")
print('locked', flush=True); sys.stdin.readline()
c.execute('ROLLBACK')
"""], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        real = sqlite3.connect
        monkeypatch.setattr(sqlite3, "connect",  # the 30 s busy timeout, shortened
                            lambda *a, **k: real(*a, **{**k, "timeout": 0.2}))
        with pytest.raises(OutboxUnavailable) as e:
            Outbox(OutboxConfig(path=str(path)))
        assert "database is locked" in str(e.value) and "not moved aside" in str(e.value)
        assert str(path) in str(e.value)
    finally:
        holder.communicate("\n", timeout=30)
    assert not [p for p in tmp_path.iterdir() if ".corrupt-" in p.name]
    monkeypatch.undo()
    box = Outbox(OutboxConfig(path=str(path)))
    assert box.stats()["results_held"] == 50 and box.take_startup_event() is None
    box.close()


def test_a_file_that_is_not_a_database_is_still_moved_aside(tmp_path):
    path = tmp_path / "outbox.db"
    path.write_bytes(b"this is not sqlite" * 100)
    box = Outbox(OutboxConfig(path=str(path)))
    assert box.take_startup_event()["type"] == "outbox_corrupt"
    box.close()


def test_an_outbox_it_may_not_write_is_one_line_not_a_traceback(tmp_path):
    """Files left root-owned by a `sudo edgerun serve` and a service user that may only read
    them: SQLite opens read-only and the first write, later in the constructor, raised
    `attempt to write a readonly database` out of the daemon's start. Run as root without
    CAP_DAC_OVERRIDE (setpriv) on a file owned by another user, which is the same thing."""
    _need_setpriv()
    path = tmp_path / "outbox.db"
    box = Outbox(OutboxConfig(path=str(path)))
    box.append({"t": 1.0, "ref": "r"})
    box.close()
    os.chown(path, 65534, -1)
    os.chmod(path, 0o644)
    tmp_path.chmod(0o777)
    r = _open_without_override(path)
    assert "attempt to write a readonly database" in r.stdout


@pytest.mark.parametrize("suffix", ["-wal", "-shm"])
def test_a_directory_in_place_of_a_wal_or_shm_file_is_named(tmp_path, suffix):
    """SQLite's own files beside the database: one that cannot be used said `unable to open
    database file` or `attempt to write a readonly database` about outbox.db, which is fine,
    and never named the file that is not."""
    path = tmp_path / "outbox.db"
    box = Outbox(OutboxConfig(path=str(path)))
    box.append({"t": 1.0, "ref": "r"})
    box.close()
    (tmp_path / f"outbox.db{suffix}").mkdir()
    with pytest.raises(OutboxUnavailable) as e:
        Outbox(OutboxConfig(path=str(path)))
    assert f"{path}{suffix} is a directory" in str(e.value), e.value


def test_a_state_directory_on_a_read_only_mount_is_named(tmp_path):
    """A state directory mounted read-only with no outbox in it yet: SQLite said `unable to
    open database file`, naming neither the directory nor why."""
    if os.geteuid() != 0:
        pytest.skip("a read-only bind mount needs root")
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "--bind", str(state), str(state)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(state)], check=True)
        with pytest.raises(OutboxUnavailable) as e:
            Outbox(OutboxConfig(path=str(state / "outbox.db")))
        assert f"{state} cannot be written" in str(e.value), e.value
    finally:
        subprocess.run(["umount", str(state)], check=False)


def test_a_shm_file_another_user_owns_is_named(tmp_path):
    """`sudo edgerun serve` killed leaves root-owned -wal and -shm files; the service user
    then cannot open the outbox, and the line named only outbox.db (its own, writable).
    Run as root without CAP_DAC_OVERRIDE (setpriv) on a file owned by another user."""
    _need_setpriv()
    path = tmp_path / "outbox.db"
    box = Outbox(OutboxConfig(path=str(path)))
    box.append({"t": 1.0, "ref": "r"})
    box.close()
    shm = tmp_path / "outbox.db-shm"
    shm.write_bytes(b"\0" * 32768)
    os.chown(shm, 65534, -1)
    os.chmod(shm, 0o644)
    tmp_path.chmod(0o777)
    r = _open_without_override(path)
    assert f"{shm} cannot be written" in r.stdout, r.stdout


def _corrupt_a_results_page(path) -> None:
    """Overwrite part of a late page of the results table (a bad sector): quick_check fails,
    the small meta and sqlite_sequence tables at the front stay readable."""
    data = bytearray(path.read_bytes())
    data[-2 * 4096 + 100:-2 * 4096 + 400] = b"\xff" * 300
    path.write_bytes(bytes(data))


def test_a_corrupt_database_keeps_the_logs_unacked_results_in_its_stream(tmp_path, caplog):
    path = tmp_path / "outbox.db"
    box = Outbox(OutboxConfig(path=str(path), spill_bytes=4096))
    box.append_many([{"blob": "x" * 100} for _ in range(200)])  # spilled into the table
    box.ack(10)
    assert box.append_many([{"i": i} for i in range(5)]) == [201, 202, 203, 204, 205]
    stream = box.stream
    box.close()
    _corrupt_a_results_page(path)
    box = Outbox(OutboxConfig(path=str(path)))
    event = box.take_startup_event()
    assert event["type"] == "outbox_corrupt"
    assert event["results_kept"] == 5 and event["stream"] == "kept"
    # the log's results, under the same stream: the coordinator de-duplicates any re-sent
    assert box.stream == stream and [p.seq for p in box.pending(0, 50)] == [201, 202, 203,
                                                                            204, 205]
    assert "5 unacked results of its result log are sent again under the same stream" in (
        caplog.text)
    assert box.append({"i": 5}) == 206
    box.close()
    box = Outbox(OutboxConfig(path=str(path)))  # and the seqs hold across another start
    assert box.stream == stream and box.append({"i": 6}) == 207
    box.close()
    assert (tmp_path / f"{event['path'].rsplit('/', 1)[1]}.log").exists()  # a copy, aside


def test_a_database_that_is_not_one_sends_the_logs_results_under_a_new_stream(tmp_path, caplog):
    path = tmp_path / "outbox.db"
    box = Outbox(OutboxConfig(path=str(path)))
    box.append_many([{"i": i} for i in range(5)])
    box.ack(2)
    old = box.stream
    box.close()
    path.write_bytes(b"this is not sqlite" * 100)
    box = Outbox(OutboxConfig(path=str(path)))
    event = box.take_startup_event()
    assert event["results_kept"] == 3 and event["stream"] == "new" and box.stream != old
    assert [p.seq for p in box.pending(0, 50)] == [3, 4, 5]
    assert "stored twice" in caplog.text
    assert box.append({"i": 5}) == 6
    box.close()
