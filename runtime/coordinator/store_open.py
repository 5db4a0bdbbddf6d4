"""Why the coordinator's store cannot be used at start, said in one line for the operator.

The dialects (dialect.py) raise StoreError when the store cannot be opened, written or
migrated; `edgerun coordinator` prints its message and exits 2 before it logs in to the broker.
Each case was a traceback at every restart, or worse, silence: SQLite opens a file it may read
but not write read-only without a word (tests/coordinator/test_store_damage.py).
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path


class StoreError(RuntimeError):
    """The store cannot be used at start (damaged, unwritable, full, a newer schema, an
    unreachable server); the message is one line for the operator: `coordinator.store`,
    the file or URL, why, and what to do. Nothing has been written to it."""


class StoreRefused(StoreError):
    """The store holds what this edgerun must not use (damaged, a newer schema, a -wal not
    its own, emptied): until someone restores or moves it, a restart finds the same, so the
    service exits as for a refused config (EX_CONFIG) instead of retrying every 5 s."""


class StoreUnreachable(StoreError, ConnectionError):
    """The PostgreSQL server did not answer in time (perhaps still starting: a restart may
    find it)."""


def where(path: Path) -> str:
    """How a line names the SQLite store at `path`."""
    return f"coordinator.store {path}"


def newer_schema(where: str, have: int, known: int) -> str:
    """The line for a store a newer edgerun migrated: this one would write tables whose
    meaning it does not know (an upgrade rolled back, a backup restored to an older host)."""
    return (f"{where}: its schema version {have} is newer than this edgerun's ({known}): a "
            "newer edgerun has used it; run that version, or a copy of the store from "
            "before the upgrade")


def sqlite_open_refusal(path: Path, e: sqlite3.Error) -> StoreError:
    """The StoreError for SQLite's error `e` opening the store at `path`: StoreRefused where
    the file is damaged or no database, else StoreError (a full or read-only disk, a foreign
    owner: what may come right without the store being replaced)."""
    damaged = getattr(e, "sqlite_errorname", "") in ("SQLITE_CORRUPT", "SQLITE_NOTADB")
    return (StoreRefused if damaged else StoreError)(sqlite_open_error(path, e))


def sqlite_open_error(path: Path, e: sqlite3.Error) -> str:
    """Why the SQLite store at `path` cannot be opened or written, for the operator: the
    file or directory named, from SQLite's error and what the filesystem says (SQLite's own
    words, "unable to open database file", "disk I/O error", name neither)."""
    at, name = where(path), getattr(e, "sqlite_errorname", "")
    if name in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
        return (f"{at} is damaged or not an SQLite database ({e}); it holds the fleet's "
                "results: restore a backup, or move it and any -wal and -shm beside it "
                "aside to start a new store")
    try:
        fs = os.statvfs(path.parent)
    except OSError:
        fs = None
    if fs is not None and fs.f_flag & os.ST_RDONLY:
        return f"{at} is on a read-only filesystem ({e})"
    if name == "SQLITE_FULL" or (fs is not None and fs.f_bavail == 0):
        return f"{at}: the filesystem holding it is full ({e}); free space and restart"

    def owner(p: Path) -> str:
        try:
            st = p.stat()
        except OSError:
            return ""
        return f"; owner uid {st.st_uid}, mode {st.st_mode & 0o7777:o}"

    user = f"this user (uid {os.geteuid()})"
    if path.exists():
        if not os.access(path, os.R_OK, effective_ids=True):
            return f"{at} cannot be read by {user}{owner(path)}"
        if not os.access(path, os.W_OK, effective_ids=True):
            return f"{at} cannot be written by {user}{owner(path)}"
    if not os.access(path.parent, os.W_OK | os.X_OK, effective_ids=True):
        return (f"{at}: its directory {path.parent} cannot be written by {user} (SQLite "
                f"keeps its -wal and -shm files beside the store){owner(path.parent)}")
    return f"{at} cannot be opened: {e}"


def running_error(path: Path | None, e: Exception) -> str | None:
    """What a store error while running means, naming the SQLite file, when it is one that
    fails every batch until someone acts (damaged, full, read-only: a card remounted
    read-only after an I/O error); None for anything else (said as it is, with its trace).
    `path` None: not an SQLite store."""
    name = getattr(e, "sqlite_errorname", "")
    if path is None or not isinstance(e, sqlite3.Error):
        return None
    if name in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
        return (f"the store {path} is damaged ({e}); nothing more is stored until it is "
                "restored from a backup or moved aside (stop the coordinator first)")
    if name == "SQLITE_FULL":
        return f"the filesystem holding the store {path} is full ({e})"
    if name == "SQLITE_READONLY":
        return f"the store {path} cannot be written ({e}; a filesystem remounted read-only?)"
    return None


def emptied(path: Path, token: Path) -> str | None:
    """Why the SQLite store at `path` must not be started afresh, when it is a zero-byte file
    (no -wal with frames beside it) although the API token in the same directory shows a
    store was made there (the first start makes the store before the token); else None.
    SQLite opens an empty file as a new database: a store a power cut left at zero bytes
    started again empty, the fleet's history, bundles and rollouts gone without a word."""
    def size(p: Path) -> int:
        try:
            return p.stat().st_size
        except OSError:
            return -1

    if size(path) != 0 or size(Path(f"{path}-wal")) > 0:
        return None
    if token.parent != path.parent or not token.is_file():
        return None
    return (f"{where(path)} is empty (0 bytes), though the API token {token} beside it shows "
            "a store was made here: its data is gone (a power cut?); restore a backup, or "
            "delete the empty file to start a new store")


def check_wal(path: Path) -> None:
    """StoreError when the SQLite store at `path` has a -wal with frames beside it (the last
    stop was not clean) and the two do not read as one sound database, checked read-only
    (PRAGMA quick_check: a read of every page) before anything opens it for writing. A
    store restored from a backup beside the newer -wal of another: SQLite applies the -wal's
    pages, and the first connection to close checkpoints them into the file, destroying the
    store that was restored; a read-only connection never checkpoints."""
    wal = Path(f"{path}-wal")
    try:
        if wal.stat().st_size <= 32 or path.stat().st_size == 0:  # 32: the header alone
            return
    except OSError:
        return
    db = None
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        why = " ".join(db.execute("PRAGMA quick_check(1)").fetchone()[0].split())
    except sqlite3.Error as e:
        if getattr(e, "sqlite_errorname", "") not in ("SQLITE_CORRUPT", "SQLITE_NOTADB"):
            return  # not readable now: the open for writing says why
        why = str(e)
    finally:
        if db is not None:
            db.close()
    if why != "ok":
        raise StoreRefused(f"{where(path)} and the -wal beside it do not make a sound database "
                         f"({why}); neither was changed. If the store was restored from a "
                         f"backup, the -wal is not its own: move {wal} aside and start again; "
                         "else restore a backup, or move the store, its -wal and -shm aside "
                         "to start a new store")


def unavailable(e: Exception) -> bool:
    """Whether `e` says the store cannot be used now (not a bug): SQLite's or psycopg's
    OperationalError (a server down, a pool timeout, an I/O error)."""
    psycopg = sys.modules.get("psycopg")  # imported only with a PostgreSQL store
    return isinstance(e, sqlite3.OperationalError) or (
        psycopg is not None and isinstance(e, psycopg.OperationalError))
