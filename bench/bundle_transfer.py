"""Bundle transfer throughput: HTTP (the coordinator's API, Range-resumable) vs MQTT chunks
through Mosquitto (runtime/ota/bundle_mqtt.py), in one run on this machine.

    python bench/bundle_transfer.py [--repeats 3] [--big-mb 32] [--nodelay]

One Mosquitto (authentication and the fleet ACL on), one coordinator (API and chunk server),
the device side in this process (the download code the daemon runs). Bundles: the bundled
inspection model (every variant, as `edgerun models bundle` makes it) and a synthetic bundle of
--big-mb MB (steady-state throughput). Each transfer starts from nothing and ends with the
whole file's sha256 checked; the median of --repeats is printed, with the MQTT chunk size and
window.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from models import bundled
from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.api import serve
from runtime.coordinator.service import Coordinator
from runtime.ota.bundle import HEADER, make
from runtime.ota.bundle_mqtt import fetch_over_mqtt
from runtime.ota.download import fetch
from runtime.wire.broker import Mosquitto
from runtime.wire.commands import generate_keypair, load_private_key

FLEET = "bench"


def synthetic(path: Path, mb: float) -> Path:
    """A file the shelf takes for a bundle (its header first), of about `mb` MB."""
    body = (bytes(range(256)) * 4096) * max(1, int(mb))  # 1 MiB blocks
    with tarfile.open(path, "w") as tar:
        for name, data in ((HEADER, json.dumps({"name": "big", "version": "1"}).encode()),
                           ("pad.bin", body)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--big-mb", type=float, default=32)
    ap.add_argument("--nodelay", action="store_true",
                    help="`set_tcp_nodelay true` in mosquitto.conf (Nagle off on its sockets)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        (tmp / "broker").mkdir()
        broker = Mosquitto(tmp / "broker", nodelay=args.nodelay).start()
        coord = Coordinator(CoordinatorConfig(fleet=FLEET, broker=broker.coordinator(FLEET),
                                              store=str(tmp / "coord" / "c.db")))
        coord.start()
        api = serve(coord, "127.0.0.1", 0, token="b" * 32)
        device = broker.device(FLEET, "box1")
        try:
            assert coord.connected.wait(10)
            generate_keypair(tmp / "p.pem", tmp / "p.pub")
            model = make(bundled(), load_private_key(tmp / "p.pem"), tmp / "model.edgerun", "1")
            bundles = [(f"bundled model ({model.name}, every variant)", tmp / "model.edgerun"),
                       (f"synthetic {args.big_mb:g} MB", synthetic(tmp / "big.edgerun",
                                                                   args.big_mb))]
            # the default (128 KiB x 8) first, then other chunk sizes and windows
            routes = [("HTTP", 0, 0), ("MQTT", 128, 8), ("MQTT", 64, 8), ("MQTT", 256, 8),
                      ("MQTT", 128, 1), ("MQTT", 128, 4), ("MQTT", 128, 16)]
            print(f"bundle transfer: Mosquitto on 127.0.0.1 (auth + ACL"
                  f"{', set_tcp_nodelay true' if args.nodelay else ''}), coordinator API "
                  f"on 127.0.0.1, median of {args.repeats}")
            print(f"{'bundle':40} {'bytes':>10}  {'route':18} {'seconds':>8} {'MB/s':>8}")
            for label, path in bundles:
                with path.open("rb") as f:
                    held = coord.shelf.receive(f, path.stat().st_size)
                dargs = coord.deploy_args(held.id)
                for route, kb, window in routes:
                    times = []
                    for i in range(args.repeats):
                        dest = tmp / "dl" / f"{route}-{kb}-{window}-{i}.edgerun"
                        t0 = time.perf_counter()
                        if route == "HTTP":
                            fetch(dargs["url"], dest, held.size, held.token, sha256=held.sha256)
                        else:
                            fetch_over_mqtt(dest, device, FLEET, "box1", held.id, held.size,
                                            held.sha256, held.token, 1 << 40, 0,
                                            chunk=kb * 1024, window=window, timeout_s=10)
                        times.append(time.perf_counter() - t0)
                        dest.unlink()
                    s = statistics.median(times)
                    how = "HTTP (Range API)" if route == "HTTP" else \
                        f"MQTT {kb} KiB x {window}"
                    print(f"{label:40} {held.size:>10}  {how:18} {s:>8.3f} "
                          f"{held.size / s / 1e6:>8.2f}")
        finally:
            api.shutdown()
            coord.stop()
            broker.stop()


if __name__ == "__main__":
    main()
