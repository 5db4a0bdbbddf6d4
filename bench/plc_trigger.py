"""PLC-triggered inspection: trigger to verdict through OPC UA and Modbus TCP, side by side
with the daemon's own MQTT trigger.

Each run starts `edgerun serve` twice (a child process, the bundled model `models/inspection`,
ONNX Runtime, a fake sysfs at 40 °C; the profile cache is shared between runs) with [opcua]
enabled on loopback:
- `opcua`: `[source] kind = "synthetic"`, `trigger = "opcua"`. A real asyncua client acting as
  the PLC calls `main/Trigger()` `--parts` times at `--rate` parts a second; the part's
  FrameId comes back from the call.
- `mqtt`: `[source] kind = "trigger"` on a real Mosquitto; the same PLC client publishes each
  part's PNG (a rendered part, as a PLC bridge to a camera would) at the same rate; its frames
  are `trigger-<n>`.
- `modbus`: `[source] trigger = "modbus"`, [modbus] enabled on loopback too. A pymodbus
  client acting as the PLC writes the part's number into PartSeq (holding register 0) and
  polls registers 0..9 every `--modbus-poll-ms` (2) until VerdictSeq (register 1) echoes it,
  as a PLC's scan would; its frames are `plc-<n>`, n the part's number.
- `pylon` (when pypylon is installed: `pip install 'edgerun[camera]'`): as `modbus`, the
  camera a Basler one through pypylon, here pylon's emulator (PYLON_CAMEMU=1) playing rendered
  parts, its software trigger fired on each edge (`[source] kind = "pylon"`); and
  `pylon-cam`, the same emulated camera alone in this process (trigger to frame, no daemon),
  at the same rate: the camera's own share of the `pylon` figure.
In the first two the verdict is read the same way, a PLC's way: a subscription (10 ms
publishing interval, a queue per item so no change is coalesced away) on
`main/LastResult/FrameId`. Trigger to verdict is from just before the call (the publish, the
register write) to the notification of its FrameId (the poll that saw its VerdictSeq).
Lost: a part whose verdict never came (5 s after the last; Modbus: 5 s after its write);
duplicated: a FrameId notified twice, a ref stored twice in the outbox (the durable record,
checked for all three), or (Modbus) a Results register past the parts written.

`--warmup N` triggers N parts (20/s) before the measured ones and waits for their verdicts:
a daemon on a line has run before the parts that count; `--opcua-health-s` sets the
server's health refresh; each run prints its three slowest parts (their number and ms), so
a tail made of the first parts shows as such.

Usage: python bench/plc_trigger.py [--runs 3] [--parts 100] [--rate 5] [--warmup 0]
       [--only opcua|modbus|mqtt|pylon]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.daemon_harness import Serve, results, write_config  # noqa: E402

from runtime.wire.broker import Mosquitto, free_port  # noqa: E402

TOPIC = "line1/camera/trigger"


def start(tmp: Path, cache: Path, source: str, port: int, extra: str = "",
          env: dict[str, str] | None = None) -> Serve:
    """`edgerun serve` with [opcua] on `port`; returns once it is ready."""
    cfg = write_config(tmp, cache, source=source,
                       extra=f"[opcua]\nenabled = true\nport = {port}\n{extra}")
    d = Serve(tmp, cfg, env=env)
    deadline = time.monotonic() + 300
    while not d.ready():
        if d.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"serve did not start:\n{d.text()[-3000:]}")
        time.sleep(0.1)
    return d


async def drive(port: int, parts: int, rate: float, fire, warmup: int = 0
                ) -> tuple[dict, dict, list[str]]:
    """Fire `warmup` triggers at 20/s (not measured; their verdicts awaited), then `parts`
    at `rate`/s, through `fire(client, idx, i)` (returns the FrameId to expect); collect the
    verdicts. Returns (sent ref -> time, seen ref -> times, the measured refs in order)."""
    from asyncua import Client, ua

    sent: dict[str, float] = {}
    seen: dict[str, list[float]] = collections.defaultdict(list)
    order: list[str] = []
    async with Client(f"opc.tcp://127.0.0.1:{port}/", timeout=10) as c:
        idx = await c.get_namespace_index("urn:edgerun:plc")

        class Handler:
            def datachange_notification(self, node, val, data):
                if val:
                    seen[val].append(time.perf_counter())

        sub = await c.create_subscription(10, Handler())
        await sub.subscribe_data_change(c.get_node(ua.NodeId("main.LastResult.FrameId", idx)),
                                        queuesize=1000)
        await asyncio.sleep(0.5)
        warm = []
        for i in range(warmup):
            await asyncio.sleep(0.05)
            warm.append(await fire(c, idx, i))
        deadline = time.perf_counter() + 30
        while warm and time.perf_counter() < deadline and not all(r in seen for r in warm):
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0 if warm else 0.0)
        t0 = time.perf_counter()
        for i in range(parts):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            t = time.perf_counter()
            ref = await fire(c, idx, warmup + i)
            sent[ref] = t
            order.append(ref)
        deadline = time.perf_counter() + 5
        while time.perf_counter() < deadline and not all(r in seen for r in sent):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # a late duplicate would show now
        await sub.delete()
    return sent, dict(seen), order


async def drive_modbus(port: int, parts: int, rate: float, warmup: int = 0, poll_s: float = 0.002
                       ) -> tuple[dict, dict, list[str], int]:
    """As `drive`, the PLC on Modbus: part n's number written into PartSeq, registers 0..9
    polled until VerdictSeq is n (one part at a time: the next is written at its time or
    once this one's verdict came or timed out). Returns also the Results register at the end."""
    from pymodbus.client import AsyncModbusTcpClient

    sent: dict[str, float] = {}
    seen: dict[str, list[float]] = collections.defaultdict(list)
    order: list[str] = []
    c = AsyncModbusTcpClient("127.0.0.1", port=port, timeout=5, retries=0)
    if not await c.connect():
        raise RuntimeError(f"no Modbus server on port {port}")

    async def part(n: int, timeout_s: float) -> float | None:
        t = time.perf_counter()
        r = await c.write_register(0, n & 0xFFFF, device_id=1)
        if r.isError():
            raise RuntimeError(f"part {n}: the write was refused: {r}")
        while time.perf_counter() - t < timeout_s:
            regs = (await c.read_holding_registers(0, count=10, device_id=1)).registers
            if regs[1] == n & 0xFFFF:
                return time.perf_counter()
            await asyncio.sleep(poll_s)
        return None

    try:
        for i in range(warmup):
            await asyncio.sleep(0.05)
            await part(i + 1, 30)
        await asyncio.sleep(1.0 if warmup else 0.0)
        t0 = time.perf_counter()
        for i in range(parts):
            await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            n = warmup + i + 1
            ref = f"plc-{n}"
            sent[ref] = time.perf_counter()
            order.append(ref)
            if (at := await part(n, 5)) is not None:
                seen[ref].append(at)
        results_reg = (await c.read_holding_registers(8, count=1, device_id=1)).registers[0]
    finally:
        c.close()
    return sent, dict(seen), order, (results_reg - warmup) & 0xFFFF


PFS = "# {05D8C294-F295-4dfb-9D01-096BD04049F4}\n"  # a GenApi feature file's first line


def emulated_camera(tmp: Path) -> str:
    """The `[source]` of a pylon camera: the emulator playing 16 rendered parts in turn,
    exposure 100 us, ready for its next trigger within 1 ms (1000 frames/s)."""
    import cv2

    from models.synthetic import samples

    folder = tmp / "parts"
    folder.mkdir(exist_ok=True)
    for i, s in enumerate(samples(seed=3, count=16)):
        cv2.imwrite(str(folder / f"part-{i:04d}.png"), s.image)
    pfs = tmp / "camera.pfs"
    pfs.write_text(PFS + f"TestImageSelector\tOff\nImageFilename\t{folder}\n"
                   "ImageFileMode\tOn\nAcquisitionFrameRate\t1000.00\n")
    return (f'kind = "pylon"\npixel_format = "BGR8Packed"\nexposure_us = 100\n'
            f'features_file = "{pfs}"')


def camera_alone(tmp: Path, parts: int, rate: float) -> dict:
    """The emulated camera without the daemon: trigger to frame in this process."""
    import os
    import tomllib

    from runtime.config.source import SourceConfig
    from runtime.frames.sources import PylonSource

    os.environ["PYLON_CAMEMU"] = "1"
    cfg = SourceConfig(**tomllib.loads(emulated_camera(tmp)))
    cam = PylonSource(cfg, triggered=True)
    ms: list[float] = []
    try:
        t0 = time.perf_counter()
        for i in range(parts):
            time.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
            t = time.perf_counter()
            if cam.read(5) is not None:
                ms.append((time.perf_counter() - t) * 1e3)
    finally:
        cam.close()
    order = sorted((x, k) for k, x in enumerate(ms))
    return {"slowest": order[-3:][::-1], "p50": float(np.percentile(ms, 50)),
            "p99": float(np.percentile(ms, 99)), "lost": parts - len(ms), "duplicated": 0,
            "stored": len(ms), "parts": parts}


def measure(kind: str, tmp: Path, cache: Path, parts: int, rate: float, warmup: int = 0,
            opcua_health_s: float = 1.0, poll_s: float = 0.002) -> dict:
    if kind == "pylon-cam":
        return camera_alone(tmp, parts, rate)
    port = free_port()
    broker = None
    extra = f"health_interval_s = {opcua_health_s}\n"
    over = 0  # verdicts past the parts written (Modbus's Results register)
    if kind in ("modbus", "pylon"):
        mport = free_port()
        camera = (f"{emulated_camera(tmp)}\ntrigger = \"modbus\"" if kind == "pylon"
                  else 'kind = "synthetic"\ntrigger = "modbus"')
        d = start(tmp, cache, camera, port, f"{extra}[modbus]\nenabled = true\nport = {mport}\n",
                  env={"PYLON_CAMEMU": "1"} if kind == "pylon" else None)
        try:
            sent, seen, order, verdicts = asyncio.run(
                drive_modbus(mport, parts, rate, warmup, poll_s))
            over = max(0, verdicts - parts)
        finally:
            d.stop()
    elif kind == "opcua":
        d = start(tmp, cache, 'kind = "synthetic"\ntrigger = "opcua"', port, extra)

        async def fire(c, idx, i):
            from asyncua import ua

            return await c.get_node(ua.NodeId("main", idx)).call_method(
                ua.NodeId("main.Trigger", idx))
    else:
        import cv2
        import paho.mqtt.client as mqtt

        from models.synthetic import samples

        broker = Mosquitto(tmp, auth=False).start()
        d = start(tmp, cache, f'kind = "trigger"\ntopic = "{TOPIC}"', port,
                  f'{extra}[telemetry.broker]\nhost = "127.0.0.1"\nport = {broker.port}\n')
        pngs = [cv2.imencode(".png", s.image)[1].tobytes()
                for s in samples(seed=3, count=16)]
        pub = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2)
        pub.connect("127.0.0.1", broker.port)
        pub.loop_start()
        time.sleep(1.0)  # the daemon's trigger subscription is in place

        async def fire(c, idx, i):
            pub.publish(TOPIC, pngs[i % len(pngs)], qos=1)
            return f"trigger-{i + 1}"
    if kind not in ("modbus", "pylon"):
        try:
            sent, seen, order = asyncio.run(drive(port, parts, rate, fire, warmup))
        finally:
            d.stop()
            if broker is not None:
                pub.loop_stop()
                broker.stop()
    stored = collections.Counter(r["ref"] for r in results(tmp / "state" / "outbox.db"))
    ms = [(seen[r][0] - t) * 1e3 for r, t in sent.items() if r in seen]
    by_part = sorted(((seen[r][0] - sent[r]) * 1e3, k) for k, r in enumerate(order)
                     if r in seen)
    return {"slowest": by_part[-3:][::-1],
            "p50": float(np.percentile(ms, 50)) if ms else None,
            "p99": float(np.percentile(ms, 99)) if ms else None,
            "lost": sum(1 for r in sent if r not in seen),
            "duplicated": sum(1 for r in sent if len(seen.get(r, ())) > 1)
            + sum(1 for r in sent if stored[r] > 1) + over,
            "stored": sum(1 for r in sent if stored[r] >= 1), "parts": len(sent)}


def spread(xs: list[float]) -> str:
    return (f"{statistics.median(xs):7.2f} [{min(xs):.2f}..{max(xs):.2f}]"
            if xs else "    n/a")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--parts", type=int, default=100)
    ap.add_argument("--rate", type=float, default=5.0)
    ap.add_argument("--warmup", type=int, default=0,
                    help="parts triggered (20/s) and awaited before the measured ones")
    ap.add_argument("--opcua-health-s", type=float, default=1.0,
                    help="[opcua] health_interval_s (the server's health refresh)")
    ap.add_argument("--modbus-poll-ms", type=float, default=2.0,
                    help="the Modbus PLC's poll of VerdictSeq (its scan)")
    ap.add_argument("--only", default="",
                    help="these triggers only, comma-separated (opcua, modbus, mqtt, pylon, "
                         "pylon-cam)")
    a = ap.parse_args()
    import logging

    logging.getLogger("asyncua").setLevel(logging.ERROR)  # the client's revised-value notes
    try:
        import pypylon  # noqa: F401
        cams: tuple[str, ...] = ("pylon", "pylon-cam")
    except ImportError:
        print("pypylon is not installed (pip install 'edgerun[camera]'): no pylon rows")
        cams = ()
    out: dict[str, list[dict]] = {k: [] for k in ("opcua", "modbus", "mqtt", *cams)}
    with tempfile.TemporaryDirectory(prefix="plc-bench-") as td:
        cache = Path(td) / "profiles"
        for run in range(a.runs):
            kinds = (("opcua", "modbus", "mqtt", *cams) if run % 2 == 0
                     else (*cams[::-1], "mqtt", "modbus", "opcua"))
            for kind in [k for k in kinds if k in a.only.split(",")] if a.only else kinds:
                tmp = Path(td) / f"{kind}-{run}"
                tmp.mkdir()
                r = measure(kind, tmp, cache, a.parts, a.rate, a.warmup, a.opcua_health_s,
                            a.modbus_poll_ms / 1e3)
                out[kind].append(r)
                slow = ", ".join(f"#{k + 1} {ms:.0f}" for ms, k in r["slowest"])
                print(f"run {run + 1} {kind:9s}: p50 {r['p50']:.2f} ms  p99 {r['p99']:.2f} ms"
                      f"  lost {r['lost']}  duplicated {r['duplicated']}  stored "
                      f"{r['stored']}/{r['parts']}  slowest parts (ms): {slow}", flush=True)
    print(f"\n{a.parts} parts at {a.rate:g}/s after {a.warmup} warm-up parts, [opcua] "
          f"health_interval_s {a.opcua_health_s:g}, Modbus poll {a.modbus_poll_ms:g} ms, "
          f"{a.runs} runs: median [min..max] of the runs")
    print(f"{'trigger':9s} {'p50 ms':>22s} {'p99 ms':>22s}  lost  duplicated")
    for kind, rs in out.items():
        print(f"{kind:9s} {spread([r['p50'] for r in rs if r['p50'] is not None]):>22s} "
              f"{spread([r['p99'] for r in rs if r['p99'] is not None]):>22s}  "
              f"{sum(r['lost'] for r in rs):4d}  {sum(r['duplicated'] for r in rs):10d}")
    if cams and out["modbus"] and out["pylon"]:  # the same trigger path, another camera
        ratio = [x["p99"] / y["p99"] for x, y in zip(out["pylon"], out["modbus"], strict=False)
                 if x["p99"] and y["p99"]]
        print(f"p99 pylon/modbus (synthetic camera) per run: "
              f"{', '.join(f'{x:.2f}' for x in ratio)}")
    m = out["mqtt"]
    for kind in ("opcua", "modbus", *cams[:1]):
        o = out[kind]
        ratio = [x["p99"] / y["p99"] for x, y in zip(o, m, strict=False)
                 if x["p99"] and y["p99"]]
        if ratio:
            print(f"p99 {kind}/mqtt per run: {', '.join(f'{x:.2f}' for x in ratio)}")
        if o:
            ok = all(r["p99"] is not None and r["p99"] <= 50 and not r["lost"]
                     and not r["duplicated"] for r in o)
            print(f"target ({kind} p99 <= 50 ms, 0 lost, 0 duplicated): "
                  f"{'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
