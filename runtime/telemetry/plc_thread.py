"""What the PLC servers (opcua_server.py, modbus_server.py) share: an asyncio server in a
thread of its own, started and stopped from any thread of the daemon, and the loopback rule.

`LoopServer` owns the thread, its event loop and the stop signal: `start_loop()` returns once
the server listens or raises ValueError naming the protocol, host and port; `stop()` closes
it and joins the thread; `alive()` is what health shows. A server brings only its own part:
`_open()` (build it, listen, return its background tasks), `_close()`, and what it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from typing import Any

from runtime.config.opcua import is_loopback

START_TIMEOUT_S = 30.0
JOIN_TIMEOUT_S = 10.0


def require_loopback(host: str, allowed: bool, refusal: str) -> None:
    """ValueError(`refusal`) when `host` is not loopback and nothing `allowed` it. The config
    refuses it too; this guards a server built from a config made in code."""
    if not allowed and not is_loopback(host):
        raise ValueError(refusal)


class LoopServer(ABC):
    """An asyncio server run in its own thread (see module doc). `protocol` names it in
    health and errors ("opcua", "modbus"); `title` in the log ("OPC UA", "Modbus")."""

    protocol = ""
    title = ""

    def __init__(self, host: str, port: int, log: logging.Logger):
        self.host = host
        self.port = port  # the port bound (the one asked, or the one chosen for port 0)
        self._log = log
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._stop: asyncio.Event | None = None

    # -- the daemon's side (any thread) -------------------------------------------------------

    def start_loop(self) -> None:
        """Run the server in its thread; returns once it listens. ValueError when it cannot
        (the port taken, a privileged one, a bad certificate), naming host and port."""
        self._thread = threading.Thread(target=self._run, name=self.protocol, daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise ValueError(f"{self.protocol}: the server did not start within "
                             f"{START_TIMEOUT_S:g} s")
        if self._failed is not None:
            raise ValueError(f"{self.protocol}: cannot serve on {self.host}:{self.port}: "
                             f"{type(self._failed).__name__}: {self._failed}") from self._failed

    def call_soon(self, fn: Any, *args: Any) -> bool:
        """Run `fn(*args)` on the server's loop (never blocks); False before start or once
        the loop closed (stopping)."""
        loop = self._loop
        if loop is None:
            return False
        with contextlib.suppress(RuntimeError):  # the loop closed: stopping
            loop.call_soon_threadsafe(fn, *args)
            return True
        return False

    def alive(self) -> bool:
        """The server's thread runs (False before start, after stop, or once it died: health
        shows a dead server, the daemon runs on without it)."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        """Close every connection and the socket; join the thread."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT_S)

    # -- the server's thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:  # never past this thread
            if not self._ready.is_set():
                self._failed = e
                self._ready.set()
            else:
                self._log.exception("%s server failed; the daemon runs on without it",
                                    self.title)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        tasks = [asyncio.create_task(c) for c in await self._open()]
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self._close()

    @abstractmethod
    async def _open(self) -> list[Coroutine[Any, Any, None]]:
        """Build the server and listen (setting `port` to the one bound); the coroutines to
        run beside it until stop. Raising here fails `start_loop`."""

    @abstractmethod
    async def _close(self) -> None:
        """Close the server (connections and socket)."""
