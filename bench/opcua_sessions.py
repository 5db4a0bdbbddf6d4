"""The daemon's frame rate with 50 OPC UA sessions held against none, side by side in one run.

One warm `edgerun serve` with [opcua] on loopback (bench/overhead.py's setup: a folder source,
the bundled model, every result persisted and published to a local Mosquitto) serves
`--rounds` pairs of blocks of frames back to back; one block of each pair with no OPC UA
client, the other with `--sessions` asyncua clients connected and holding their sessions
(asyncua's client keep-alive reads the server's state: what a held session costs), the order
alternating per pair so both see the same moment of a shared machine's load. The clients run
in a child process, started and connected before their block and closed after it; they read
`Device.Sessions` until the server counts them all. Printed per round and as median (spread):
frames/s (first capture to last result, as overhead.py) and the daemon's CPU per frame (its
whole process; the clients' CPU is not in it, but on a 2-core machine they compete with it
for the cores, which the frames/s figure includes).

Usage: python bench/opcua_sessions.py [--n 3000] [--rounds 3] [--sessions 50]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import WARMUP, Serve, config_text, serve_fps, spread, start_serve, wait_refined

from models import bundled
from models.synthetic import samples
from runtime.wire.broker import Mosquitto, free_port

NAMESPACE = "urn:edgerun:plc"  # runtime/telemetry/opcua_server.py


async def hold(url: str, n: int) -> None:
    """Connect `n` clients, wait until the server counts them, say "held", and hold the
    sessions until stdin closes."""
    import logging

    from asyncua import Client, ua

    logging.getLogger("asyncua").setLevel(logging.ERROR)  # each client says the server's cap
    clients = [Client(url, timeout=30) for _ in range(n)]
    for c in clients:
        await c.connect()
    idx = await clients[0].get_namespace_index(NAMESPACE)
    sessions = clients[0].get_node(ua.NodeId("Device.Sessions", idx))
    deadline = time.monotonic() + 30
    while (seen := await sessions.read_value()) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"the server counts {seen} sessions of {n}")
        await asyncio.sleep(0.2)
    print(f"held {seen}", flush=True)
    await asyncio.to_thread(sys.stdin.read)
    for c in clients:
        await c.disconnect()


class Holder:
    """The child process holding the sessions."""

    def __init__(self, url: str, n: int):
        self.proc = subprocess.Popen([sys.executable, __file__, "--hold", url, str(n)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line.startswith("held"):
            self.close()
            raise RuntimeError(f"the OPC UA clients did not connect: {line!r}")
        self.held = int(line.split()[1])

    def close(self) -> None:
        """Close the sessions and wait for the child."""
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(60)


def measure(n_block: int, rounds: int, sessions: int, budget_s: float = 0.3
            ) -> dict[int, list[tuple[float, float]]]:
    """{sessions held: [(frames/s, CPU ms per frame) per round]} for 0 and `sessions`."""
    out: dict[int, list[tuple[float, float]]] = {0: [], sessions: []}
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        folder = work / "frames"
        folder.mkdir()
        pool = [s.image for s in samples(seed=11, count=200)]
        blocks, i = [], 0
        for size in [WARMUP] + [n_block] * (2 * rounds):
            block = []
            for _ in range(size):
                p = work / f"f{i:05d}.png"
                cv2.imwrite(str(p), pool[i % len(pool)])
                block.append(p)
                i += 1
            blocks.append(block)
        port = free_port()
        broker = Mosquitto(work, auth=False).start()
        cfg = work / "edgerun.toml"
        cfg.write_text(config_text(work, bundled(), folder, broker.port, budget_s,
                                   f"[opcua]\nenabled = true\nport = {port}\n"
                                   f"max_sessions = {max(50, sessions)}\n"))
        serve = None
        try:
            proc, _ = start_serve(cfg, work, str(work / "notify-cold"))
            wait_refined(work / "daemon.log")
            proc.terminate()
            proc.wait(30)
            serve = Serve(cfg, work, folder)
            serve.run(blocks.pop(0), False)
            for k in range(rounds):
                order = (0, sessions) if k % 2 == 0 else (sessions, 0)
                for held in order:
                    holder = Holder(f"opc.tcp://127.0.0.1:{port}/", held) if held else None
                    try:
                        block = blocks.pop(0)
                        results = serve.run(block, False)
                        out[held].append((serve_fps(results), serve.cpu / len(block) * 1e3))
                    finally:
                        if holder is not None:
                            holder.close()
        finally:
            if serve is not None:
                serve.stop()
            broker.stop()
    return out


def main() -> None:
    """Run the bench and print the figures side by side."""
    if len(sys.argv) == 4 and sys.argv[1] == "--hold":
        asyncio.run(hold(sys.argv[2], int(sys.argv[3])))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=3000, help="frames per side, all rounds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sessions", type=int, default=50)
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    f = measure(a.n // a.rounds, a.rounds, a.sessions)
    none, held = f[0], f[a.sessions]
    print(f"edgerun serve with [opcua], {a.rounds} rounds of {a.n // a.rounds} frames back to "
          f"back per side; load average {load0:.2f} -> {os.getloadavg()[0]:.2f} (2 cores)")
    for k, ((f0, c0), (f1, c1)) in enumerate(zip(none, held, strict=True)):
        print(f"  round {k}: no session {f0:6.0f}/s {c0:.3f} ms CPU/frame; {a.sessions} "
              f"sessions {f1:6.0f}/s {c1:.3f} ms CPU/frame -> {f1 / f0:.2f}x frames/s, "
              f"{c1 / c0:.2f}x CPU")
    print(f"frames/s  : {a.sessions} sessions / none "
          f"{spread([h[0] / n[0] for n, h in zip(none, held, strict=True)])}x (target 1.0)")
    print(f"CPU/frame : {a.sessions} sessions / none "
          f"{spread([h[1] / n[1] for n, h in zip(none, held, strict=True)])}x")
    print(f"frames/s  : none {spread([n[0] for n in none])}, {a.sessions} sessions "
          f"{spread([h[0] for h in held])}")


if __name__ == "__main__":
    main()
