"""Model swaps under live traffic: frames lost and latency around the switch vs steady state.

One `edgerun serve` process (synthetic conveyor at --rate frames/s, ONNX Runtime, 1 thread)
against a local Mosquitto and an in-process coordinator with its API. After a steady period,
--swaps signed bundles are deployed one after the other through the coordinator (download over
the API, verify, profile in the background with the cache, swap between frames, probation with
the shadow sample); each waits for its probation verdict. Versions alternate between the
bundled inspection model's fp32 (96x96) and fp32-r60 (60x60) forms, so every swap changes the
input shape and the preprocessing the frames need.

Per swap it prints: frames lost (capture counters: frames dropped because the pipeline was
behind, plus frames captured but never stored, plus gaps in result seqs), and the p95 of the
frames' capture-to-result latency (`e2e_ms`) in the window [swap - 0.5 s, swap + 2 s] next to
the steady state's p95 (the --steady seconds before the first deploy). Targets: 0 frames lost,
window p95 <= 1.5x steady.

Usage: python bench/model_swap.py [--swaps 6] [--rate 40] [--steady 10]
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the config writer
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from support.daemon_toml import daemon_toml

from models import bundled
from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.api import serve
from runtime.coordinator.service import Coordinator
from runtime.engine.onnx_model import file_sha256
from runtime.ota.bundle import make
from runtime.wire.broker import Mosquitto
from runtime.wire.commands import generate_keypair, load_private_key

FLEET, DEVICE = "bench", "box1"


def model_dir(where: Path, form: str) -> Path:
    """A one-variant copy of the bundled model's `form` (fp32 or fp32-r60)."""
    base = json.loads((bundled() / "manifest.json").read_text())
    v = next(x for x in base["variants"] if x["name"] == form)
    where.mkdir(parents=True)
    shutil.copy(bundled() / v["file"], where / v["file"])
    assert file_sha256(where / v["file"]) == v["sha256"]
    (where / "manifest.json").write_text(json.dumps({**base, "variants": [v], "failed": []}))
    return where


def config(tmp: Path, broker: Mosquitto, model: Path, rate: float) -> Path:
    creds = broker.device(FLEET, DEVICE)
    zone = tmp / "sysfs" / "sys/class/thermal/thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "temp").write_text("40000\n")
    cfg = tmp / "edgerun.toml"
    cfg.write_text(daemon_toml(tmp / "state", {
        "device": {"sysfs_root": tmp / "sysfs"},
        "model": {"path": model},
        "models": {"publisher_keys": [tmp / "publisher.pub"], "probation_frames": 200,
                   "agreement_floor": 0.5},
        "constraints": {"latency_ms": 50.0},
        "profiler": {"warmup_runs": 5, "min_runs": 30, "max_runs": 300, "time_budget_s": 0.3,
                     "idle_baseline_s": 0.1, "cache_dir": tmp / "profiles"},
        "source": {"kind": "synthetic", "rate_hz": rate},
        "governor": {"policy": "off", "rate_hz": rate},
        "telemetry": {"fleet": FLEET, "device": DEVICE, "health_interval_s": 0.5,
                      "trusted_keys": [tmp / "command.pub"]},
        "telemetry.broker": {"host": "127.0.0.1", "port": broker.port,
                             "username": creds.username, "password_file": creds.password_file},
    }))
    return cfg


def wait(cond, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.1)


def p95(xs: list[float]) -> float:
    return float(np.percentile(xs, 95)) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--swaps", type=int, default=6)
    ap.add_argument("--rate", type=float, default=40.0)
    ap.add_argument("--steady", type=float, default=10.0)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir and daemon log")
    ap.add_argument("--gap", type=float, default=4.0, help="quiet seconds between swaps (the "
                    "steady reference of the next swap)")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="edgerun-swap-"))
    (tmp / "broker").mkdir()
    broker = Mosquitto(tmp / "broker").start()
    generate_keypair(tmp / "command.pem", tmp / "command.pub")
    generate_keypair(tmp / "publisher.pem", tmp / "publisher.pub")
    (tmp / "device-keys").mkdir()
    coord = Coordinator(CoordinatorConfig(
        fleet=FLEET, broker=broker.coordinator(FLEET), store=str(tmp / "coord" / "c.db"),
        signing_key=str(tmp / "command.pem"), device_keys=str(tmp / "device-keys")))
    coord.start()
    api = serve(coord, "127.0.0.1", 0, token="b" * 32)
    key = load_private_key(tmp / "publisher.pem")
    forms = ["fp32-r60", "fp32"]
    bundles = []
    for i in range(a.swaps):
        d = model_dir(tmp / f"src{i}", forms[i % 2])
        make(d, key, tmp / f"b{i}.edgerun", str(i + 2))
        with (tmp / f"b{i}.edgerun").open("rb") as f:
            bundles.append(coord.shelf.receive(f, (tmp / f"b{i}.edgerun").stat().st_size).id)
    log = (tmp / "daemon.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--config",
                             str(config(tmp, broker, model_dir(tmp / "v1", "fp32"), a.rate))],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        wait(lambda: (tmp / "state" / "device.pub").exists(), 120, "device key")
        shutil.copy(tmp / "state" / "device.pub", tmp / "device-keys" / f"{DEVICE}.pub")
        # past the synthetic source's warm-up (it renders its first 256 parts, then reuses
        # them) and the daemon's start-up checks
        wait(lambda: coord.store.counts().get(DEVICE, 0) > 400, 180, "warm-up results")
        t_steady = time.time()
        time.sleep(a.steady)
        quiet = []  # (start, end) of the steady window just before each deploy
        deployed = []
        for b in bundles:
            quiet.append((time.time() - (a.steady if not quiet else a.gap), time.time()))
            deployed.append(time.time())
            n_before = len([e for e in coord.store.events(DEVICE, 10_000)
                            if e["type"] in ("model_probation_passed", "model_rolled_back")])
            reply = coord.send_command(DEVICE, "deploy", coord.deploy_args(b), wait_s=20)
            assert reply and reply["ok"], reply
            wait(lambda n=n_before: len([e for e in coord.store.events(DEVICE, 10_000)
                                         if e["type"] in ("model_probation_passed",
                                                          "model_rolled_back")]) > n,
                 180, f"verdict on {b}")
            time.sleep(a.gap)  # a quiet stretch: the next swap's steady-state reference
        time.sleep(2.5)
        res = coord.store.results(DEVICE, 0, 10_000_000)
        evs = sorted(coord.store.events(DEVICE, 10_000), key=lambda e: e["t"])
        health = coord.store.latest_health()[DEVICE]
        history = [(t, json.loads(b)["pipeline"]) for t, b in coord.store._query(
            "SELECT t, body FROM health WHERE device=? ORDER BY t", (DEVICE,))]
    finally:
        proc.terminate()
        proc.wait(60)
        api.shutdown()
        coord.stop()
        broker.stop()
    swaps = [e for e in evs if e["type"] == "model_swapped"]
    verdicts = [e for e in evs if e["type"] in ("model_probation_passed", "model_rolled_back")]
    seqs = sorted(r["seq"] for r in res)
    gaps = sum(b - a - 1 for a, b in itertools.pairwise(seqs) if b > a + 1)
    c = health["pipeline"]

    def dropped(t0: float, t1: float) -> int:
        """Frames dropped between the last health before t0 and the first after t1."""
        before = [p for t, p in history if t <= t0] or [history[0][1]]
        after = [p for t, p in history if t >= t1] or [history[-1][1]]
        return after[0].get("dropped_stale", 0) - before[-1].get("dropped_stale", 0)

    def e2e(t0: float, t1: float) -> list[float]:
        return [r["e2e_ms"] for r in res if t0 <= r["t"] <= t1]

    print(f"edgerun model swap bench: {len(swaps)} swaps, synthetic conveyor at {a.rate:g} "
          f"frames/s, ONNX Runtime 1 thread; e2e = capture to stored result")
    print(f"{'swap':<30} {'steady p95':>11} {'switch p95':>11} {'ratio':>6} "
          f"{'dropped: steady':>16} {'prepare':>8} {'switch':>7} {'probation':>10}  verdict")
    ratios = []
    for i, s in enumerate(swaps):
        q0, q1 = quiet[i]
        steady, win = e2e(q0, q1), e2e(s["t"] - 0.5, s["t"] + 2.0)
        ratio = p95(win) / p95(steady)
        ratios.append(ratio)
        v = next((e for e in verdicts if e["t"] >= s["t"]), {"type": "?"})
        print(f"{i + 1}: {s['from']:>12} -> {s['to']:<12} {p95(steady):>8.2f} ms "
              f"{p95(win):>8.2f} ms {ratio:>6.2f} {dropped(q0, q1):>16} "
              f"{dropped(deployed[i], s['t'] - 0.5):>8} "
              f"{dropped(s['t'] - 0.5, s['t'] + 2.0):>7} "
              f"{dropped(s['t'] + 2.0, v.get('t', s['t'] + 2.0)):>10}  "
              f"{v['type'].removeprefix('model_')}")
    # Lost: dropped because the pipeline was behind, or stored results with seq gaps (frames
    # captured minus results is what was still in flight at the last health message).
    run = dropped(t_steady, history[-1][0])
    lost = run + gaps
    print(f"frames captured {c.get('frames', 0)}, results {c.get('results', 0)} (the rest in "
          f"flight at the last health); dropped because behind: {run} from the steady start "
          f"on ({c.get('dropped_stale', 0) - run} in the source's warm-up before it); result "
          f"seq gaps {gaps}: frames lost {lost} (target 0). 'prepare' = download, verify, "
          "profile in the background; drops are counted from health every 0.5 s, so a "
          "window's count may include up to 0.5 s around it")
    print(f"p95 around the switch / steady just before: median {np.median(ratios):.2f}x, "
          f"worst {max(ratios):.2f}x (target <= 1.5x)")
    if a.keep:
        print(f"kept {tmp} (daemon.log)")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
