"""The daemon's memory on a cold start (no profile cache) against a warm one, every engine.

A cold `edgerun serve` profiles every variant it can run (ONNX Runtime, OpenVINO, OpenCV DNN,
OpenCL; precisions, threads) and first measures the accuracy of the engines' own lower
precisions on the eval images; a warm one reads it all from the cache. On a 1 GB box the cold
start's peak is what the OOM killer sees on first boot and after every model update (the
cache is keyed by the model's content). Each run starts the daemon on the bundled model
with a fresh profile cache and the product's default engines and threads, samples its RSS
every 20 ms until the background refinement has finished (`profiled in`), and reads its
VmHWM; then starts it again on that cache (warm) until READY and 1 s after.

Printed per run, and as median (min-max): VmHWM; the peak's anonymous and file-backed parts
(RssAnon, RssFile: library code pages count in RSS and the OOM killer's score, but the kernel
can drop them under pressure, the anonymous part it cannot); RSS when each phase was logged
(engines discovered, the lowered precisions' accuracy measured, first choice, ready,
refinement done); seconds to READY and to the end of the schedule; RSS 1 s after. The load
average before each run beside it.

Usage: python bench/cold_start.py [--runs 3] [--engines onnxruntime,openvino,...]
(tests/frames/test_overhead_guard.py bounds the cold start's peak of bench/overhead.py's
daemon, ONNX Runtime alone.)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the config writer
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.daemon_toml import daemon_toml

from models import bundled

# Log lines that close each phase of a cold start, in order (the RSS when each first shows)
PHASES = (
    ("discovered", "preprocessing"),  # measure_first's first line: engines built
    ("accuracy", "(quick round): variant 1/"),  # the lowered precisions measured
    ("first choice", "first choice for"),
    ("ready", "ready in"),
    ("refined", " profiled in "),
)


def status(pid: int) -> dict[str, float]:
    """VmRSS, VmHWM, RssAnon and RssFile of a process, in MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) / 1024
    return out


def config_text(work: Path, engines: list[str] | None) -> str:
    """The bundled model on a synthetic camera, no broker; the product's engines and threads
    unless `engines` names some (base() restricts the tests' daemons to ONNX Runtime)."""
    backends = {"enabled": engines, "threads": None} if engines else None
    return daemon_toml(work / "state", {
        "model": {"path": bundled()},
        "constraints": {"latency_ms": 50.0, "accuracy_floor": 0.97},
        "profiler": {"cache_dir": work / "profiles"},
        "source": 'kind = "synthetic"\nrate_hz = 10',
        "governor": {"policy": "off"},
        "telemetry": {"fleet": "bench", "device": "cold-start"},
        "backends": backends,
        "backends.onnxruntime": None,
    })


@dataclass
class Start:
    """One start's figures (MiB, seconds)."""

    hwm: float = float("nan")
    anon: float = float("nan")  # at the sampled peak
    file: float = float("nan")
    ready_s: float = float("nan")
    done_s: float = float("nan")
    after: float = float("nan")  # RSS 1 s after the end
    phases: dict[str, float] = field(default_factory=dict)  # RSS when each phase was logged


def start(cfg: Path, log: Path, until: str, limit_s: float = 600.0) -> Start:
    """Run `edgerun serve` until its log says `until`, sampling its memory every 20 ms."""
    s = Start()
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--config",
                                 str(cfg)], stdout=out, stderr=subprocess.STDOUT)
    peak = -1.0
    try:
        while True:
            now = time.monotonic() - t0
            st = status(proc.pid)
            if st["VmRSS"] > peak:
                peak, s.anon, s.file = st["VmRSS"], st["RssAnon"], st["RssFile"]
            text = log.read_text(errors="replace")
            for name, line in PHASES:
                if name not in s.phases and line in text:
                    s.phases[name] = st["VmRSS"]
            if "ready in" in text and s.ready_s != s.ready_s:
                s.ready_s = now
            if until in text:
                s.done_s = now
                break
            if proc.poll() is not None or now > limit_s:
                raise RuntimeError(f"edgerun serve: no {until!r} in {log}:\n{text[-2000:]}")
            time.sleep(0.02)
        time.sleep(1.0)
        st = status(proc.pid)
        s.hwm, s.after = st["VmHWM"], st["VmRSS"]
    finally:
        proc.terminate()
        proc.wait(30)
    return s


def run(engines: list[str] | None) -> tuple[float, Start, Start]:
    """One cold start, then a warm one on its cache; with the load average before."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        cfg = work / "edgerun.toml"
        cfg.write_text(config_text(work, engines))
        cold = start(cfg, work / "cold.log", " profiled in ")
        warm = start(cfg, work / "warm.log", "ready in")
    return load, cold, warm


def spread(xs: list[float], fmt: str = "{:.0f}") -> str:
    """median (min-max)."""
    return (fmt.format(float(np.median(xs))) + " (" + fmt.format(min(xs)) + "-"
            + fmt.format(max(xs)) + ")")


def main() -> None:
    """Run the cold and warm starts `--runs` times and print each and their spread."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--engines", default="", help="comma-separated; default: the product's")
    a = ap.parse_args()
    engines = [e for e in a.engines.split(",") if e] or None
    runs = []
    for i in range(a.runs):
        load, cold, warm = run(engines)
        runs.append((load, cold, warm))
        phases = ", ".join(f"{k} {v:.0f}" for k, v in cold.phases.items())
        print(f"run {i + 1} (load {load:.2f}): cold VmHWM {cold.hwm:.0f} MiB (anon {cold.anon:.0f}"
              f" + file {cold.file:.0f} at the peak; {phases}), READY {cold.ready_s:.1f} s, "
              f"refined {cold.done_s:.1f} s, {cold.after:.0f} after | warm VmHWM {warm.hwm:.0f} "
              f"MiB (anon {warm.anon:.0f} + file {warm.file:.0f}), READY {warm.ready_s:.1f} s",
              flush=True)
    cold = [c for _, c, _ in runs]
    warm = [w for _, _, w in runs]
    print(f"cold start: VmHWM {spread([c.hwm for c in cold])} MiB, anon at the peak "
          f"{spread([c.anon for c in cold])}, READY {spread([c.ready_s for c in cold], '{:.1f}')}"
          f" s, refined {spread([c.done_s for c in cold], '{:.1f}')} s, RSS after "
          f"{spread([c.after for c in cold])} MiB")
    print(f"warm start: VmHWM {spread([w.hwm for w in warm])} MiB, anon at the peak "
          f"{spread([w.anon for w in warm])}, READY {spread([w.ready_s for w in warm], '{:.1f}')}"
          f" s; load {spread([x for x, _, _ in runs], '{:.2f}')}")


if __name__ == "__main__":
    main()
