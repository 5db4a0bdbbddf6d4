"""The daemon's PLC servers as one part (docs/plc.md): `[opcua]` (opcua_server.py) and
`[modbus]` (modbus_server.py), each optional, each bringing the edges of its own triggered
sources. The daemon sees one `edges` (the sources' captures take from it), one `tap`, one
`start` and one `stop`. Each server is imported only when enabled: their libraries are
optional extras.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.frames.edges import EdgeBoards


class PlcServers:
    """The enabled PLC servers, started and stopped together (see module doc)."""

    def __init__(self, servers: list[Any]):
        self.servers = servers
        self.edges = EdgeBoards([s.edges for s in servers])

    def tap(self, sink: Callable[[list[dict[str, Any]]], list[int]]
            ) -> Callable[[list[dict[str, Any]]], list[int]]:
        """`sink` (the outbox's append_many), then each server's view of the stored
        results: a verdict is shown only once it is durable."""
        def stored_then_shown(results: list[dict[str, Any]]) -> list[int]:
            seqs = sink(results)
            for s in self.servers:
                s.post(results)
            return seqs
        return stored_then_shown

    def alive(self) -> dict[str, bool]:
        """Each server's thread runs, by protocol (health: a dead server shows, the daemon
        runs on without it)."""
        return {s.protocol: s.alive() for s in self.servers}

    def start(self, health: Callable[[], dict[str, Any]]) -> None:
        """Start each (ValueError naming the key when one cannot serve; those started
        before it are stopped)."""
        started = []
        try:
            for s in self.servers:
                s.start(health)
                started.append(s)
        except BaseException:
            for s in started:
                s.stop()
            raise

    def stop(self) -> None:
        """Stop each, the last started first."""
        for s in reversed(self.servers):
            s.stop()


def open_plc(cfg: Any) -> PlcServers | None:
    """The config's PLC servers (not started), or None when neither is enabled. ImportError
    when an enabled one's library is missing; ValueError for a bad key file."""
    servers: list[Any] = []
    if cfg.opcua.enabled:
        from runtime.telemetry.opcua_server import open_plc as open_opcua

        servers.append(open_opcua(cfg))
    if cfg.modbus.enabled:
        from runtime.telemetry.modbus_server import open_modbus

        servers.append(open_modbus(cfg))
    return PlcServers(servers) if servers else None
