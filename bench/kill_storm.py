"""A kill -9 storm: `edgerun serve` SIGKILLed at random points of a run, restarted each time,
and every result it made stored exactly once at the coordinator.

One run on this machine: a real Mosquitto, a real coordinator (`edgerun coordinator`, an SQLite
store) and a real `edgerun serve` (the bundled model on the synthetic conveyor at `--rate`
results/s, publishing as device `storm`). After a warm-up lifetime (it profiles the model once,
then stops with SIGTERM) the daemon is started and SIGKILLed `--kills` times. Each lifetime
draws, from one seeded RNG (the seed is printed):

- where its results go, so that kills land in each write path of the outbox: `log` (the
  product default: the result log, acked there), `spill` (results left unacked 50 ms, or past
  4 KiB, move into SQLite in one transaction) or `sqlite` (every append a SQLite transaction);
- when it is killed: `timer` (a delay drawn over the start and the first seconds of serving),
  `connected` (just after the log says it connected to the broker: the backlog's re-send and
  its acks) or `ready` (within 2 s of the log's `ready in`: appending, publishing, acks).

After each kill the outbox's files (the process is dead: they are what a restart finds) are
read: each seq the outbox holds and its result's identity (its `boot` and time `t`), what the
kill left (unacked results, results in SQLite, a torn line at the log's end). At the end one
more daemon with an empty folder for a camera (it makes no result) publishes what is left and
stops with SIGTERM. Then:

- made: every seq the outbox ever gave (1..its highest: seqs are contiguous and never reused);
- stored: the coordinator's rows for the device;
- lost: made seqs the coordinator does not hold, plus held results whose stored copy is a
  different result (a seq given twice);
- duplicated: one result (its boot and t) stored under two seqs, or a second stream.

Usage: python bench/kill_storm.py [--kills 500] [--seed N] [--rate 40] [--keep DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the config writer
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.daemon_harness import held_rows
from support.daemon_toml import daemon_toml
from support.fleet import CoordinatorProc
from support.under_test import child_env

from models import bundled
from runtime.telemetry import resultlog
from runtime.telemetry.outbox import last_seq
from runtime.wire.broker import Mosquitto

DEVICE = "storm"
# Where a lifetime's results go (telemetry.outbox): see the module docstring.
SINKS: dict[str, dict] = {
    "log": {"spill_after_s": None},  # the product default (60 s)
    "spill": {"spill_after_s": 0.05, "spill_bytes": 4096},
    "sqlite": {"spill_after_s": 0.0},
}
# When a lifetime is killed, and how often each is drawn: after a drawn delay, after a line of
# its log, or (strace's fault injection, the daemon run under `strace`) on entering the Nth
# write to the result log, the Nth write to SQLite's WAL, the Nth send or receive on a socket.
WHEN = {"start": 0.15, "timer": 0.2, "connected": 0.15, "ready": 0.2,
        "append": 0.1, "sqlite": 0.1, "send": 0.05, "recv": 0.05}
# strace filters and the Nth call to kill on, drawn in 1..max (a lifetime makes ~40 results/s)
SYSCALLS = {"append": ("write", "outbox.db.log", 60), "sqlite": ("pwrite64", "outbox.db-wal", 60),
            "send": ("sendto", None, 80), "recv": ("recvfrom", None, 80)}
# the sinks that make those calls (results to the log; to SQLite)
SINKS_OF = {"append": ("log", "spill"), "sqlite": ("spill", "sqlite")}
CONNECTED, READY = "connected to ", "ready in "
# Seconds since the daemon was started, for the spread of kill points.
BUCKETS = (0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 10.0)


@dataclass
class Kill:
    """One SIGKILL: when it was drawn to land, and what the log and the files showed."""

    sink: str
    when: str
    after_s: float  # since the daemon was started
    phase: str  # "start", "ready" or "connected": see phase_of
    unacked: int  # results the outbox held after the kill
    in_sqlite: int  # of them, in the database (spilled or written there)
    torn_bytes: int  # a part of a line at the result log's end


@dataclass
class Report:
    """What a storm did and what the coordinator holds at its end."""

    seed: int
    kills: list[Kill] = field(default_factory=list)
    made: int = 0
    stored: int = 0
    lost: list[int] = field(default_factory=list)  # seqs
    changed: list[int] = field(default_factory=list)  # seqs whose stored result is another
    duplicated: list[tuple[int, int]] = field(default_factory=list)  # seqs of one result
    streams: int = 0
    exits: list[str] = field(default_factory=list)  # lifetimes that ended on their own
    wall_s: float = 0.0
    no_strace: str | None = None  # why no kill was timed to a syscall
    # spawn to the log's `ready in` or `connected to` (they come within ms of each other)
    ready_s: list[float] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every result made stored exactly once, in one stream, and no daemon died alone."""
        return (not self.lost and not self.changed and not self.duplicated
                and self.streams == 1 and self.made == self.stored and not self.exits)


def daemon_config(work: Path, port: int, rate: float, sink: str, folder: Path | None = None
                  ) -> str:
    """The daemon: the bundled model on the synthetic conveyor at `rate` (or, with `folder`,
    watching an empty folder: no result made), device `storm` of fleet "bench", no governor."""
    source = ({"kind": "folder", "path": folder} if folder is not None
              else {"kind": "synthetic", "rate_hz": rate})
    return daemon_toml(work / "state", {
        "model": {"path": bundled()},
        "constraints": {"latency_ms": 100.0, "accuracy_floor": 0.95},
        "profiler": {"time_budget_s": 0.1, "cache_dir": work / "profiles"},
        "source": source,
        "governor": {"policy": "off"},
        # a loaded host makes the daemon re-profile (p95 past slow_factor x the profile's):
        # background work that is no part of what is under test
        "daemon": {"slow_factor": 1000.0},
        "telemetry": {"fleet": "bench", "device": DEVICE, "ack_timeout_s": 1.0,
                      "health_interval_s": 1.0},
        "telemetry.broker": {"host": "127.0.0.1", "port": port, "keepalive_s": 5},
        "telemetry.outbox": SINKS[sink],
    })


def strace_kills() -> str | None:
    """None if strace can kill a process on a chosen syscall here, else why not (missing, or
    ptrace refused in this container)."""
    import shutil

    if shutil.which("strace") is None:
        return "strace is not installed"
    r = subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "-e", "trace=write", "-e",
                        "inject=write:signal=SIGKILL:when=1", sys.executable, "-c",
                        "import os; os.write(1, b'x')"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL):
        return None
    return f"strace did not kill on a write (exit {r.returncode}: {r.stderr.strip()[:200]})"


class Daemon:
    """One `edgerun serve` lifetime, its log in `work/serve.log` (this lifetime's part read)."""

    def __init__(self, work: Path, config: Path, inject: tuple[str, str | None, int] | None = None):
        """`inject` (syscall, path or None, n): run under strace, which SIGKILLs the daemon on
        entering its nth such call (on that path)."""
        self.log = work / "serve.log"
        self.start = self.log.stat().st_size if self.log.exists() else 0
        self.t0 = time.monotonic()
        self.traced = inject is not None
        prefix: list[str] = []
        if inject is not None:
            call, path, n = inject
            # no --seccomp-bpf: strace 6.1 then injects nothing where -P names a path
            prefix = ["strace", "-f", "-qq", "-o", os.devnull, "-e", f"trace={call}",
                      "-e", f"inject={call}:signal=SIGKILL:when={n}"]
            if path:
                prefix += ["-P", str(work / "state" / path)]
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "runtime.cli", "serve", "--config", str(config)],
                stdout=out, stderr=subprocess.STDOUT, env=child_env())

    def text(self) -> str:
        """This lifetime's part of the log."""
        with self.log.open("rb") as f:
            f.seek(self.start)
            return f.read().decode(errors="replace")

    def wait_for(self, marker: str, timeout_s: float) -> bool:
        """Poll the log until `marker` appears; False if the daemon exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if marker in self.text():
                return True
            if self.proc.poll() is not None:
                return False
            time.sleep(0.005)
        return False

    def injected(self) -> bool:
        """Under strace: whether strace's SIGKILL ended the daemon (strace then ends with it)."""
        return self.traced and self.proc.poll() == -signal.SIGKILL

    def kill9(self) -> bool:
        """SIGKILL the daemon (under strace: strace's child) and reap it; False if it had
        already exited on its own."""
        if self.injected():
            return True
        if self.proc.poll() is not None:
            return False
        pid = self.proc.pid
        if self.traced:
            try:
                kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            except OSError:
                kids = []
            if not kids:  # strace has not started it yet, or it is gone: stop strace too
                self.proc.kill()
                self.proc.wait()
                return True
            pid = int(kids[0])
        os.kill(pid, signal.SIGKILL)
        self.proc.wait()
        return self.proc.returncode == -signal.SIGKILL or self.traced

    def term(self, timeout_s: float = 60) -> int:
        """SIGTERM and wait (SIGKILL past `timeout_s`); the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def identity(body: str) -> tuple[str, float]:
    """What tells one result from another, seq aside: the process that made it and when."""
    doc = json.loads(body)
    return str(doc.get("boot")), float(doc["t"])


def phase_of(text: str) -> str:
    """Which part of a lifetime its log had reached: `start` (not ready), `ready` (serving,
    not connected to the broker yet) or `connected` (serving and publishing)."""
    if CONNECTED in text:
        return "connected"
    return "ready" if READY in text else "start"


def snapshot(db: Path) -> tuple[dict[int, tuple[str, float]], int, int]:
    """The outbox as a restart finds it: seq -> identity of every result it holds, how many
    of them are in the database, and the bytes of a torn line at the result log's end."""
    rows = held_rows(db)
    in_db = 0
    if db.exists():
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
        try:
            in_db = con.execute("SELECT COUNT(*) FROM results").fetchone()[0]
        except sqlite3.OperationalError:  # killed before it made its tables
            in_db = 0
        finally:
            con.close()
    torn = resultlog.read(db.with_name(db.name + ".log")).torn_bytes
    return {q: identity(b) for q, b in rows}, in_db, torn


def stored_rows(store: Path) -> list[tuple[str, int, str]]:
    """(stream, seq, body) of every result the coordinator stored from the device."""
    con = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30)
    try:
        return con.execute("SELECT stream, seq, body FROM results WHERE device=? "
                           "ORDER BY stream, seq", (DEVICE,)).fetchall()
    finally:
        con.close()


def judge(report: Report, made: int, held: dict[int, tuple[str, float]],
          rows: list[tuple[str, int, str]]) -> None:
    """Fill made/stored/lost/changed/duplicated/streams from the outbox's highest seq, every
    result the outbox was seen to hold (seq -> identity) and the coordinator's rows."""
    report.made, report.stored = made, len(rows)
    report.streams = len({s for s, _, _ in rows})
    by_seq: dict[int, tuple[str, float]] = {}
    seen: dict[tuple[str, float], int] = {}
    for _, seq, body in rows:
        ident = identity(body)
        if seq in by_seq:  # a second stream's copy of a seq
            report.duplicated.append((seq, seq))
        by_seq[seq] = ident
        if ident in seen:
            report.duplicated.append((seen[ident], seq))
        seen[ident] = seq
    report.lost = [q for q in range(1, made + 1) if q not in by_seq]
    report.changed = sorted(q for q, ident in held.items() if q in by_seq and by_seq[q] != ident)


def spread(kills: list[Kill]) -> list[str]:
    """The kill points, as lines: by draw, by phase, by time since start, and what they left."""
    n = max(1, len(kills))
    lines = []
    for label, key in (("sink", "sink"), ("drawn", "when"), ("phase", "phase")):
        c = Counter(getattr(k, key) for k in kills)
        lines.append(f"  by {label:6s}: " + ", ".join(f"{v} {c[v]}" for v in sorted(c)))
    edges = (0.0, *BUCKETS, float("inf"))
    parts = []
    for lo, hi in itertools.pairwise(edges):
        m = sum(lo <= k.after_s < hi for k in kills)
        parts.append(f"{lo:g}-{hi:g}s {m}" if hi != float("inf") else f">={lo:g}s {m}")
    lines.append("  after start: " + ", ".join(parts))
    left = [("results unacked", sum(k.unacked > 0 for k in kills)),
            ("results in SQLite", sum(k.in_sqlite > 0 for k in kills)),
            ("a torn log line", sum(k.torn_bytes > 0 for k in kills))]
    lines.append("  kills that left: " + ", ".join(f"{what} {m} ({100 * m / n:.0f}%)"
                                                    for what, m in left))
    return lines


def storm(work: Path, kills: int, seed: int, rate: float = 40.0,
          progress=lambda s: None) -> Report:
    """Run a storm of `kills` SIGKILLs in `work` (see the module docstring)."""
    rng = random.Random(seed)
    report = Report(seed)
    report.no_strace = strace_kills()
    when_w = {k: w for k, w in WHEN.items() if report.no_strace is None or k not in SYSCALLS}
    t_start = time.monotonic()
    broker = Mosquitto(work, auth=False).start()
    coord = CoordinatorProc(work, "coord", broker.port, str(work / "coord.db"))
    held: dict[int, tuple[str, float]] = {}
    d: Daemon | None = None
    db = work / "state" / "outbox.db"
    configs = {}
    for sink in SINKS:
        configs[sink] = work / f"serve-{sink}.toml"
        configs[sink].write_text(daemon_config(work, broker.port, rate, sink))
    try:
        coord.start()
        # warm-up: profiles the model into the cache once, so later starts take it from there
        d = Daemon(work, configs["log"])
        if d.wait_for(READY, 600):
            report.ready_s.append(time.monotonic() - d.t0)
        if not d.wait_for(" profiled in ", 600):
            raise RuntimeError("the warm-up daemon never finished profiling:\n" + d.text()[-3000:])
        if d.term() != 0:
            raise RuntimeError("the warm-up daemon did not stop cleanly:\n" + d.text()[-3000:])
        for i in range(kills):
            when = rng.choices(list(when_w), weights=list(when_w.values()))[0]
            sink = rng.choice(SINKS_OF.get(when, list(SINKS)))
            # spawn to serving, as lately measured (a guess until one is)
            ready = statistics.median(report.ready_s[-20:]) if report.ready_s else 3.0
            inject = None
            if when in SYSCALLS:
                call, path, top = SYSCALLS[when]
                inject = (call, path, rng.randint(1, top))
            d = Daemon(work, configs[sink], inject)
            if inject is not None:
                # strace kills it at that call; a lifetime that never makes it (no spill in
                # the log sink, say) is killed here after a while, and counted as a timer
                limit = time.monotonic() + 1.5 * ready + 4.0
                while time.monotonic() < limit and d.proc.poll() is None:
                    time.sleep(0.005)
                if not d.injected():
                    when = f"{when} not reached"
            elif when in ("start", "timer"):
                # over the start; or over the start and the first seconds of serving
                delay = rng.uniform(0.0, ready if when == "start" else ready + 2.0)
                while time.monotonic() - d.t0 < delay and d.proc.poll() is None:
                    time.sleep(0.002)
            else:
                marker, span = (CONNECTED, 0.3) if when == "connected" else (READY, 2.0)
                extra = rng.uniform(0.0, span)
                if d.wait_for(marker, 120):
                    report.ready_s.append(time.monotonic() - d.t0)
                    time.sleep(extra)
            text = d.text()
            after = time.monotonic() - d.t0
            if not d.kill9():
                report.exits.append(f"lifetime {i} ({sink}, {when}) exited "
                                    f"{d.proc.returncode}: {text[-1500:]}")
            now, in_db, torn = snapshot(db)
            for q, ident in now.items():
                if held.setdefault(q, ident) != ident:
                    report.changed.append(q)  # the outbox gave one seq to two results
            report.kills.append(Kill(sink, when, after, phase_of(text), len(now), in_db, torn))
            if (i + 1) % 25 == 0:
                progress(f"  {i + 1} kills, seq {last_seq(db)}, "
                         f"{time.monotonic() - t_start:.0f} s")
        # the end: a daemon that makes nothing publishes what is left, then stops
        empty = work / "empty"
        empty.mkdir(exist_ok=True)
        drain = work / "serve-drain.toml"
        drain.write_text(daemon_config(work, broker.port, rate, "log", folder=empty))
        made = last_seq(db)
        d = Daemon(work, drain)
        deadline = time.monotonic() + 300
        while held_rows(db) and time.monotonic() < deadline and d.proc.poll() is None:
            time.sleep(0.2)
        rc = d.term()
        if rc != 0:
            report.exits.append(f"the draining daemon exited {rc}: {d.text()[-1500:]}")
        changed = report.changed
        judge(report, made, held, stored_rows(work / "coord.db"))
        report.changed = sorted(set(changed) | set(report.changed))
    finally:
        if d is not None and d.proc.poll() is None:  # a failed run: no daemon left behind
            d.kill9()
        coord.term()
        broker.stop()
    report.wall_s = time.monotonic() - t_start
    return report


def render(r: Report) -> str:
    """The storm's outcome as printed."""
    lines = [f"seed {r.seed}: {len(r.kills)} SIGKILLs in {r.wall_s:.0f} s wall",
             f"made {r.made}, stored {r.stored}, lost {len(r.lost)}, "
             f"duplicated {len(r.duplicated)}, seq given twice {len(r.changed)}, "
             f"streams {r.streams}, lifetimes that ended on their own {len(r.exits)}"]
    if r.ready_s:
        rs = sorted(r.ready_s)
        lines.append(f"spawn to ready/connected: median {statistics.median(rs):.2f} s "
                     f"({rs[0]:.2f}-{rs[-1]:.2f}, {len(rs)} lifetimes)")
    lines.append("kill points:" + (f" (none at a syscall: {r.no_strace})" if r.no_strace
                                    else ""))
    lines += spread(r.kills)
    for what, xs in (("lost seqs", r.lost), ("seqs given twice", r.changed),
                     ("duplicated (seq, seq)", r.duplicated)):
        if xs:
            lines.append(f"{what}: {xs[:20]}{' ...' if len(xs) > 20 else ''}")
    lines += r.exits[:3]
    lines.append("exactly once: " + ("yes" if r.ok else "NO"))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kills", type=int, default=500)
    ap.add_argument("--seed", type=int, default=None, help="default: drawn, and printed")
    ap.add_argument("--rate", type=float, default=40.0, help="results/s of the synthetic camera")
    ap.add_argument("--keep", default=None, help="a folder to run in and keep (default: a "
                    "temporary one, removed)")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2**31)
    print(f"{time.strftime('%Y-%m-%d %H:%M')} seed {seed}, {a.kills} kills, {a.rate:g} "
          f"results/s, load average {os.getloadavg()[0]:.2f}", flush=True)
    if a.keep:
        work = Path(a.keep)
        work.mkdir(parents=True, exist_ok=True)
        r = storm(work, a.kills, seed, a.rate, progress=lambda s: print(s, flush=True))
        (work / "kills.json").write_text(json.dumps([vars(k) for k in r.kills], indent=0))
    else:
        with tempfile.TemporaryDirectory(prefix="edgerun-storm-") as tmp:
            r = storm(Path(tmp), a.kills, seed, a.rate, progress=lambda s: print(s, flush=True))
    print(render(r))
    print(f"load average at the end {os.getloadavg()[0]:.2f}")
    sys.exit(0 if r.ok else 1)


if __name__ == "__main__":
    main()
