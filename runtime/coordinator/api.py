"""JSON HTTP API of the coordinator (standard library server; it is an operator tool, not a
public web service — bind it to localhost or put it behind the site's reverse proxy).

GET  /api/v1/fleet                          every device: status, alerts, choice, counts
GET  /api/v1/devices/{id}                   one device: view, acks, recent events
GET  /api/v1/devices/{id}/results?after=N&limit=M
GET  /api/v1/stats                          ingest counters, health age p50/p99
POST /api/v1/devices/{id}/commands          {"cmd": ..., "args": {...}, "wait_s": 10}
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from runtime.coordinator.service import Coordinator, UnknownDevice

log = logging.getLogger("edgerun.api")


def serve(coordinator: Coordinator, host: str, port: int) -> ThreadingHTTPServer:
    """Start the API on a daemon thread; returns the server (`.server_address` has the port)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("%s " + fmt, self.address_string(), *args)

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body, default=str).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlparse(self.path)
            parts = [p for p in url.path.split("/") if p]
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                if parts == ["api", "v1", "fleet"]:
                    return self._send(200, coordinator.fleet_view())
                if parts == ["api", "v1", "stats"]:
                    return self._send(200, coordinator.stats())
                if parts[:3] == ["api", "v1", "devices"] and len(parts) == 4:
                    return self._send(200, coordinator.device_view(parts[3]))
                if parts[:3] == ["api", "v1", "devices"] and parts[4:] == ["results"]:
                    return self._send(200, coordinator.store.results(
                        parts[3], int(query.get("after", 0)), int(query.get("limit", 1000))))
            except UnknownDevice as e:
                return self._send(404, {"error": f"unknown device {e.args[0]!r}"})
            except ValueError as e:
                return self._send(400, {"error": str(e)})
            self._send(404, {"error": f"no such endpoint: {url.path}"})

        def do_POST(self) -> None:
            parts = [p for p in urlparse(self.path).path.split("/") if p]
            if not (parts[:3] == ["api", "v1", "devices"] and parts[4:] == ["commands"]):
                return self._send(404, {"error": f"no such endpoint: {self.path}"})
            try:
                length = int(self.headers.get("Content-Length", 0))
                if length > 65536:
                    return self._send(413, {"error": "request body over 64 KiB"})
                req = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
                    return self._send(400, {"error": 'body must be {"cmd": NAME, "args": {...}}'})
                reply = coordinator.send_command(parts[3], req["cmd"], req.get("args") or {},
                                                 wait_s=float(req.get("wait_s", 10)))
            except UnknownDevice as e:
                return self._send(404, {"error": f"unknown device {e.args[0]!r}"})
            except PermissionError as e:
                return self._send(403, {"error": str(e)})
            except (ValueError, TypeError) as e:
                return self._send(400, {"error": str(e)})
            if reply is None:
                return self._send(504, {"error": "no reply from the device in time"})
            self._send(200, reply)

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server
