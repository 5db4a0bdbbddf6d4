"""A device as a real process for the telemetry tests: outbox + publisher, no inference.

Appends results until the outbox's seq reaches --total (continuing after a restart), printing
`seq N` after each append has returned (so the test knows it was durable), and `cmd NAME` for
each verified command it receives. SIGTERM stops it cleanly (offline state, then disconnect).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from runtime.config.telemetry import BrokerConfig, OutboxConfig, TelemetryConfig
from runtime.telemetry.outbox import Outbox
from runtime.telemetry.publisher import Publisher


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--outbox", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--device", default="dev1")
    ap.add_argument("--total", type=int, default=100)
    ap.add_argument("--rate", type=float, default=0.0, help="results/s; 0 = as fast as possible")
    ap.add_argument("--keepalive", type=int, default=30)
    ap.add_argument("--ack-timeout", type=float, default=1.0)
    ap.add_argument("--trusted-key", action="append", default=[])
    ap.add_argument("--username", default="")
    ap.add_argument("--password-file", default="")
    ap.add_argument("--stats", default="", help="write publisher stats + live threads here")
    a = ap.parse_args()

    cfg = TelemetryConfig(fleet="test", device=a.device,
                          broker=BrokerConfig(host="127.0.0.1", port=a.port,
                                              keepalive_s=a.keepalive, username=a.username,
                                              password_file=a.password_file),
                          outbox=OutboxConfig(path=a.outbox), ack_timeout_s=a.ack_timeout,
                          batch_max=20, inflight=100, trusted_keys=tuple(a.trusted_key))
    outbox = Outbox(cfg.outbox)
    pub = Publisher(cfg, outbox, birth=lambda: {"versions": {"edgerun": "test"}})
    pub.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def commands() -> None:
        while not stop.is_set():
            try:
                cmd = pub.commands.get(timeout=0.1)
            except Exception:
                continue
            print(f"cmd {cmd.name}", flush=True)

    threading.Thread(target=commands, daemon=True).start()

    def stats() -> None:  # what the fuzz test reads: counters and which threads are alive
        while not stop.is_set():
            tmp = Path(a.stats + ".tmp")
            tmp.write_text(json.dumps({"mqtt": pub.health(), "threads": sorted(
                t.name for t in threading.enumerate())}))
            tmp.replace(a.stats)
            stop.wait(0.25)

    if a.stats:
        threading.Thread(target=stats, name="stats", daemon=True).start()
    seq = outbox.last_seq()
    while not stop.is_set() and seq < a.total:
        seq = outbox.append({"t": time.time(), "label": "ok", "score": 0.5})
        if seq % 50 == 0:
            outbox.put("health", {"v": 1, "t": time.time(), "boot": outbox.boot})
        print(f"seq {seq}", flush=True)
        if a.rate:
            time.sleep(1 / a.rate)
    print("appended", flush=True)
    stop.wait()
    pub.stop()
    outbox.close()
    print("stopped", flush=True)


if __name__ == "__main__":
    main()
