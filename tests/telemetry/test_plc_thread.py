"""The PLC servers' shared lifecycle (runtime/telemetry/plc_thread.py), on a plain asyncio TCP
server: start returns once it listens, a port taken is a ValueError naming host and port,
stop closes the socket and joins the thread, work handed over runs on the loop; and the
loopback rule as a table."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Coroutine
from typing import Any

import pytest

from runtime.telemetry.plc_thread import LoopServer, require_loopback

log = logging.getLogger("test.plc_thread")


class _Echo(LoopServer):
    """A TCP server that answers each connection with one line, and a background task."""

    protocol, title = "echo", "Echo"

    def __init__(self, port: int = 0):
        super().__init__("127.0.0.1", port, log)
        self.server: asyncio.Server | None = None
        self.ticks = 0
        self.closed = threading.Event()

    async def _open(self) -> list[Coroutine[Any, Any, None]]:
        async def hello(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(b"hello\n")
            await w.drain()
            w.close()

        self.server = await asyncio.start_server(hello, self.host, self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        return [self._tick()]

    async def _tick(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0.01)

    async def _close(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()
        self.closed.set()


def _read(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        return s.makefile("rb").readline()


def test_start_serves_then_stop_closes_and_joins():
    srv = _Echo()
    assert not srv.alive() and not srv.call_soon(print)  # before start: nothing to run on
    srv.start_loop()
    try:
        assert srv.alive() and srv.port > 0
        assert _read(srv.port) == b"hello\n"
        ran = threading.Event()
        assert srv.call_soon(ran.set)
        assert ran.wait(10)  # handed to the loop, run there
    finally:
        srv.stop()
    assert not srv.alive() and srv.closed.is_set()
    with pytest.raises(OSError):
        _read(srv.port)
    assert not srv.call_soon(print)  # the loop closed: dropped, never raised


def test_a_port_taken_fails_start_naming_protocol_host_and_port():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        srv = _Echo(port)
        with pytest.raises(ValueError, match=rf"^echo: cannot serve on 127\.0\.0\.1:{port}: "):
            srv.start_loop()
    srv.stop()  # after a failed start: nothing to stop, no error
    assert not srv.alive()


@pytest.mark.parametrize("host, allowed, refused", [
    ("127.0.0.1", False, False),
    ("::1", False, False),
    ("localhost", False, False),
    ("0.0.0.0", False, True),
    ("192.168.1.10", False, True),
    ("0.0.0.0", True, False),
])
def test_off_loopback_only_when_allowed(host, allowed, refused):
    if refused:
        with pytest.raises(ValueError, match="^the refusal$"):
            require_loopback(host, allowed, "the refusal")
    else:
        require_loopback(host, allowed, "the refusal")
