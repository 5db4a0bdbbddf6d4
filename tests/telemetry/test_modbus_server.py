"""The `[modbus]` server over real TCP with pymodbus's client as the PLC: edges from writes,
verdicts read back, exception codes for what the map refuses (a raw socket for the malformed
requests a client library will not send), the connection bound, a taken port."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Iterator

import pytest
from pymodbus.client import AsyncModbusTcpClient
from pymodbus.exceptions import ModbusException

from runtime.config.modbus import ModbusConfig
from runtime.telemetry.modbus_server import ModbusPlc


@pytest.fixture
def plc() -> Iterator[ModbusPlc]:
    p = ModbusPlc(ModbusConfig(enabled=True, port=0, max_connections=3, unit_id=7), ["main"])
    p.start()
    yield p
    p.stop()


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


async def client(port: int) -> AsyncModbusTcpClient:
    c = AsyncModbusTcpClient("127.0.0.1", port=port, timeout=2, retries=0)
    assert await c.connect()
    return c


def raw(port: int, pdu: bytes, unit: int = 7) -> bytes:
    """One Modbus TCP request (MBAP header + `pdu`); the response's PDU."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(struct.pack(">HHHB", 1, 0, len(pdu) + 1, unit) + pdu)
        head = s.recv(7)
        _, _, length, _ = struct.unpack(">HHHB", head)
        body = b""
        while len(body) < length - 1:
            body += s.recv(length - 1 - len(body))
        return body


def test_a_partseq_write_is_one_frame_and_its_verdict_echoes_the_part(plc):
    async def go():
        c = await client(plc.port)
        assert not (await c.write_register(0, 301, device_id=7)).isError()
        assert not (await c.write_coil(0, True, device_id=7)).isError()  # part 302
        e1, e2 = plc.edges.take("main", 1), plc.edges.take("main", 1)
        assert (e1.via, e2.via) == ("PartSeq", "PartPresent")
        plc.post([{"source": "main", "ref": e1.ref, "label": "scratch", "score": 0.9,
                   "e2e_ms": 12.0}])
        for _ in range(200):
            r = await c.read_holding_registers(0, count=10, device_id=7)
            if r.registers[1] == 301:
                break
            await asyncio.sleep(0.01)
        assert r.registers == [302, 301, 2, 2, 9000, 120, 0, 0, 1, 1]  # both edges taken
        assert (await c.read_input_registers(1, count=1, device_id=7)).registers == [301]
        c.close()
    run(go())


@pytest.mark.parametrize(("pdu", "code"), [
    (struct.pack(">BHH", 6, 1, 5), 2),  # VerdictSeq: not writable
    (struct.pack(">BHH", 6, 16, 5), 2),  # past the one source's block
    (struct.pack(">BHHB", 16, 0, 2, 4) + struct.pack(">HH", 1, 2), 2),  # PartSeq + VerdictSeq
    (struct.pack(">BHH", 5, 0, 0x1234), 3),  # a coil is 0xFF00 or 0x0000
    (struct.pack(">BHH", 5, 1, 0xFF00), 2),  # no such coil
    (struct.pack(">BHH", 3, 0, 17), 2),  # reading past the block
    (struct.pack(">BHH", 2, 0, 1), 1),  # no discrete inputs
    (struct.pack(">BHHH", 22, 0, 0xFFFF, 0), 1),  # mask write
])
def test_what_the_map_refuses_is_answered_with_its_exception_code(plc, pdu, code):
    assert raw(plc.port, pdu) == bytes([pdu[0] | 0x80, code])
    assert plc.edges.pending("main") == 0
    # and the server answers on: a good request after it
    assert raw(plc.port, struct.pack(">BHH", 3, 0, 2)) == bytes([3, 4, 0, 0, 0, 0])


def test_another_unit_id_is_refused_and_changes_nothing(plc):
    assert raw(plc.port, struct.pack(">BHH", 6, 0, 5), unit=1) == bytes([0x86, 0x0B])
    assert plc.edges.pending("main") == 0


def test_the_connection_past_the_bound_is_closed_and_the_others_serve_on(plc):
    async def go():
        cs = [await client(plc.port) for _ in range(3)]
        await asyncio.sleep(0.1)
        extra = AsyncModbusTcpClient("127.0.0.1", port=plc.port, timeout=1, retries=0,
                                     reconnect_delay=0)
        await extra.connect()
        with pytest.raises(ModbusException):  # closed: no answer at all
            await extra.read_holding_registers(0, count=1, device_id=7)
        extra.close()
        assert plc.stats()["connections_refused"] >= 1
        for i, c in enumerate(cs):
            assert not (await c.write_register(0, i + 1, device_id=7)).isError()
        assert plc.edges.pending("main") == 3
        cs[0].close()  # a slot comes free
        await asyncio.sleep(0.2)
        late = await client(plc.port)
        assert (await late.read_holding_registers(0, count=1, device_id=7)).registers == [3]
        for c in (*cs[1:], late):
            c.close()
    run(go())


def test_a_full_queue_answers_device_busy_and_the_plc_writes_again(plc):
    small = ModbusPlc(ModbusConfig(enabled=True, port=0, unit_id=7, max_pending=1), ["main"])
    small.start()
    try:
        assert raw(small.port, struct.pack(">BHH", 6, 0, 1)) == struct.pack(">BHH", 6, 0, 1)
        assert raw(small.port, struct.pack(">BHH", 6, 0, 2)) == bytes([0x86, 6])
        small.edges.take("main", 1)
        assert raw(small.port, struct.pack(">BHH", 6, 0, 2)) == struct.pack(">BHH", 6, 0, 2)
        assert small.edges.take("main", 1).n == 2
    finally:
        small.stop()


def test_a_taken_port_fails_the_start_naming_the_server(plc):
    again = ModbusPlc(ModbusConfig(enabled=True, port=plc.port), ["main"])
    with pytest.raises(ValueError, match=rf"modbus: cannot serve on 127.0.0.1:{plc.port}"):
        again.start()
    again.stop()


def test_a_remote_bind_without_allow_remote_is_refused():
    with pytest.raises(ValueError, match="allow_remote"):
        ModbusPlc(ModbusConfig(enabled=True, host="0.0.0.0"), ["main"])
