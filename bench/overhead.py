"""The daemon's overhead: `edgerun serve` end to end vs a hand-written loop, same frames.

Both inspect the same N PNG files of the synthetic conveyor with the same variant (the one the
daemon chose, loaded through the same backend):
- hand-written: for each file, cv2.imread + the manifest's preprocessing + session.infer,
  back to back in one thread (no persistence, no publishing);
- edgerun: `edgerun serve` as a process on a folder source, persisting every result in the
  outbox and publishing it to a local Mosquitto.
Throughput = N / (last result - first capture); latency = per frame, decode to result
(`e2e_ms` for the daemon), measured with frames handed over one at a time so queueing
behind a backlog does not count as latency. Side by side: one warm daemon serves `--rounds`
blocks of frames, and after each block the hand loop runs the same files, so both sides of
every ratio see the same moment of a shared machine's load; each figure is printed per round
with its median and spread, and the load average beside it. CPU time per frame (the daemon's
whole process against the hand loop's) is printed too: on a machine shared with other work a
multi-threaded process gets more of the CPU than a one-thread loop, which flatters the
throughput ratio; CPU per frame does not depend on that. No coordinator runs here (it would
compete for the same two cores); the daemon publishes every result to the broker and keeps it
in its outbox.
Also prints the daemon's steady-state RSS, its CPU and its main thread's wake-ups while idle
(a quiet watched folder, connected to the broker, `--idle-s` after the warm start), the
time from process start to READY=1 with a warm profile cache (second start), and the peak
RSS (VmHWM) of the first start, which profiled every variant, and of the warm one
(bench/cold_start.py: the same with every engine).

`--integrations on` runs the daemon with [sparkplug] (on the same broker) and [opcua]
(loopback) enabled, nobody listening to either; `both` measures the plain daemon and then
that one in the same run (`--on-first`: the other order) and prints the ratios side by side.

Usage: python bench/overhead.py [--n 3000] [--single 300] [--rounds 3] [--integrations both]
(tests/frames/test_overhead_guard.py runs a short version of it in CI.)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the config writer
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support.daemon_harness import held_rows
from support.daemon_toml import daemon_toml

from models import bundled
from models.synthetic import samples
from runtime.choice.profiler import plan
from runtime.config import load
from runtime.engine.backends import discover
from runtime.engine.manifest import load_manifest, model_files
from runtime.telemetry.outbox import last_seq
from runtime.wire.broker import Mosquitto


def config_text(work: Path, model: Path, folder: Path, port: int, budget: float,
                extra: str) -> str:
    """The daemon's config: the bundled model on a watched image folder, no governor, the
    profiler's own defaults but its time budget."""
    return daemon_toml(work / "state", {
        "model": {"path": model},
        "constraints": {"latency_ms": 50.0, "accuracy_floor": 0.97},
        "profiler": {"time_budget_s": budget, "cache_dir": work / "profiles"},
        "source": {"kind": "folder", "path": folder, "watch": True},
        "governor": {"policy": "off"},
        "telemetry": {"fleet": "bench", "device": "overhead"},
        "telemetry.broker": {"host": "127.0.0.1", "port": port},
    }, extra=extra)

# --integrations on: the factory floor's two opt-in integrations beside the native tree
# (docs/sparkplug.md, docs/plc.md): a Sparkplug B edge node on the same broker, and the
# PLC's OPC UA server on loopback (port 0: any free one); nobody subscribes to either, so
# what is measured is what the daemon itself spends on them.
SPARKPLUG = """
[sparkplug]
enabled = true
"""
OPCUA = """
[opcua]
enabled = true
port = 0
"""
INTEGRATIONS = {"off": "", "on": SPARKPLUG + OPCUA, "sparkplug": SPARKPLUG, "opcua": OPCUA}


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


def cpu_s(pid: int) -> float:
    """A process's CPU seconds, all its threads (exited ones included), user + system."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    """Resident set size of a process (`field` "VmHWM": the most it has had)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def voluntary_switches(pid: int) -> int:
    """Times a process's main thread went to sleep (the kernel's count)."""
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def outbox_results(db: Path) -> list[dict]:
    """Results the daemon persisted (no coordinator acks them here, so all stay), in its
    outbox's database and its result log."""
    return [json.loads(b) for _, b in held_rows(db)]


def count(db: Path) -> int:
    """Results persisted so far: nothing is acked here, so the highest seq given is the count
    (read without parsing the outbox while the daemon runs on a 2-core machine)."""
    return last_seq(db)


def feed(files: list[Path], folder: Path, one_at_a_time: bool) -> None:
    """Move files into the watched folder: all at once, or one every 30 ms (far more than a
    frame takes, so none waits behind another; no polling that would compete for the CPU)."""
    for p in files:
        os.rename(p, folder / p.name)
        if one_at_a_time:
            time.sleep(0.03)


class Serve:
    """A warm `edgerun serve` fed block by block; results read back from its outbox."""

    def __init__(self, cfg: Path, work: Path, folder: Path, idle_s: float = 0.0):
        self.db = work / "state" / "outbox.db"
        self.folder = folder
        self.proc, self.ready_s = start_serve(cfg, work, str(work / "notify-warm"))
        time.sleep(1.0)
        self.idle_rss = self.peak_rss = rss_mb(self.proc.pid)
        self.idle_cpu_pct = self.idle_wakeups_hz = float("nan")
        if idle_s > 0:  # nothing to inspect yet: what the daemon costs waiting
            pid = self.proc.pid
            c0, n0 = cpu_s(pid), voluntary_switches(pid)
            time.sleep(idle_s)
            self.idle_cpu_pct = (cpu_s(pid) - c0) / idle_s * 100
            self.idle_wakeups_hz = (voluntary_switches(pid) - n0) / idle_s

    def run(self, files: list[Path], one_at_a_time: bool) -> list[dict]:
        """Move `files` into the watched folder and wait for all their results (the
        process's CPU seconds meanwhile in `self.cpu`)."""
        before = count(self.db)
        c0 = cpu_s(self.proc.pid)
        feed(files, self.folder, one_at_a_time)
        deadline = time.monotonic() + 600
        while count(self.db) < before + len(files):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"edgerun serve: {count(self.db) - before} of {len(files)} "
                                   "results (see daemon.log)")
            self.peak_rss = max(self.peak_rss, rss_mb(self.proc.pid))
            time.sleep(0.05)
        self.cpu = cpu_s(self.proc.pid) - c0
        return outbox_results(self.db)[before:]

    def stop(self) -> None:
        """SIGTERM and wait."""
        self.proc.terminate()
        self.proc.wait(30)


class HandLoop:
    """decode + preprocess + infer with the daemon's variant, in one thread."""

    def __init__(self, variant: str, cfg: Path):
        cfgd = load(cfg)
        self.man = load_manifest(bundled())
        items = plan(discover(cfgd.backends), model_files(self.man), (1,), cfgd.backends)
        backend, v = next((b, v) for b, _, v in items if v.id == variant)
        self.session = backend.load(v)
        self.shape = v.model.input_shape

    def run(self, files: list[Path], gap_s: float = 0.0) -> tuple[float, list[float]]:
        """(frames/s, latencies ms) over `files`; `gap_s` idles between frames the way
        one-at-a-time arrivals do (cold caches count for both sides). CPU seconds in
        `self.cpu`."""
        lat = []
        c0, t0 = time.process_time(), time.perf_counter()
        for p in files:
            if gap_s:
                time.sleep(gap_s)
            s = time.perf_counter()
            self.session.infer(self.man.preprocess.apply(cv2.imread(str(p), cv2.IMREAD_COLOR),
                                                         self.shape))
            lat.append((time.perf_counter() - s) * 1e3)
        wall = time.perf_counter() - t0
        self.cpu = time.process_time() - c0
        return len(files) / wall, lat

    def close(self) -> None:
        """Release the session."""
        self.session.close()


@dataclass
class Figures:
    """One run's figures: per round, side by side."""

    variant: str = ""
    throughput: list[tuple[float, float]] = field(default_factory=list)  # (hand, serve) /s
    p95: list[tuple[float, float]] = field(default_factory=list)  # (hand, serve) ms
    cpu_ms: list[tuple[float, float]] = field(default_factory=list)  # per frame (hand, serve)
    gap_ms: float = float("nan")
    idle_rss: float = float("nan")
    peak_rss: float = float("nan")
    # VmHWM of the first start (no profile cache) once its refinement finished, and of the
    # second start (warm cache) when its idle RSS was read
    cold_peak: float = float("nan")
    warm_peak: float = float("nan")
    idle_cpu_pct: float = float("nan")  # of one core
    idle_wakeups_hz: float = float("nan")  # the main thread's sleeps a second
    ready_warm: float = float("nan")
    ready_cold: float = float("nan")
    load: list[float] = field(default_factory=list)  # 1-min load average before each round

    @property
    def fps_ratios(self) -> list[float]:
        """serve / hand-loop throughput per round."""
        return [s / h for h, s in self.throughput]

    @property
    def cpu_ratios(self) -> list[float]:
        """serve / hand-loop CPU time per frame, back to back, per round."""
        return [s / h for h, s in self.cpu_ms]

    @property
    def p95_ratios(self) -> list[float]:
        """serve / hand-loop p95 latency per round."""
        return [s / h for h, s in self.p95]


WARMUP = 100  # frames each side runs before the timed rounds


def serve_fps(results: list[dict]) -> float:
    """Results per second from the first capture to the last result."""
    t_first = min(r["t"] for r in results)
    t_last = max(r["t"] + r["e2e_ms"] / 1e3 for r in results)
    return len(results) / (t_last - t_first)


def measure(n_bulk: int, n_single: int, rounds: int = 3, budget_s: float = 0.3,
            idle_s: float = 0.0, integrations: str = "off") -> Figures:
    """The whole bench: `rounds` blocks of `n_bulk` frames back to back and `rounds` blocks
    of `n_single` frames one at a time, each block served by the daemon and then run by the
    hand loop on the same files. `budget_s`: the profiler's time per variant (the first
    start's profiling and refinement; shorter for CI); `idle_s`: how long the warm daemon's
    idle cost is measured before the first frame (0: not); `integrations`: "on" runs the
    daemon with [sparkplug] and [opcua] on, "sparkplug" or "opcua" one of them (INTEGRATIONS)."""
    fig = Figures()
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        folder = work / "frames"
        folder.mkdir()
        pool = [s.image for s in samples(seed=11, count=200)]
        blocks = []
        i = 0
        for size in [WARMUP] + [n_bulk] * rounds + [n_single] * rounds:
            block = []
            for _ in range(size):
                p = work / f"f{i:05d}.png"
                cv2.imwrite(str(p), pool[i % len(pool)])
                block.append(p)
                i += 1
            blocks.append(block)
        broker = Mosquitto(work, auth=False).start()
        cfg = work / "edgerun.toml"
        cfg.write_text(config_text(work, bundled(), folder, broker.port, budget_s,
                                   INTEGRATIONS[integrations]))
        serve = hand = None
        try:
            # First start fills the profile cache (its background refinement included, so
            # the timed start serves from a full cache); the second is the warm one.
            proc, fig.ready_cold = start_serve(cfg, work, str(work / "notify-cold"))
            wait_refined(work / "daemon.log")
            fig.cold_peak = rss_mb(proc.pid, "VmHWM")
            proc.terminate()
            proc.wait(30)
            serve = Serve(cfg, work, folder, idle_s)
            fig.ready_warm, fig.idle_rss = serve.ready_s, serve.idle_rss
            fig.warm_peak = rss_mb(serve.proc.pid, "VmHWM")
            fig.idle_cpu_pct, fig.idle_wakeups_hz = serve.idle_cpu_pct, serve.idle_wakeups_hz
            # warm-up, not timed: the first frames choose the preprocessing path (CPU or
            # OpenCL, measured on them) and fill caches, as the hand loop's warm-up does
            warm = serve.run(blocks.pop(0), False)
            fig.variant = warm[0]["variant"]
            hand = HandLoop(fig.variant, cfg)
            hand.run(warm_files(warm, folder))
            for k, block in enumerate(blocks):
                fig.load.append(os.getloadavg()[0])
                paced = k >= rounds
                if paced and not block:
                    continue
                results = serve.run(block, paced)
                moved = [folder / p.name for p in block]
                if not paced:
                    fig.throughput.append((hand.run(moved)[0], serve_fps(results)))
                    fig.cpu_ms.append((hand.cpu / len(block) * 1e3,
                                       serve.cpu / len(block) * 1e3))
                    continue
                gaps = np.diff(sorted(r["t"] for r in results))
                fig.gap_ms = float(np.median(gaps)) * 1e3
                _, lat = hand.run(moved, fig.gap_ms / 1e3)
                fig.p95.append((float(np.percentile(lat, 95)),
                                float(np.percentile([x["e2e_ms"] for x in results], 95))))
            fig.peak_rss = serve.peak_rss
        finally:
            if hand is not None:
                hand.close()
            if serve is not None:
                serve.stop()
            broker.stop()
    return fig


def warm_files(results: list[dict], folder: Path) -> list[Path]:
    """The files of the warm-up round, from its results' refs."""
    return [folder / r["ref"] for r in results]


def spread(xs: list[float]) -> str:
    """median (min-max) of a list of figures."""
    if not xs:
        return "n/a"
    return f"{float(np.median(xs)):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def report(f: Figures, a: argparse.Namespace, title: str) -> None:
    """Print one measurement's figures, per round and as median (spread)."""
    print(f"{title}: variant {f.variant}; {a.rounds} rounds of {a.n // a.rounds} frames back "
          f"to back, then {a.rounds} of {a.single // a.rounds} one at a time (latency without "
          f"queueing); load average {spread(f.load)} (1 min, before each round, 2 cores)")
    for (h, s), ratio in zip(f.throughput, f.fps_ratios, strict=True):
        print(f"  throughput round: hand-written {h:6.0f}/s, edgerun serve {s:6.0f}/s "
              f"-> {ratio:.2f}x")
    for (h, s), ratio in zip(f.cpu_ms, f.cpu_ratios, strict=True):
        print(f"  CPU per frame   : hand-written {h:6.3f} ms, edgerun serve {s:6.3f} ms "
              f"-> {ratio:.2f}x")
    for (h, s), ratio in zip(f.p95, f.p95_ratios, strict=True):
        print(f"  p95 round       : hand-written {h:6.2f} ms, edgerun serve {s:6.2f} ms "
              f"-> {ratio:.2f}x")
    print(f"throughput : edgerun serve / hand-written {spread(f.fps_ratios)}x (target >= 1.0)")
    print(f"CPU/frame  : edgerun serve / hand-written {spread(f.cpu_ratios)}x (the daemon also "
          "persists and publishes every result)")
    print(f"latency p95: edgerun serve / hand-written {spread(f.p95_ratios)}x (target <= 1.10);"
          f" decode to result, frames {f.gap_ms:.0f} ms apart on both sides")
    print(f"daemon RSS : {f.idle_rss:.0f} MB idle (target <= 130), {f.peak_rss:.0f} MB peak; "
          f"start peak (VmHWM) {f.cold_peak:.0f} MB cold (profiled and refined), "
          f"{f.warm_peak:.0f} MB warm")
    print(f"idle daemon: {f.idle_cpu_pct:.2f} % of a core, main thread {f.idle_wakeups_hz:.1f} "
          f"wake-ups/s ({a.idle_s:g} s, quiet folder, connected to the broker)")
    print(f"to READY   : {f.ready_warm:.2f} s warm profile cache (target <= 3), "
          f"{f.ready_cold:.2f} s cold")


def main() -> None:
    """Run the bench and print the ratios, per round and as median (spread); with
    `--integrations both`, the plain daemon and the one with [sparkplug] and [opcua] one
    after the other in this run, and their ratios side by side."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000, help="frames back to back, all rounds")
    ap.add_argument("--single", type=int, default=300, help="frames one at a time, all rounds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=20.0, help="idle cost measured this long")
    ap.add_argument("--integrations", choices=("off", "on", "both", "sparkplug", "opcua"),
                    default="off", help="the daemon with [sparkplug] and [opcua] on; both: "
                    "off, then on; sparkplug or opcua: that one alone")
    ap.add_argument("--on-first", action="store_true",
                    help="with --integrations both: on, then off (alternate runs' order)")
    a = ap.parse_args()
    modes = {"both": ("on", "off") if a.on_first else ("off", "on")}.get(
        a.integrations, (a.integrations,))
    titles = {"off": "plain (no integrations)", "on": "with [sparkplug] and [opcua]",
              "sparkplug": "with [sparkplug]", "opcua": "with [opcua]"}
    figs = {}
    for mode in modes:
        f = figs[mode] = measure(a.n // a.rounds, a.single // a.rounds, a.rounds,
                                 idle_s=a.idle_s, integrations=mode)
        report(f, a, titles[mode])
    if len(figs) == 2:
        off, on = figs["off"], figs["on"]
        print("\nside by side, median of rounds: plain -> with [sparkplug] and [opcua]")
        for name, x, y in (("throughput ratio", off.fps_ratios, on.fps_ratios),
                           ("CPU/frame ratio ", off.cpu_ratios, on.cpu_ratios),
                           ("p95 ratio       ", off.p95_ratios, on.p95_ratios)):
            print(f"  {name}: {spread(x)}x -> {spread(y)}x")
        print(f"  idle RSS        : {off.idle_rss:.0f} -> {on.idle_rss:.0f} MB; idle CPU "
              f"{off.idle_cpu_pct:.2f} -> {on.idle_cpu_pct:.2f} % of a core")


if __name__ == "__main__":
    main()
