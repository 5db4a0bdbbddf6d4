"""Sparkplug soak: `edgerun serve` with [sparkplug] and [opcua] for `--minutes`, a PLC
triggering parts all along, the broker restarted `--restarts` times; an independent host
checks every message (issue 35's target: 0 violations over 10 minutes with two restarts).

The daemon: the bundled model, a synthetic camera captured on the PLC's edges
(`trigger = "opcua"`), a real Mosquitto with auth and the fleet ACL, `primary_host_id` set.
The host (tests/support/sparkplug_host.py: the Tahu schema compiled by protoc in this
process, not the _pb2 edgerun encodes with) is the 3.0 primary host: on every connect it
subscribes, then says STATE online. It checks seq continuity (NBIRTH 0, +1 mod 256 on every
message but NDEATH), NDEATH's bdSeq = the NBIRTH's, no data before the births of its
connection, a datatype on every birth metric. The PLC (asyncua's client) calls
`main/Trigger()` at `--rate` parts a second, through the restarts (OPC UA does not need the
broker). The broker is down `--down-s` each time, at evenly spaced moments; halfway the host
sends one NCMD Node Control/Rebirth.

At the end: every part's result in the outbox (the durable record) is looked for in what the
host saw (`Last Result/Seq` of DBIRTH/DDATA); a part missing there is counted (Sparkplug is
QoS 0: a message in flight when the link drops is lost to SCADA by design, docs/sparkplug.md).

Usage: python bench/sparkplug_soak.py [--minutes 10] [--restarts 2] [--rate 5]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.daemon_harness import Serve, results_by_seq, write_broker_config  # noqa: E402
from support.sparkplug_host import PrimaryHost, value  # noqa: E402
from support.waiting import wait  # noqa: E402

from runtime.telemetry.sparkplug import sparkplug_b_pb2 as pb  # noqa: E402
from runtime.wire.broker import Mosquitto, free_port  # noqa: E402


def plc(port: int, rate: float, stop: threading.Event, refs: list[str],
        refused: list[int]) -> None:
    """As a PLC: Trigger() at `rate`/s until `stop`; the FrameIds returned go to `refs`."""
    from asyncua import Client, ua

    async def go() -> None:
        async with Client(f"opc.tcp://127.0.0.1:{port}/", timeout=10) as c:
            idx = await c.get_namespace_index("urn:edgerun:plc")
            main = c.get_node(ua.NodeId("main", idx))
            t0 = time.perf_counter()
            i = 0
            while not stop.is_set():
                await asyncio.sleep(max(0.0, t0 + i / rate - time.perf_counter()))
                i += 1
                try:
                    refs.append(await main.call_method(ua.NodeId("main.Trigger", idx)))
                except ua.UaStatusCodeError:
                    refused[0] += 1
    asyncio.run(go())


def rebirth() -> bytes:
    """NCMD Node Control/Rebirth = true, as a host sends it."""
    p = pb.Payload(timestamp=int(time.time() * 1000), seq=0)
    p.metrics.add(name="Node Control/Rebirth", datatype=11).boolean_value = True
    return p.SerializeToString()


def soak(work: Path, minutes: float, restarts: int, rate: float, down_s: float
         ) -> dict[str, int]:
    """Run it; print the figures and return them (violations, parts triggered, stored,
    triggered without a result, stored twice, not seen by SCADA; the daemon's exit code)."""
    broker = Mosquitto(work).start()
    port = free_port()
    cfg = write_broker_config(work, broker, work / "profiles",
                              source='kind = "synthetic"\ntrigger = "opcua"',
                              extra=f'[opcua]\nenabled = true\nport = {port}\n'
                                    '[sparkplug]\nenabled = true\nprimary_host_id = "scada"\n')
    scada = PrimaryHost(broker, "sys", "box1")
    h = scada.host
    d = Serve(work, cfg)
    refs: list[str] = []
    refused = [0]
    stop = threading.Event()
    rc = None
    try:
        wait(lambda: h.of("DBIRTH", "main"), 300, "the births", d)
        print(f"born; soaking {minutes:g} min at {rate:g} parts/s", flush=True)
        t_plc = threading.Thread(target=plc, args=(port, rate, stop, refs, refused))
        t_plc.start()
        t0 = time.monotonic()
        span = minutes * 60
        events = [(span * (k + 1) / (restarts + 1), "restart") for k in range(restarts)]
        events.append((span / 2 + 0.5, "rebirth"))
        for at, what in sorted(events):
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            if what == "restart":
                births = len(h.of("NBIRTH"))
                broker.stop()
                print(f"{time.monotonic() - t0:6.1f} s: broker down for {down_s:g} s "
                      f"({len(refs)} parts so far)", flush=True)
                time.sleep(down_s)
                broker.start()
                wait(lambda b=births: len(h.of("NBIRTH")) > b, 60, "births after the restart", d)
                print(f"{time.monotonic() - t0:6.1f} s: born again", flush=True)
            else:
                births = len(h.of("NBIRTH"))
                scada.c.publish("spBv1.0/sys/NCMD/box1", rebirth(), qos=1).wait_for_publish(10)
                wait(lambda b=births: len(h.of("NBIRTH")) > b, 30, "the rebirth", d)
                print(f"{time.monotonic() - t0:6.1f} s: rebirth on NCMD", flush=True)
        time.sleep(max(0.0, t0 + span - time.monotonic()))
        stop.set()
        t_plc.join(30)
        outbox = work / "state" / "outbox.db"
        wait(lambda: len(results_by_seq(outbox)) >= len(refs), 30, "every part's result", d)
        last = max(results_by_seq(outbox), default=0)
        if not h.by_seq("main") or max(h.by_seq("main")) < last:  # the last ones in flight
            time.sleep(2.0)
    finally:
        stop.set()
        rc = d.stop()
        try:
            wait(lambda: h.of("NDEATH") and value(h.of("NDEATH")[-1].metrics()["bdSeq"]) ==
                 value(h.of("NBIRTH")[-1].metrics()["bdSeq"]), 30, "the NDEATH at stop")
        finally:
            scada.close()
            broker.stop()

    stored = results_by_seq(work / "state" / "outbox.db")
    seen = h.by_seq("main")
    kinds = collections.Counter(m.kind for m in h.messages)
    data = sum(1 for m in h.messages if m.kind not in ("NDEATH",))
    plc_refs = collections.Counter(refs)
    stored_refs = collections.Counter(r["ref"] for r in stored.values())
    missing = sorted(s for s in stored if s not in seen)
    hist = sum(1 for s in seen.values() if s["historical"])
    bd = [value(m.metrics()["bdSeq"]) for m in h.of("NBIRTH")]
    print(f"\n{minutes:g} min, {restarts} broker restarts ({down_s:g} s down each), one NCMD "
          f"rebirth; daemon exit {rc}")
    by_kind = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))
    print(f"messages seen by the host: {len(h.messages)} ({by_kind}); seq wrapped "
          f"{data // 256} times")
    print(f"NBIRTH bdSeqs: {bd}; NDEATHs: "
          f"{[value(m.metrics()['bdSeq']) for m in h.of('NDEATH')]}")
    print(f"parts: {len(refs)} triggered, {refused[0]} refused, {len(stored)} results stored, "
          f"{sum(1 for r in plc_refs if stored_refs[r] == 0)} triggered without a result, "
          f"{sum(1 for n in stored_refs.values() if n > 1)} stored twice")
    print(f"SCADA: {len(seen)} results seen ({hist} as history), {len(missing)} not seen"
          + (f" (seqs {missing[:20]})" if missing else ""))
    print(f"violations: {len(h.violations)}" + "".join(f"\n  {v}" for v in h.violations[:20]))
    print(f"target (0 violations): {'met' if not h.violations else 'NOT met'}")
    return {"violations": len(h.violations), "triggered": len(refs), "stored": len(stored),
            "without_result": sum(1 for r in plc_refs if stored_refs[r] == 0),
            "stored_twice": sum(1 for n in stored_refs.values() if n > 1),
            "not_seen": len(missing), "births": len(bd), "exit": -1 if rc is None else rc}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--restarts", type=int, default=2)
    ap.add_argument("--rate", type=float, default=5.0, help="parts a second")
    ap.add_argument("--down-s", type=float, default=5.0, help="the broker is down this long")
    a = ap.parse_args()
    import logging

    logging.getLogger("asyncua").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="spb-soak-") as td:
        return 1 if soak(Path(td), a.minutes, a.restarts, a.rate, a.down_s)["violations"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
