"""`edgerun serve` with `[sparkplug]` and `[opcua]` both on, end to end: the bundled model,
a synthetic camera captured on the PLC's edges (`trigger = "opcua"`), a real Mosquitto with
the fleet ACL. asyncua's client acts as the PLC (Trigger(), then reads the verdict back);
an independent Sparkplug host (tests/support/sparkplug_host.py, the schema compiled here)
is the primary host and checks every message against the spec's rules; the broker is
restarted under both while parts keep coming."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support.daemon_harness import Serve, results_by_seq, write_broker_config
from support.sparkplug_host import PrimaryHost, value
from support.waiting import wait

from models import bundled

asyncua = pytest.importorskip("asyncua")  # the `opcua` extra (in `test`)
from asyncua import Client, ua  # noqa: E402

from runtime.wire.broker import free_port  # noqa: E402

pytestmark = pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                                reason="bundled model not built")


def trigger(port: int, parts: int) -> list[dict[str, Any]]:
    """As a PLC: Trigger() one part at a time and read its verdict back once LastResult's
    FrameId (written last) is the part's."""
    async def go() -> list[dict[str, Any]]:
        out = []
        async with Client(f"opc.tcp://127.0.0.1:{port}/", timeout=10) as c:
            idx = await c.get_namespace_index("urn:edgerun:plc")

            def n(path: str) -> Any:
                return c.get_node(ua.NodeId(path, idx))

            for _ in range(parts):
                ref = await n("main").call_method(ua.NodeId("main.Trigger", idx))
                for _ in range(3000):
                    if await n("main.LastResult.FrameId").read_value() == ref:
                        break
                    await asyncio.sleep(0.01)
                else:
                    raise AssertionError(f"no verdict for {ref} within 30 s")
                out.append({"ref": ref, "verdict": await n("main.LastResult.Verdict").read_value(),
                            "class": await n("main.LastResult.Class").read_value()})
        return out
    return asyncio.run(asyncio.wait_for(go(), 120))


def test_a_plc_triggers_parts_and_scada_sees_every_verdict_across_a_broker_restart(
        tmp_path, broker, profile_cache):
    port = free_port()
    cfg = write_broker_config(tmp_path, broker, profile_cache,
                              source='kind = "synthetic"\ntrigger = "opcua"',
                              extra=f'[opcua]\nenabled = true\nport = {port}\n'
                                    '[sparkplug]\nenabled = true\nprimary_host_id = "scada"\n')
    outbox = tmp_path / "state" / "outbox.db"
    scada = PrimaryHost(broker, "sys", "box1")
    h = scada.host
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: h.of("DBIRTH", "main"), 120, "NBIRTH and DBIRTH of the source", d)
        nbirth = h.of("NBIRTH")[0].metrics()
        assert value(nbirth["Inference/Model"]) == "inspection"
        assert value(h.of("DBIRTH", "main")[0].metrics()["Counts/Results"]) == 0
        parts = trigger(port, 5)
        wait(lambda: any(value(m.metrics()["Counts/Results"]) == 5 for m in h.of("DDATA", "main")
                         if "Counts/Results" in m.metrics()), 30, "DDATA of the 5 parts", d)
        bd0 = value(nbirth["bdSeq"])

        # the broker goes: the PLC keeps inspecting (OPC UA does not need it) ...
        broker.stop()
        during = trigger(port, 3)
        broker.start()
        # ... and SCADA gets births, then the held parts as history, then live ones
        wait(lambda: len(h.of("DBIRTH", "main")) >= 2, 60, "births after the restart", d)
        after = trigger(port, 2)
        wait(lambda: max(h.by_seq("main"), default=0) >= max(results_by_seq(outbox)), 30,
             "DDATA of every part", d)
    finally:
        assert d.stop() == 0
    wait(lambda: h.of("NDEATH"), 30, "NDEATH at stop")
    scada.close()

    # every part: one result, its verdict the same to the PLC, the outbox and SCADA
    stored = {r["ref"]: {**r, "seq": s} for s, r in results_by_seq(outbox).items()}
    plc = parts + during + after
    assert [p["ref"] for p in plc] == [f"plc-{i}" for i in range(1, 11)]
    assert len(stored) == 10 and set(stored) == {p["ref"] for p in plc}
    seen = h.by_seq("main")
    for p in plc:
        r = stored[p["ref"]]
        assert p["class"] == r["label"], p
        good = r["label"] in ("ok", "none")  # ok_labels' default, both sides
        assert p["verdict"] == ("OK" if good else "NOK"), p  # the PLC's words (docs/plc.md)
        s = seen[r["seq"]]
        assert (s["Last Result/Class"], s["Last Result/Verdict"]) == (
            p["class"], "ok" if good else "reject"), (p, s)  # SCADA's (docs/sparkplug.md)
        assert s["Last Result/Time"] == round(r["t"] * 1000)  # the result's own time
        # the parts made while the broker was away reach SCADA as history; the others live
        assert s["historical"] == (p in during), (p, s)
    assert max(value(m.metrics()["Counts/Results"]) for m in h.of("DDATA", "main")
               if "Counts/Results" in m.metrics()) == 10

    # births before data on the new connection, its own bdSeq, and the NDEATH's bdSeq the
    # NBIRTH's (the independent host checks every message: seq continuity too)
    kinds = [(m.kind, m.device) for m in h.messages]
    second = [i for i, k in enumerate(kinds) if k == ("NBIRTH", "")][1]
    assert kinds[second + 1] == ("DBIRTH", "main")
    bd1 = value(h.of("NBIRTH")[-1].metrics()["bdSeq"])
    assert bd1 != bd0
    assert value(h.of("NDEATH")[-1].metrics()["bdSeq"]) == bd1
    assert h.violations == []


@pytest.mark.slow
def test_a_two_minute_soak_with_two_broker_restarts_breaks_no_rule(tmp_path):
    """bench/sparkplug_soak.py, shortened (the bench's 10 minutes: docs/sparkplug.md)."""
    from support.benches import load_bench

    f = load_bench("sparkplug_soak").soak(tmp_path, minutes=2, restarts=2, rate=5, down_s=3)
    assert f["violations"] == 0, f
    assert f["exit"] == 0 and f["births"] >= 1 + 2 + 1, f  # a rebirth halfway too
    assert f["triggered"] >= 500 and f["stored"] == f["triggered"], f
    assert f["without_result"] == 0 and f["stored_twice"] == 0, f
