"""The PLC's Modbus TCP server (`[modbus]`, docs/plc.md): a PLC writes a PartPresent coil or
its part counter into edgerun, as it would into a Cognex or Keyence vision sensor, and reads
the verdict back from holding registers (the map: runtime/telemetry/modbus_map.py). Rising
edges become frames through an EdgeBoard (runtime/frames/edges.py), as OPC UA's do.

pymodbus runs in a thread of its own with its own event loop (plc_thread.py, shared with the
OPC UA server); the daemon talks to it as to the OPC UA server (`edges`, `post`,
`start(health)`, `stop()`), from any thread, without waiting on it: stored results are
handed over with `call_soon_threadsafe` and written on the loop, where every request is
answered, so a read sees whole verdicts.

Bounded and confined: at most `max_connections` TCP connections (the next is closed at once,
counted and logged rate-limited); requests to another unit id, outside the map, or writing
anything but PartPresent and PartSeq are answered with a Modbus exception, never an error
past the request. Modbus has no security: off loopback only with `allow_remote`, warned.
"""

from __future__ import annotations

import asyncio
import logging
import math
import struct
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

try:
    from pymodbus.constants import ExcCodes
    from pymodbus.datastore import ModbusServerContext
    from pymodbus.exceptions import NoSuchIdException
    from pymodbus.pdu import ExceptionResponse
    from pymodbus.pdu.bit_message import WriteSingleCoilRequest
    from pymodbus.server import ModbusTcpServer
except ImportError as e:  # an optional extra: the daemon says so as a config error
    raise ImportError(f"[modbus] enabled needs the pymodbus package ({e}): pip install "
                      "'edgerun[modbus]'") from e

from runtime.config.modbus import ModbusConfig
from runtime.config.opcua import is_loopback
from runtime.frames.edges import EdgeBoard
from runtime.telemetry.modbus_map import ILLEGAL_VALUE, RegisterMap
from runtime.telemetry.plc_thread import LoopServer, require_loopback
from runtime.wire.quarantine import RateLimitedLog

log = logging.getLogger("edgerun.modbus")
PENDING_INTERVAL_S = 0.2  # the Pending registers' refresh


class _Context(ModbusServerContext):
    """pymodbus's datastore hook, answering from the RegisterMap: its base class is used for
    its type only (pymodbus routes requests of a 'legacy' context to these two methods)."""

    def __init__(self, regs: RegisterMap, unit_id: int, said: RateLimitedLog):
        # the base constructor is skipped: it builds a simulator device this never uses
        self.old_simulator, self.simdevices = True, []
        self._regs, self._unit, self._said = regs, unit_id, said

    def _device(self, device_id: int) -> None:
        if device_id != self._unit:
            self._said.log("unit", "Modbus: refused a request to unit %d ([modbus] unit_id "
                           "is %d)", device_id, self._unit)
            raise NoSuchIdException(f"unit {device_id}")

    async def async_getValues(self, device_id: int, func_code: int, address: int,
                              count: int = 1) -> list[int] | list[bool] | ExcCodes:
        """A read request's values, or its exception code."""
        self._device(device_id)
        got = self._regs.read(func_code, address, count)
        if isinstance(got, int):
            self._refused(func_code, address, got)
            return ExcCodes(got)
        return got

    async def async_setValues(self, device_id: int, func_code: int, address: int,
                              values: Sequence[int] | Sequence[bool]) -> ExcCodes | None:
        """Apply a write request, or its exception code."""
        self._device(device_id)
        code = self._regs.write(func_code, address, values)
        if code is None:
            return None
        self._refused(func_code, address, code)
        return ExcCodes(code)

    def _refused(self, fc: int, address: int, code: int) -> None:
        self._said.log("refused", "Modbus: refused function %d at address %d: %s", fc,
                       address, ExcCodes(code).name)

    def device_ids(self) -> list[int]:
        """The one unit answered."""
        return [self._unit]


class _StrictWriteCoil(WriteSingleCoilRequest):
    """Function 5 as the spec has it: a value other than 0xFF00 (on) or 0x0000 (off) is
    ILLEGAL_DATA_VALUE (pymodbus's own takes any non-zero value as on)."""

    raw = 0

    def decode(self, data: bytes) -> None:
        """Keep the raw value."""
        super().decode(data)
        self.raw = struct.unpack(">H", data[2:4])[0]

    async def datastore_update(self, context: Any, device_id: int) -> Any:
        """Refuse a malformed value; the rest as pymodbus does."""
        if self.raw not in (0xFF00, 0x0000):
            return ExceptionResponse(self.function_code, ILLEGAL_VALUE)
        return await super().datastore_update(context, device_id)


class _Refused(asyncio.Protocol):
    """A connection past max_connections: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Close it."""
        transport.close()


class _Server(ModbusTcpServer):
    """pymodbus's TCP server with a bound on connections."""

    def __init__(self, *args: Any, max_connections: int, on_refused: Callable[[int], None],
                 **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.max_connections, self._on_refused = max_connections, on_refused

    def handle_new_connection(self) -> Any:
        """A new connection's protocol: pymodbus's, or one that closes it past the bound."""
        if len(self.active_connections) >= self.max_connections:
            self._on_refused(len(self.active_connections))
            return _Refused()
        return super().handle_new_connection()


class ModbusPlc(LoopServer):
    """The `[modbus]` server (see module doc). `triggered`: the sources with
    `trigger = "modbus"`, in config order (their register blocks' order)."""

    protocol, title = "modbus", "Modbus"

    def __init__(self, cfg: ModbusConfig, triggered: list[str]):
        require_loopback(cfg.host, cfg.allow_remote,
                         f"modbus.allow_remote: host {cfg.host!r} is not loopback")
        super().__init__(cfg.host, cfg.port, log)
        self.cfg = cfg
        self.edges = EdgeBoard(triggered, cfg.max_pending)
        self._said = RateLimitedLog(log)
        self.regs = RegisterMap(triggered, cfg.coil_base, cfg.register_base, cfg.classes,
                                cfg.ok_labels, self.edges.push, cfg.max_pending)
        self._known = set(triggered)
        self.server: _Server | None = None
        self.connections_refused = 0

    # -- the daemon's side (any thread) -------------------------------------------------------

    def start(self, health: Callable[[], dict[str, Any]] | None = None) -> None:
        """Serve in a thread; returns once it listens. ValueError when it cannot (the port
        taken, or a privileged one). `health` is not read (the map has no health)."""
        self.start_loop()
        if not is_loopback(self.cfg.host):
            log.warning("Modbus TCP on %s:%d: no login, no encryption; anyone who reaches it "
                        "can trigger inspections ([modbus] allow_remote)", self.cfg.host,
                        self.port)
        log.info("Modbus TCP server on %s:%d, unit %d (%d PLC-triggered sources)",
                 self.cfg.host, self.port, self.cfg.unit_id, len(self.edges.sources))

    def post(self, results: list[dict[str, Any]]) -> None:
        """Hand stored results to the loop (never blocks; dropped before start)."""
        items = [(r["source"], str(r.get("ref", "")), str(r.get("label", "")),
                  float(r.get("score") or 0.0), float(r.get("e2e_ms") or math.nan))
                 for r in results if r.get("source") in self._known]
        if items:
            self.call_soon(self._show, items)

    def stats(self) -> dict[str, Any]:
        """Connections, refusals and edges (tests and the log)."""
        srv = self.server
        return {"connections": len(srv.active_connections) if srv else 0,
                "connections_refused": self.connections_refused,
                "requests_refused": self.regs.refused,
                "edges": dict(self.edges.accepted), "edges_refused": dict(self.edges.refused)}

    # -- the server's thread -----------------------------------------------------------------

    def _show(self, items: list[tuple[str, str, str, float, float]]) -> None:
        for source, ref, label, score, e2e_ms in items:
            try:
                self.regs.show(source, ref, label, score, e2e_ms)
                self.regs.set_pending(source, self.edges.pending(source))
            except Exception:  # one bad result costs itself, never the loop
                self._said.log("show", "Modbus: could not show a result", exc_info=True)

    def _refused(self, n: int) -> None:
        self.connections_refused += 1
        self._said.log("connections", "Modbus: refused a connection: %d are open, the bound "
                       "([modbus] max_connections)", n)

    async def _open(self) -> list[Coroutine[Any, Any, None]]:
        # pymodbus logs each refused request and connection itself: a client could fill the
        # journal; edgerun says it, rate-limited
        logging.getLogger("pymodbus").setLevel(logging.CRITICAL)
        server = _Server(_Context(self.regs, self.cfg.unit_id, self._said),
                         address=(self.cfg.host, self.cfg.port), custom_pdu=[_StrictWriteCoil],
                         max_connections=self.cfg.max_connections, on_refused=self._refused)
        await server.serve_forever(background=True)
        self.server = server
        sockets = getattr(server.transport, "sockets", None) or ()
        if sockets:
            self.port = sockets[0].getsockname()[1]  # the one chosen, for port 0
        return [self._refresh()]

    async def _close(self) -> None:
        if self.server is not None:
            await self.server.shutdown()

    async def _refresh(self) -> None:
        """The Pending registers, every PENDING_INTERVAL_S (edges are taken on the capture
        thread: nothing on this loop sees them go)."""
        while True:
            for s in self.edges.sources:
                self.regs.set_pending(s, self.edges.pending(s))
            await asyncio.sleep(PENDING_INTERVAL_S)


def open_modbus(cfg: Any) -> ModbusPlc | None:
    """The `[modbus]` server of a daemon's config (not started), or None when it is off."""
    if not cfg.modbus.enabled:
        return None
    sources = cfg.sources or (cfg.source,)
    return ModbusPlc(cfg.modbus, [s.name or "main" for s in sources if s.trigger == "modbus"])
