"""The coordinator's bundle paths for tests: a coordinator with its API on a store, the
bundle shelf over MQTT, a device-side fetch."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

from runtime.config.telemetry import BrokerConfig
from runtime.coordinator.bundle_chunks import ChunkServer
from runtime.coordinator.bundles import Shelf
from runtime.ota.bundle_mqtt import fetch_over_mqtt
from runtime.wire.bundle_chunks import (
    decode_chunk,
)
from support.waiting import wait

FLEET = "t"
TOKEN = "t" * 24  # the API token of `coord`


class StoreShelf(Shelf):
    """A shelf in a store of its own (the coordinator's: runtime/coordinator/store.py);
    `close` closes both. `bytes_of(held)` is the bundle as stored."""

    def __init__(self, where: Path):
        from runtime.coordinator.store import Store

        self.store = Store(str(where / "c.db"))
        super().__init__(self.store, 64 << 20)

    def bytes_of(self, held) -> bytes:
        return self.read(held, 0, held.size)

    def close(self) -> None:
        super().close()
        self.store.close()


def answer(shelf: Shelf, req) -> object:
    """The chunk server's decoded answer to one request (a dict, or raw bytes)."""
    server = ChunkServer(FLEET, shelf, BrokerConfig(), "c")  # not started: answer() only
    raw = req if isinstance(req, bytes) else json.dumps(req).encode()
    return decode_chunk(server.answer("box1", raw))


class Coord:
    """The coordinator's chunk server alone, logged in as the coordinator identity."""

    def __init__(self, broker, shelf: Shelf):
        self.server = ChunkServer(FLEET, shelf, broker.coordinator(FLEET), "coord")
        self.server.start()
        wait(lambda: self.server._conn.subscribed.is_set(), 30, "chunk server subscribed")

    def close(self) -> None:
        self.server.stop()


def fetch(tmp_path: Path, broker, held, **kw) -> Path:
    """Fetch `held` over MQTT as device box1 into tmp_path/dl (small chunks, short timeout)."""
    args = dict(chunk=16 * 1024, window=4, timeout_s=3.0)
    args.update(kw)
    return fetch_over_mqtt(tmp_path / "dl" / "b.edgerun", broker.device(FLEET, "box1"), FLEET,
                           "box1", held.id, held.size, held.sha256, held.token, 64 << 20, 0,
                           **args)


def req(port: int, method: str, path: str, body: bytes | None = None
         ) -> tuple[int, dict]:
    """(status, JSON body) of one request to the coordinator API with `TOKEN`."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    if body is not None:
        headers["Content-Length"] = str(len(body))
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, json.loads(raw) if raw else {}
