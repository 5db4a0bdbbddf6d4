"""A brokerless `edgerun serve` child process and its outbox, for daemon-input tests."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from runtime.config import (
    BackendsConfig,
    OnnxRuntimeConfig,
)
from runtime.engine.backends import discover
from runtime.engine.manifest import model_files
from runtime.telemetry import resultlog
from runtime.wire.broker import Mosquitto
from support.daemon_toml import daemon_toml
from support.under_test import child_env

TESTS = Path(__file__).parents[1]
ZONE = "sys/class/thermal/thermal_zone0"

# The daemon under test: a generic x86 box, a profiler short enough for a test, a synthetic
# camera at 40 frames/s and the step_wise governor ticking fast (5 ticks a second).
UNDER_TEST = {
    "device": {"profile": "generic-x86"},
    "constraints": {"latency_ms": 100.0},
    "profiler": {"warmup_runs": 2, "min_runs": 10, "max_runs": 100, "time_budget_s": 0.05,
                 "idle_baseline_s": 0.05},
    "source": 'kind = "synthetic"\nrate_hz = 40',
    "governor": {"policy": "step_wise", "tick_s": 0.2, "rate_hz": 40},
    "telemetry": {"fleet": "t", "device": "box1"},
}


def write_config(tmp_path: Path, cache: Path, source: str = "", latency_ms: float = 100.0,
                 extra: str = "", name: str = "edgerun.toml") -> Path:
    """A config for `serve` with no broker (results stay in the outbox) and a fake sysfs."""
    zone = tmp_path / "sysfs" / ZONE
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "temp").write_text("40000\n")
    cfg = tmp_path / name
    cfg.write_text(daemon_toml(tmp_path / "state", UNDER_TEST, {
        "device": {"sysfs_root": tmp_path / "sysfs"},
        # accuracy_floor 0.99: the top rung is a 96 px form (0.990), several times the CPU of
        # the reduced rungs and small, so the ladder keeps rungs below it however noisy sub-0.1
        # ms measurements are here (tests that want no floor remove the line)
        "constraints": {"latency_ms": latency_ms, "accuracy_floor": 0.99},
        "profiler": {"cache_dir": cache},
        **({"source": source} if source else {}),
        "telemetry": {"health_interval_s": 0.3},
        # the health history held in memory a second, not the product's minute: tests read
        # the file while the daemon runs
        "storage": {"history_flush_s": 1.0},
    }, extra=extra))
    return cfg


def set_temp(root: Path, celsius: float) -> None:
    """Set the fake thermal zone under `root` to `celsius` (atomically, as sysfs reads)."""
    zone = root / ZONE
    zone.mkdir(parents=True, exist_ok=True)
    tmp = zone / ".temp.tmp"
    tmp.write_text(f"{round(celsius * 1000)}\n")
    os.replace(tmp, zone / "temp")


def write_broker_config(tmp_path: Path, broker: Mosquitto, cache: Path, source: str = "",
                 backends: str = "", extra: str = "") -> Path:
    """A config for `serve` that publishes to `broker` as device box1 of fleet "sys"
    (test_daemon's Coordinator listens there), with a fake sysfs at 40 °C."""
    root = tmp_path / "sysfs"
    if not (root / ZONE / "temp").exists():
        set_temp(root, 40.0)
    creds = broker.device("sys", "box1")
    cfg = tmp_path / "edgerun.toml"
    cfg.write_text(daemon_toml(tmp_path / "state", UNDER_TEST, {
        "device": {"sysfs_root": root},
        # accuracy_floor 0.985: the top rung is a 96 px form (2-4x the CPU of the reduced rungs
        # and small), so the ladder has rungs below it however noisy this machine's sub-0.1 ms
        # measurements are (the reduced rungs differ by less than the run-to-run noise here)
        "constraints": {"accuracy_floor": 0.985},
        "profiler": {"max_runs": 1000, "time_budget_s": 0.1, "cache_dir": cache},
        **({"backends": f"{backends}\nthreads = [1]"} if backends else {}),
        **({"source": source} if source else {}),
        "telemetry": {"fleet": "sys", "health_interval_s": 0.5, "ack_timeout_s": 1.0},
        "telemetry.broker": {"host": "127.0.0.1", "port": broker.port, "keepalive_s": 5,
                             "username": creds.username,
                             "password_file": creds.password_file},
    }, extra=extra))
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


def held_rows(db: Path) -> list[tuple[int, str]]:
    """(seq, json) of every result the outbox holds, in seq order: those in its database and
    those only in its result log (resultlog.py), unacked."""
    rows = dict(_query(db, "SELECT seq, body FROM results"))
    rec = resultlog.read(db.with_name(db.name + ".log"))
    floor = max([rec.acked, *_query_seq(db)])
    rows.update((q, b) for q, b in rec.results if q > floor and q not in rows)
    return sorted(rows.items())


def _query_seq(db: Path) -> list[int]:
    """The database's highest seq ever stored (results at or below it in the log were moved
    into the database or acked)."""
    return [s for (s,) in _query(db, "SELECT seq FROM sqlite_sequence WHERE name='results'")]


def result_seqs(db: Path) -> list[int]:
    """Seqs of the results held in the outbox, in order."""
    return [s for s, _ in held_rows(db)]


def results(db: Path) -> list[dict]:
    """Results held in the outbox, in seq order."""
    return [json.loads(b) for _, b in held_rows(db)]


def results_by_seq(db: Path) -> dict[int, dict]:
    """The results held in the outbox by their seq (the seq the native tree and Sparkplug's
    `Last Result/Seq` carry)."""
    return {s: json.loads(b) for s, b in held_rows(db)}


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


def fp32_variant(model):
    """(variant, backend) of a model's fp32 variant on onnxruntime, one thread, unspinning."""
    bcfg = BackendsConfig(enabled=("onnxruntime",), threads=(1,),
                          onnxruntime=OnnxRuntimeConfig(spinning=(False,),
                                                        include_default=False))
    (backend,) = discover(bcfg)
    v = next(v for f in model_files(model) for v in backend.variants(f, bcfg, (1,))
             if "fp32" in v.id)
    return v, backend
