"""A threaded HTTP server that sheds load at accept: the coordinator's API and the device's
local /metrics and /healthz share it."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger("edgerun.http")


class BoundedHTTPServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with at most `max_connections` requests in flight: more are closed
    at once, so a flood of connections costs sockets, not a thread each."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int):
        super().__init__(address, handler)
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)

    def process_request(self, request, client_address) -> None:
        if not self._slots.acquire(blocking=False):
            log.warning("over %d concurrent HTTP connections; closed one from %s",
                        self.max_connections, client_address[0])
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
