"""Review R3: an outbox that cannot be opened *now* is not a corrupt one."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from runtime.telemetry.config import OutboxConfig
from runtime.telemetry.outbox import Outbox, OutboxUnavailable


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
