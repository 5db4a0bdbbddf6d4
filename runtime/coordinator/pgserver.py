"""A throw-away PostgreSQL cluster (initdb + pg_ctl in a temp dir) for tests and benches.

Debian's `postgresql` package puts the server binaries in /usr/lib/postgresql/<major>/bin (not
on PATH). PostgreSQL refuses to run as root, so when we are root the cluster is made and run
as the `postgres` user (`runuser`), in a temp dir owned by that user. It listens on a free
loopback port (trust authentication: loopback only, throw-away data) and keeps its unix
socket in the temp dir, so it touches nothing of a system cluster.

pg_ctl daemonizes the server: its parent is not the process that started it, so nothing
stops it when that process dies without `stop()` (a crashed test worker leaked a 488 MB
cluster). Each cluster dir holds an `owner` file (pid and start time of the process
that made it); `reap_orphans()` stops and removes every cluster whose owner is gone (the test
run calls it when it starts and ends: tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from runtime.wire.broker import free_port


def pg_bindir() -> Path | None:
    """The directory of initdb/pg_ctl: on PATH, else Debian's newest versioned one."""
    found = shutil.which("initdb")
    if found:
        return Path(os.path.realpath(found)).parent
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]))
    return Path(dirs[-1]) if dirs and (Path(dirs[-1]) / "initdb").exists() else None


PREFIX = "edgerun-pg-"  # a cluster dir's name in the temp dir: what reap_orphans() looks at
OWNER = "owner"  # the file in a cluster dir naming the process that made it


def _started(pid: int) -> str | None:
    """A live process's start time (clock ticks since boot, /proc/PID/stat field 22), which
    tells it apart from a later process given the same pid; None when no such process runs
    (or only its zombie is left)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the name, which may hold ")"
    return None if fields[0] in "ZX" else fields[19]


def _owner_alive(cluster: Path) -> bool | None:
    """Whether the process named in `cluster`'s owner file still runs (None: no owner file
    readable, e.g. a cluster made before there were owner files: left alone)."""
    try:
        pid, started = (cluster / OWNER).read_text().split()
        return _started(int(pid)) == started
    except (OSError, ValueError):
        return None


def _postmaster(cluster: Path) -> int | None:
    """The pid of the server running on `cluster`'s data, if one runs (its postmaster.pid
    names it; a server works in its data dir, which tells it from a later process given the
    same pid)."""
    data = cluster / "data"
    try:
        pid = int((data / "postmaster.pid").read_text().split()[0])
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except (OSError, ValueError, IndexError):
        return None
    return pid if Path(cwd) == data.resolve() and _started(pid) else None


def reap_orphans(tmpdir: str | None = None, timeout_s: float = 30.0) -> list[Path]:
    """Stop the server of every cluster in the temp dir whose owner process is gone
    (immediate shutdown: SIGQUIT, then SIGKILL) and remove its directory; returns those
    removed. Clusters of a live owner, or without an owner file, are left alone."""
    reaped = []
    for cluster in sorted(Path(tmpdir or tempfile.gettempdir()).glob(PREFIX + "*")):
        if _owner_alive(cluster) is not False:
            continue
        pid = _postmaster(cluster)
        for sig in (signal.SIGQUIT, signal.SIGKILL):
            if pid is None:
                break
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            deadline = time.monotonic() + timeout_s
            while _started(pid) is not None and time.monotonic() < deadline:
                time.sleep(0.05)
            if _started(pid) is None:
                pid = None
        shutil.rmtree(cluster, ignore_errors=True)
        if not cluster.exists():
            reaped.append(cluster)
    return reaped


class TempPostgres:
    """`start()` makes and starts the cluster; `url` connects to it; `stop()` removes it."""

    def __init__(self, settings: dict[str, str] | None = None, user: str = "postgres"):
        self.bindir = pg_bindir()
        if self.bindir is None:
            raise FileNotFoundError("PostgreSQL server binaries not found (apt-get install "
                                    "postgresql)")
        self.settings = {"fsync": "off", "synchronous_commit": "off",
                         "full_page_writes": "off", "max_connections": "100",
                         "shared_buffers": "64MB", **(settings or {})}
        self.as_user = user if os.geteuid() == 0 else None
        self.port = 0
        self.dir: Path | None = None

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        if self.as_user:
            cmd = ["runuser", "-u", self.as_user, "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120)

    @property
    def url(self) -> str:
        """A libpq URL of the cluster's `postgres` database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> TempPostgres:
        """initdb (once) and start on a free port; waits until it accepts connections."""
        if self.dir is None:
            self.dir = Path(tempfile.mkdtemp(prefix=PREFIX))
            (self.dir / OWNER).write_text(f"{os.getpid()} {_started(os.getpid())}\n")
            if self.as_user:
                pw = pwd.getpwnam(self.as_user)
                os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._run("initdb", "-D", str(self.dir / "data"), "-U", "postgres", "-A", "trust",
                      "-E", "UTF8", "--no-locale")
        self.port = free_port()
        opts = " ".join(f"-c {k}={v}" for k, v in {
            **self.settings, "port": str(self.port), "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.dir)}.items())
        r = self._run("pg_ctl", "-D", str(self.dir / "data"), "-l", str(self.dir / "log"),
                      "-o", opts, "-w", "-t", "60", "start", check=False)
        if r.returncode:
            log = (self.dir / "log").read_text()[-2000:] if (self.dir / "log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {r.stderr.strip()} {log}")
        return self

    def create_database(self, name: str) -> str:
        """A fresh database in the cluster; returns its URL."""
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def stop(self) -> None:
        """Stop the server and delete the cluster."""
        if self.dir is None:
            return
        self._run("pg_ctl", "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop",
                  check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None
