"""`edgerun serve` with `[modbus]`, end to end: the bundled model, a synthetic camera captured
on the PLC's edges (`trigger = "modbus"`), pymodbus's client as the PLC writing its part
counter and the PartPresent coil, reading each verdict back by its echoed part number; the
outbox (the durable record) checked for every part once; refusals and the connection bound
against the running daemon."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pymodbus.client import AsyncModbusTcpClient  # the `modbus` extra, in `test`: never skipped
from pymodbus.exceptions import ModbusException
from support.daemon_harness import Serve, results, write_config
from support.waiting import wait

from models import bundled
from runtime.wire.broker import free_port

pytestmark = pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                                reason="bundled model not built")
UNIT = 1
LABELS = ("ok", "scratch", "dent", "stain", "missing_part")  # [modbus] classes' default


async def verdict_of(c: AsyncModbusTcpClient, seq: int) -> list[int]:
    """As a PLC: read registers 0..9 until VerdictSeq is `seq` (the block in one request)."""
    for _ in range(3000):
        r = await c.read_holding_registers(0, count=10, device_id=UNIT)
        assert not r.isError(), r
        if r.registers[1] == seq:
            return r.registers
        await asyncio.sleep(0.01)
    raise AssertionError(f"no verdict for part {seq} within 30 s")


def test_a_plc_on_modbus_gets_one_verdict_per_part_none_lost_none_twice(tmp_path,
                                                                        profile_cache):
    port = free_port()
    cfg = write_config(tmp_path, profile_cache,
                       source='kind = "synthetic"\ntrigger = "modbus"',
                       extra=f"[modbus]\nenabled = true\nport = {port}\nmax_connections = 2\n")
    d = Serve(tmp_path, cfg)

    async def plc() -> dict[str, Any]:
        c = AsyncModbusTcpClient("127.0.0.1", port=port, timeout=5, retries=0)
        assert await c.connect()
        seen: dict[int, list[int]] = {}
        # one part at a time, as a line does: 6 by the part counter, 6 by the coil
        for seq in range(1, 7):
            assert not (await c.write_register(0, seq, device_id=UNIT)).isError()
            seen[seq] = await verdict_of(c, seq)
        for seq in range(7, 13):
            assert not (await c.write_coil(0, True, device_id=UNIT)).isError()
            seen[seq] = await verdict_of(c, seq)
            assert not (await c.write_coil(0, False, device_id=UNIT)).isError()
        # a burst: 8 parts written without waiting; every one is queued, then inspected
        for seq in range(13, 21):
            assert not (await c.write_register(0, seq, device_id=UNIT)).isError()
        last = await verdict_of(c, 20)
        # refused, and nothing changes: VerdictSeq and the verdict are edgerun's
        refused = [await c.write_register(1, 99, device_id=UNIT),
                   await c.write_register(16, 1, device_id=UNIT),
                   await c.write_coil(1, True, device_id=UNIT),
                   await c.read_holding_registers(0, count=17, device_id=UNIT)]
        # the bound: a second PLC fits, a third connection is closed at once
        c2 = AsyncModbusTcpClient("127.0.0.1", port=port, timeout=2, retries=0)
        assert await c2.connect()
        assert not (await c2.read_coils(0, count=1, device_id=UNIT)).isError()
        c3 = AsyncModbusTcpClient("127.0.0.1", port=port, timeout=1, retries=0)
        await c3.connect()
        try:
            await c3.read_holding_registers(0, count=1, device_id=UNIT)
            third = "answered"
        except ModbusException:
            third = "refused"
        c3.close()
        after = (await c.read_holding_registers(0, count=10, device_id=UNIT)).registers
        c2.close()
        c.close()
        return {"seen": seen, "last": last, "refused": refused, "third": third,
                "after": after}

    try:
        wait(d.ready, 180, "serve ready", d)
        got = asyncio.run(asyncio.wait_for(plc(), 180))
    finally:
        assert d.stop() == 0

    stored = results(tmp_path / "state" / "outbox.db")
    refs = [r["ref"] for r in stored]
    assert sorted(refs, key=lambda r: int(r[4:])) == [f"plc-{i}" for i in range(1, 21)]  # 0 lost
    assert len(refs) == len(set(refs)) == 20  # 0 duplicated
    by_ref = {r["ref"]: r for r in stored}
    for seq, regs in got["seen"].items():
        r = by_ref[f"plc-{seq}"]  # edge n is part n here: the PLC counted from 1 too
        assert regs[0] == seq and regs[1] == seq
        assert regs[2] == (1 if r["label"] in ("ok", "none") else 2), (seq, r["label"])
        assert regs[3] == LABELS.index(r["label"]) + 1
        assert regs[4] == round(r["score"] * 10_000)
        assert regs[8] == seq  # Results: one verdict per part so far
    assert got["last"][8] == 20 and got["last"][6] == 0  # Pending: none left
    assert got["last"][9] == sum(r["label"] not in ("ok", "none") for r in stored)
    assert [getattr(r, "exception_code", None) for r in got["refused"]] == [2, 2, 2, 2]
    assert got["third"] == "refused"
    assert got["after"] == got["last"]  # refusals changed nothing
