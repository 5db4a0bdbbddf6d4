"""Operator request latency on the coordinator's API with and without a slowloris, side by side
in one run on this machine.

    python bench/slowloris.py [--requests 200] [--slow 300] [--repeats 3] [--timeout-s 10]

The API runs in a child process (`runtime.coordinator.api.serve` on a SQLite store, as
`edgerun coordinator` serves it, without a broker). This process is the operator (sequential
authorized GET /api/v1/stats from 127.0.0.1, a new connection each) and, in the attack phase,
the attacker: `--slow` sockets from ten other loopback addresses, each sending half a request
line and then a byte every second (so neither the idle cut nor a per-byte timeout frees them);
sockets the server cuts at its request deadline are opened again at once, so `--slow` are held
throughout. Each repeat measures the quiet phase then the attack phase; p50 and p99 over all
repeats are printed per phase, with the spread of the per-repeat p99s, the ratio, and how many
requests failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "b" * 32
SERVER = f"""
import sys, time
from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.api import serve
from runtime.coordinator.service import Coordinator
c = Coordinator(CoordinatorConfig(fleet="bench", store=sys.argv[1]))
s = serve(c, "127.0.0.1", 0, token="{TOKEN}", timeout_s=float(sys.argv[2]))
print(s.server_address[1], flush=True)
sys.stdin.read()
"""


def operator(port: int, n: int) -> tuple[list[float], int]:
    """`n` sequential authorized requests: latencies (s) of the answered ones, failures."""
    lat, failed = [], 0
    for _ in range(n):
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/stats",
                                     headers={"Authorization": f"Bearer {TOKEN}"})
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                json.loads(r.read())
            lat.append(time.perf_counter() - t0)
        except OSError:
            failed += 1
    return lat, failed


class Slowloris:
    """`count` slow sockets held open (re-opened when cut) until stop()."""

    def __init__(self, port: int, count: int):
        self.port, self.count = port, count
        self.sources = [f"127.0.0.{i}" for i in range(2, 12)]
        self.socks: list[socket.socket] = []
        self.reopened = 0
        self._stop = threading.Event()
        for i in range(count):
            self.socks.append(self._open(i))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _open(self, i: int) -> socket.socket:
        s = socket.socket()
        s.bind((self.sources[i % len(self.sources)], 0))
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", self.port))
            s.sendall(b"GET /api/v1/fl")
        except OSError:
            pass  # refused or cut: tried again at the next round
        return s

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for i, s in enumerate(self.socks):
                try:
                    s.sendall(b"e")
                except OSError:
                    s.close()
                    self.socks[i] = self._open(i)
                    self.reopened += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for s in self.socks:
            s.close()


def pct(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) of xs, nearest rank."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--slow", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--timeout-s", type=float, default=10.0, help="coordinator.http_timeout_s")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.Popen([sys.executable, "-c", SERVER, str(Path(tmp) / "c.db"),
                                 str(a.timeout_s)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env)
        try:
            port = int(proc.stdout.readline())  # type: ignore[union-attr]
            operator(port, 20)  # warm-up: imports, first queries
            phases: dict[str, list[list[float]]] = {"quiet": [], "slowloris": []}
            failed = {"quiet": 0, "slowloris": 0}
            reopened = 0
            for _ in range(a.repeats):
                lat, f = operator(port, a.requests)
                phases["quiet"].append(lat)
                failed["quiet"] += f
                attack = Slowloris(port, a.slow)
                time.sleep(1.0)  # the server has accepted them all
                lat, f = operator(port, a.requests)
                reopened += attack.reopened
                attack.stop()
                phases["slowloris"].append(lat)
                failed["slowloris"] += f
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # type: ignore[union-attr]
            proc.terminate()
            proc.wait(10)
    print(f"operator GET /api/v1/stats, {a.requests} requests x {a.repeats} repeats per phase; "
          f"slowloris: {a.slow} sockets from 10 addresses, a byte a second, "
          f"http_timeout_s {a.timeout_s:g}")
    print(f"{'phase':<10} {'p50 ms':>8} {'p99 ms':>8} {'p99 per repeat (ms)':>28} {'failed':>7}")
    p99 = {}
    for name, runs in phases.items():
        every = [x for r in runs for x in r]
        per = [pct(r, 0.99) * 1e3 for r in runs if r]
        p99[name] = pct(every, 0.99) * 1e3 if every else float("nan")
        print(f"{name:<10} {pct(every, 0.5) * 1e3 if every else float('nan'):>8.2f} "
              f"{p99[name]:>8.2f} {', '.join(f'{x:.2f}' for x in per):>28} "
              f"{failed[name]:>7}")
    print(f"p99 slowloris / quiet: {p99['slowloris'] / p99['quiet']:.2f}x; slow sockets "
          f"cut by the server and re-opened during the attack: {reopened}")
    return 0 if failed["slowloris"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
