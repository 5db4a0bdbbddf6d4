"""Both PLC servers in one daemon (runtime/telemetry/plc.py): each source's edges from its
own server through one board, every stored result shown by both, started and stopped
together; real asyncua and pymodbus servers on loopback."""

from __future__ import annotations

import asyncio

import pytest
from pymodbus.client import AsyncModbusTcpClient

from runtime.config import from_dict
from runtime.telemetry.plc import open_plc


def config(**modbus):
    return from_dict({
        "sources": [{"name": "a", "kind": "synthetic", "trigger": "opcua"},
                     {"name": "b", "kind": "synthetic", "trigger": "modbus"}],
        "opcua": {"enabled": True, "port": 0},
        "modbus": {"enabled": True, "port": 0, **modbus}})


def test_neither_enabled_is_none():
    assert open_plc(from_dict({})) is None


def test_opcua_and_modbus_sources_share_one_board_and_see_every_result():
    plc = open_plc(config())
    assert plc is not None and plc.edges.sources == ["a", "b"]
    opcua, modbus = plc.servers
    stored: list[list[dict]] = []
    sink = plc.tap(lambda rs: stored.append(rs) or list(range(len(rs))))
    assert plc.alive() == {"opcua": False, "modbus": False}  # not started yet
    plc.start(dict)
    try:
        assert plc.alive() == {"opcua": True, "modbus": True}  # health's `integrations`

        async def go():
            c = AsyncModbusTcpClient("127.0.0.1", port=modbus.port, timeout=5, retries=0)
            assert await c.connect()
            assert not (await c.write_register(0, 77, device_id=1)).isError()
            e = plc.edges.take("b", 5)  # as the capture thread does
            assert e is not None and e.via == "PartSeq" and plc.edges.pending("a") == 0
            assert sink([{"source": "b", "ref": e.ref, "label": "ok", "score": 1.0,
                          "t": 1.0, "e2e_ms": 3.0}]) == [0]
            for _ in range(500):
                regs = (await c.read_holding_registers(0, count=3, device_id=1)).registers
                if regs[1] == 77:
                    break
                await asyncio.sleep(0.01)
            c.close()
            return regs
        assert asyncio.run(asyncio.wait_for(go(), 30)) == [77, 77, 1]
        assert len(stored) == 1 and opcua.posted == 1  # the OPC UA server saw it too
    finally:
        plc.stop()
    assert not any(s._thread.is_alive() for s in plc.servers)
    assert plc.alive() == {"opcua": False, "modbus": False}


def test_a_server_that_cannot_start_stops_the_one_started_before_it():
    first = open_plc(config())
    first.start(dict)
    try:
        clash = open_plc(config(port=first.servers[1].port))
        with pytest.raises(ValueError, match="modbus: cannot serve"):
            clash.start(dict)
        assert not clash.servers[0]._thread.is_alive()  # its OPC UA server was stopped
    finally:
        first.stop()
