"""The daemon's overhead: `edgerun serve` end to end vs a hand-written loop, same frames.

Both inspect the same N PNG files of the synthetic conveyor with the same variant (the one the
daemon chose, loaded through the same backend):
- hand-written: for each file, cv2.imread + the manifest's preprocessing + session.infer,
  back to back in one thread (no persistence, no publishing);
- edgerun: `edgerun serve` as a process on a folder source, persisting every result in the
  outbox and publishing it to a local Mosquitto.
Throughput = N / (last result - first capture); latency = per frame, decode to result
(`e2e_ms` for the daemon), measured with frames handed over one at a time so queueing
behind a backlog does not count as latency. No coordinator runs here (it would compete for the same
two cores); the daemon publishes every result to the broker and keeps it in its outbox.
Also prints the daemon's steady-state RSS and the time from
process start to READY=1 with a warm profile cache (second start).

Usage: python bench/overhead.py [--n 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import bundled
from models.synthetic import samples
from runtime.choice.profiler import plan
from runtime.config import load
from runtime.engine.backends import discover
from runtime.engine.manifest import load_manifest, model_files
from runtime.wire.broker import Mosquitto

CONFIG = """
[model]
path = "{model}"
[constraints]
latency_ms = 50.0
accuracy_floor = 0.97
[profiler]
time_budget_s = 0.3
cache_dir = "{work}/profiles"
[backends]
enabled = ["onnxruntime"]
threads = [1]
[backends.onnxruntime]
spinning = [false]
include_default = false
[source]
kind = "folder"
path = "{folder}"
watch = true
[governor]
policy = "off"
[daemon]
state_dir = "{work}/state"
[telemetry]
fleet = "bench"
device = "overhead"
[telemetry.broker]
host = "127.0.0.1"
port = {port}
[telemetry.outbox]
path = "{work}/state/outbox.db"
"""


def start_serve(cfg: Path, work: Path, notify: str) -> tuple[subprocess.Popen, float]:
    """Start the daemon; returns (process, seconds to READY=1)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(notify)
    sock.settimeout(120)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--config", str(cfg)],
                            env={**os.environ, "NOTIFY_SOCKET": notify},
                            stdout=(work / "daemon.log").open("a"), stderr=subprocess.STDOUT)
    while b"READY=1" not in sock.recv(4096):
        pass
    ready = time.monotonic() - t0
    sock.close()
    os.unlink(notify)
    return proc, ready


def wait_refined(log: Path, timeout_s: float = 300.0) -> None:
    """Until the daemon's log says the profiling schedule closed (`N variants of M profiled
    in`, written once the background refinement has cached its last profile)."""
    deadline = time.monotonic() + timeout_s
    while " profiled in " not in log.read_text(errors="replace"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{log}: no 'profiled in' line within {timeout_s:.0f} s")
        time.sleep(0.2)


def rss_mb(pid: int) -> float:
    """Resident set size of a process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def outbox_results(db: Path) -> list[dict]:
    """Results the daemon persisted (no coordinator acks them here, so all stay)."""
    con = sqlite3.connect(db, timeout=30)
    try:
        return [json.loads(b) for (b,) in con.execute("SELECT body FROM results ORDER BY seq")]
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


def count(db: Path) -> int:
    """Results persisted so far (COUNT only: parsing them while the daemon runs would take
    CPU from it on a 2-core machine)."""
    con = sqlite3.connect(db, timeout=30)
    try:
        return con.execute("SELECT COUNT(*) FROM results").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        con.close()


def feed(files: list[Path], folder: Path, one_at_a_time: bool) -> None:
    """Move files into the watched folder: all at once, or one every 30 ms (far more than a
    frame takes, so none waits behind another; no polling that would compete for the CPU)."""
    for p in files:
        os.rename(p, folder / p.name)
        if one_at_a_time:
            time.sleep(0.03)


def run_serve(cfg: Path, work: Path, files: list[Path], folder: Path, one_at_a_time: bool,
              tag: str) -> tuple[list[dict], float, float, float]:
    """One daemon run over `files`; returns (results, seconds to READY, idle RSS, peak RSS)."""
    db = work / "state" / "outbox.db"
    before = count(db)
    proc, ready = start_serve(cfg, work, str(work / f"notify-{tag}"))
    time.sleep(1.0)
    idle = peak = rss_mb(proc.pid)
    feed(files, folder, one_at_a_time)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and count(db) < before + len(files):
        peak = max(peak, rss_mb(proc.pid))
        time.sleep(0.2)
    proc.terminate()
    proc.wait(30)
    return outbox_results(db)[before:], ready, idle, peak


def hand_loop(variant: str, cfg: Path, files: list[Path], gap_s: float = 0.0
              ) -> tuple[float, list]:
    """decode + preprocess + infer with the daemon's variant; (frames/s, latencies ms).
    `gap_s` idles between frames the way one-at-a-time arrivals do (cold caches count for
    both sides)."""
    cfgd = load(cfg)
    man = load_manifest(bundled())
    items = plan(discover(cfgd.backends), model_files(man), (1,), cfgd.backends)
    backend, v = next((b, v) for b, _, v in items if v.id == variant)
    session = backend.load(v)
    shape = v.model.input_shape
    lat = []
    t0 = time.perf_counter()
    for p in files:
        if gap_s:
            time.sleep(gap_s)
        s = time.perf_counter()
        session.infer(man.preprocess.apply(cv2.imread(str(p), cv2.IMREAD_COLOR), shape))
        lat.append((time.perf_counter() - s) * 1e3)
    fps = len(files) / (time.perf_counter() - t0)
    session.close()
    return fps, lat


def main() -> None:
    """Run both and print the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--single", type=int, default=300, help="frames in the latency phase")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        folder = work / "frames"
        folder.mkdir()
        pool = [s.image for s in samples(seed=11, count=200)]
        files = []
        for i in range(a.n + a.single):
            p = work / f"f{i:05d}.png"
            cv2.imwrite(str(p), pool[i % len(pool)])
            files.append(p)
        bulk, paced = files[: a.n], files[a.n:]
        broker = Mosquitto(work, auth=False).start()
        cfg = work / "edgerun.toml"
        cfg.write_text(CONFIG.format(model=bundled(), work=work, folder=folder, port=broker.port))
        try:
            # First start fills the profile cache (its background refinement included, so
            # the timed starts serve from a full cache); later starts are the warm ones.
            proc, cold = start_serve(cfg, work, str(work / "notify-cold"))
            wait_refined(work / "daemon.log")
            proc.terminate()
            proc.wait(30)
            results, warm, idle_rss, peak_rss = run_serve(cfg, work, bulk, folder, False, "bulk")
            variant = results[0]["variant"]
            t_first = min(r["t"] for r in results)
            t_last = max(r["t"] + r["e2e_ms"] / 1e3 for r in results)
            serve_fps = len(results) / (t_last - t_first)
            hand_fps, _ = hand_loop(variant, cfg, [folder / p.name for p in bulk])
            single, *_ = run_serve(cfg, work, paced, folder, True, "single")
            serve_p95 = float(np.percentile([r["e2e_ms"] for r in single], 95))
            gaps = np.diff(sorted(r["t"] for r in single))
            _, lat = hand_loop(variant, cfg, [folder / p.name for p in paced],
                               float(np.median(gaps)))
            hand_p95 = float(np.percentile(lat, 95))
        finally:
            broker.stop()
        print(f"variant {variant}; {len(results)} frames back to back, then {len(paced)} "
              "one at a time (latency without queueing)")
        print(f"throughput : hand-written {hand_fps:7.0f}/s, edgerun serve {serve_fps:7.0f}/s "
              f"-> {serve_fps / hand_fps:.2f}x (target >= 1.0)")
        print(f"latency p95: hand-written {hand_p95:.3f} ms, edgerun serve {serve_p95:.3f} ms "
              f"-> {serve_p95 / hand_p95:.2f}x (target <= 1.10); decode to durable result, "
              f"frames {float(np.median(gaps)) * 1e3:.0f} ms apart on both sides")
        print(f"daemon RSS : {idle_rss:.0f} MB idle, {peak_rss:.0f} MB peak (target <= 250)")
        print(f"to READY   : {warm:.2f} s warm profile cache (target <= 3), {cold:.2f} s cold")


if __name__ == "__main__":
    main()
