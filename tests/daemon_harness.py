"""A brokerless `edgerun serve` child process and its outbox, for daemon-input tests."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from under_test import child_env

TESTS = Path(__file__).parent
ZONE = "sys/class/thermal/thermal_zone0"


def write_config(tmp_path: Path, cache: Path, source: str = "", latency_ms: float = 100.0,
                 extra: str = "", name: str = "edgerun.toml") -> Path:
    """A config for `serve` with no broker (results stay in the outbox) and a fake sysfs."""
    zone = tmp_path / "sysfs" / ZONE
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "temp").write_text("40000\n")
    source = source or 'kind = "synthetic"\nrate_hz = 40'
    cfg = tmp_path / name
    cfg.write_text(f"""
[device]
profile = "generic-x86"
sysfs_root = "{tmp_path / 'sysfs'}"
[constraints]
latency_ms = {latency_ms}
# 0.99: the top rung is a `large` variant, several times the CPU of the rest, so the ladder
# keeps rungs below it however noisy sub-0.1 ms measurements are on a shared machine
accuracy_floor = 0.99
[profiler]
warmup_runs = 2
min_runs = 10
max_runs = 100
time_budget_s = 0.05
idle_baseline_s = 0.05
cache_dir = "{cache}"
[backends]
enabled = ["onnxruntime"]
threads = [1]
[backends.onnxruntime]
spinning = [false]
include_default = false
[source]
{source}
[governor]
policy = "step_wise"
tick_s = 0.2
rate_hz = 40
[daemon]
state_dir = "{tmp_path / 'state'}"
[telemetry]
fleet = "t"
device = "box1"
health_interval_s = 0.3
[telemetry.outbox]
path = "{tmp_path / 'state' / 'outbox.db'}"
{extra}
""")
    return cfg


class Serve:
    """`edgerun serve --config` as a child process, logging to a file."""

    def __init__(self, tmp_path: Path, cfg: Path, args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, stdout: Path | None = None):
        """`args` go after `serve --config CFG`; `env` is added to the environment;
        `stdout` (a file) separates stdout from the log (stderr) when given."""
        self.log = tmp_path / "daemon.log"
        self.outbox = tmp_path / "state" / "outbox.db"
        self._log_start = self.log.stat().st_size if self.log.exists() else 0
        self.started_at = time.time()
        err = self.log.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runtime.cli", "serve", "--config", str(cfg), *args],
            stdout=stdout.open("a") if stdout else err,
            stderr=err if stdout else subprocess.STDOUT,
            env=child_env(TESTS, **(env or {})))

    def text(self) -> str:
        """This process's part of the log."""
        with self.log.open("rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    def ready(self) -> bool:
        return "ready in" in self.text()

    def stop(self, timeout_s: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(timeout_s)
        return self.proc.returncode


def wait(cond, timeout_s: float, what: str, proc: Serve | None = None) -> None:
    """Poll `cond` until true; fail naming `what` (with the log tail) on timeout or exit."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        if proc is not None and proc.proc.poll() is not None:
            raise AssertionError(f"daemon exited ({proc.proc.returncode}) waiting for {what}:\n"
                                 + proc.text()[-3000:])
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}"
                         + (f"\n{proc.text()[-3000:]}" if proc else ""))


def _query(db: Path, sql: str) -> list[tuple]:
    if not db.exists():
        return []
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return con.execute(sql).fetchall()
    except sqlite3.OperationalError:  # the daemon has not made its tables yet
        return []
    finally:
        con.close()


def result_seqs(db: Path) -> list[int]:
    """Seqs of the results held in the outbox, in order."""
    return [s for (s,) in _query(db, "SELECT seq FROM results ORDER BY seq")]


def results(db: Path) -> list[dict]:
    """Results held in the outbox, in seq order."""
    return [json.loads(b) for (b,) in _query(db, "SELECT body FROM results ORDER BY seq")]


def admitted(kind: str, body: str) -> dict:
    """`body` parsed, failing the test unless the coordinator would admit it: a field the
    daemon sends but the closed wire schema (runtime/wire/payloads.py) does not declare
    is quarantined at the coordinator, so the operator would never see it."""
    from runtime.wire import payloads

    msg = json.loads(body)
    try:
        payloads.check(kind, msg)
    except payloads.PayloadError as e:
        raise AssertionError(f"the daemon queued a {kind} the coordinator would quarantine: "
                             f"{e}\n{body[:2000]}") from None
    return msg


def events(db: Path, type_: str | None = None) -> list[dict]:
    """Events queued in the outbox (oldest first), optionally of one type; each must be one
    the coordinator admits."""
    evs = [admitted("event", b) for (b,) in _query(db, "SELECT body FROM other WHERE "
                                                       "kind='event' ORDER BY id")]
    return [e for e in evs if type_ is None or e["type"] == type_]


def last_health(db: Path) -> dict | None:
    """The newest health message in the outbox (one the coordinator admits)."""
    rows = _query(db, "SELECT body FROM other WHERE kind='health' ORDER BY id DESC LIMIT 1")
    return admitted("health", rows[0][0]) if rows else None
