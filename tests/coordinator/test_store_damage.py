"""`edgerun coordinator` as a real process on a store it cannot use: a file where its
directory belongs, a directory where the file belongs, random bytes, a torn file, a file or
directory another user owns, a read-only or full filesystem, a store a newer edgerun
migrated. Each was a traceback (or, for a store it could read but not write, a coordinator
that logged in, acked nothing and said so once a minute); now one line naming
coordinator.store, the file and why, exit 2, before the broker login, the file untouched."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.daemon_toml import coordinator_toml
from support.under_test import child_env

from runtime.coordinator.store import Inbound, Store

OTHER = 65534  # nobody: the owner the coordinator's user is not
SETPRIV = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]


def _config(tmp_path: Path, broker, store: Path, token: Path | None = None) -> Path:
    cfg = tmp_path / "coord.toml"
    cfg.write_text(coordinator_toml(broker.coordinator("t", "damage-coordinator"), fleet="t",
                                    store=store, client_id="damage-coordinator", http_port=0,
                                    api_token_file=token or tmp_path / "api-token"))
    return cfg


def _store_with_results(path: Path, n: int = 400) -> None:
    """A store holding `n` results of one device, closed cleanly (no -wal beside it)."""
    s = Store(path)
    s.ingest([Inbound("dev1", "result", {"v": 1, "stream": "s1", "boot": "b1", "floor": 1,
                                         "results": [{"seq": q, "t": 1.0, "label": "x" * 200}
                                                   for q in range(1, n + 1)]})])
    s.close()


def _mount_tmpfs(where: Path, options: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")


def _damage(tmp_path: Path, case: str, mounts: list[Path]) -> tuple[Path, str, list[str]]:
    """Make `case`; returns the store path, what the line must say, and the command prefix."""
    state = tmp_path / "state"
    store = state / "coord.db"
    if case.startswith("other-user-") and (os.geteuid() != 0 or not shutil.which("setpriv")):
        pytest.skip("needs root and setpriv to drop the capability that bypasses modes")
    if case in ("read-only-filesystem", "full-filesystem") and os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    if case == "file-for-directory":
        state.write_text("not a directory\n")
        return store, f"its directory {state} is not a directory", []
    state.mkdir()
    if case == "directory-for-file":
        store.mkdir()
        return store, "is a directory, not a database file", []
    if case == "random-bytes":
        store.write_bytes(os.urandom(64 * 1024))
        return store, "is damaged or not an SQLite database", []
    if case == "zero-bytes":  # a power cut on a filesystem that lost the file's data
        store.write_bytes(b"")
        (state / "api-token").write_text("t" * 43 + "\n")  # made after the store, at start
        (state / "api-token").chmod(0o600)
        return store, "is empty (0 bytes)", []
    if case == "future-schema":
        _store_with_results(store)
        with sqlite3.connect(store) as db:
            db.execute("INSERT INTO schema_version VALUES (99)")
        db.close()
        return store, "schema version 99 is newer than this edgerun's", []
    _store_with_results(store)
    if case == "foreign-wal":  # a store restored from a backup beside another one's -wal
        other = tmp_path / "other" / "coord.db"

        def more(lo: int, hi: int) -> list[Inbound]:
            return [Inbound("dev2", "result", {
                "v": 1, "stream": "s2", "boot": "b2", "floor": 1,
                "results": [{"seq": q, "t": 2.0, "label": "y" * 300} for q in range(lo, hi)]})]

        older = Store(other)
        older.ingest(more(1, 3001))
        older.close()  # checkpointed: no -wal left
        newer = Store(other)
        newer.ingest(more(3001, 3201))  # its -wal: the pages these changed
        shutil.copy(f"{other}-wal", f"{store}-wal")  # before its close checkpoints it
        newer.close()
        return store, "and the -wal beside it do not make a sound database", []
    if case == "torn":
        os.truncate(store, store.stat().st_size // 2 + 1000)
        return store, "is damaged or not an SQLite database", []
    if case == "other-user-read-only":
        os.chown(store, OTHER, OTHER)
        store.chmod(0o644)
        return store, "cannot be written by this user", SETPRIV
    if case == "other-user-unreadable":
        os.chown(store, OTHER, OTHER)
        store.chmod(0o600)
        return store, "cannot be read by this user", SETPRIV
    if case == "other-user-directory":
        os.chown(state, OTHER, OTHER)
        state.chmod(0o755)
        return store, f"its directory {state} cannot be written by this user", SETPRIV
    if case == "read-only-filesystem":
        keep = tmp_path / "keep.db"
        shutil.move(store, keep)
        _mount_tmpfs(state, "size=4m")
        mounts.append(state)
        shutil.copy(keep, store)
        subprocess.run(["mount", "-o", "remount,ro", str(state)], check=True)
        return store, "is on a read-only filesystem", []
    assert case == "full-filesystem"
    keep = tmp_path / "keep.db"
    shutil.move(store, keep)
    size = keep.stat().st_size
    _mount_tmpfs(state, f"size={size // 1024 + 8}k")
    mounts.append(state)
    shutil.copy(keep, store)
    fd = os.open(state / "filler", os.O_WRONLY | os.O_CREAT)
    try:  # every block left taken
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    return store, "the filesystem holding it is full", []


CASES = ["file-for-directory", "directory-for-file", "random-bytes", "torn", "zero-bytes",
         "foreign-wal",
         "future-schema",
         "other-user-read-only", "other-user-unreadable", "other-user-directory",
         "read-only-filesystem", "full-filesystem"]


# Refused for what the store holds: a restart finds the same until someone restores or moves
# it, so the coordinator exits 78 (EX_CONFIG), which its unit does not restart
# (tests/tools/test_service_exit.py); the others may come right by themselves: exit 2, retried.
REFUSED = {"random-bytes", "torn", "zero-bytes", "foreign-wal", "future-schema"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES)
def test_a_store_that_cannot_be_used_is_one_line_and_exit_2_or_78(tmp_path, broker, case):
    mounts: list[Path] = []
    try:
        store, says, prefix = _damage(tmp_path, case, mounts)
        before = store.read_bytes() if store.is_file() else None
        cfg = _config(tmp_path, broker, store,
                      store.parent / "api-token" if case == "zero-bytes" else None)
        t0 = time.monotonic()
        r = subprocess.run([*prefix, sys.executable, "-m", "runtime.cli", "coordinator",
                            "--config", str(cfg)], capture_output=True, text=True, timeout=90,
                           env=child_env())
        out = r.stdout + r.stderr
        assert r.returncode == (78 if case in REFUSED else 2), out[-3000:]
        assert "Traceback" not in out, out[-3000:]
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, out[-3000:]
        assert lines[0].startswith(f"edgerun: coordinator.store {store}"), lines[0]
        assert says in lines[0], lines[0]
        assert time.monotonic() - t0 < 60
        # one login: the enrolment's own check (broker.coordinator), none of the process
        assert broker.log.read_text().count(" as damage-coordinator (") == 1
        if before is not None:  # what it could not use is left as it was
            assert store.read_bytes() == before
    finally:
        for m in mounts:
            subprocess.run(["umount", "-l", str(m)], check=False)


def test_a_postgres_store_of_a_newer_schema_is_refused(postgres):
    """The same refusal on PostgreSQL, with the URL's password left out of the line."""
    import psycopg

    from runtime.coordinator.dialect import PostgresDialect
    from runtime.coordinator.store_open import StoreError

    url = postgres.create_database("newer")
    PostgresDialect(url).close()
    with psycopg.connect(url, autocommit=True) as db:
        db.execute("INSERT INTO schema_version VALUES (99)")
    with pytest.raises(StoreError, match="schema version 99 is newer than this edgerun's"):
        PostgresDialect(url)


def _sqlite_error(name: str, text: str) -> sqlite3.Error:
    e = sqlite3.DatabaseError(text)
    e.sqlite_errorname = name  # type: ignore[attr-defined]  # as SQLite sets it
    return e


@pytest.mark.parametrize("name, text, says", [
    ("SQLITE_CORRUPT", "database disk image is malformed", "is damaged"),
    ("SQLITE_NOTADB", "file is not a database", "is damaged"),
    ("SQLITE_FULL", "database or disk is full", "is full"),
    ("SQLITE_READONLY", "attempt to write a readonly database", "cannot be written"),
    ("SQLITE_BUSY", "database is locked", None),  # passing: said as it is, with its trace
])
def test_a_store_failing_while_running_is_named_with_why(tmp_path, name, text, says):
    """Ingest failing on a damaged, full or read-only store logged SQLite's words and a
    traceback once a minute ('database disk image is malformed'), naming no file and not
    saying that nothing more can be stored until someone acts."""
    from runtime.coordinator.store_open import running_error

    line = running_error(tmp_path / "coord.db", _sqlite_error(name, text))
    if says is None:
        assert line is None
    else:
        assert f"{tmp_path / 'coord.db'}" in line and says in line and text in line, line
    assert running_error(None, _sqlite_error(name, text)) is None  # PostgreSQL: no file
