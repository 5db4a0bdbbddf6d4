"""Bundles over MQTT: the wire format the device (runtime/ota/bundle_mqtt.py) and the
coordinator (runtime/coordinator/bundle_chunks.py) share. The topics and the chunk layout are
described in runtime/ota/bundle_mqtt.py's docstring and docs/ota.md ("Bundles over MQTT").
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

REQ, CHUNK = "bundle/req", "bundle/chunk"  # topic kinds under edgerun/v1/<fleet>/<device>/
MAGIC, FORMAT = b"ERBC", 1
HEADER = struct.Struct(">4sBBHQQI")  # magic, format, status, id length, offset, total, body
MAX_CHUNK = 256 * 1024  # the most a coordinator sends in one message (Mosquitto: far below
# its 256 MB packet limit and any sane message_size_limit)
MAX_REQUEST = 1024  # bytes of a request's JSON
OK, NOT_FOUND, FORBIDDEN, BAD_RANGE, BAD_REQUEST = 0, 1, 2, 3, 4
STATUS = {OK: "ok", NOT_FOUND: "not found", FORBIDDEN: "forbidden", BAD_RANGE: "bad range",
          BAD_REQUEST: "bad request"}


@dataclass(frozen=True)
class Chunk:
    """One decoded `bundle/chunk` message."""

    status: int
    bundle: str
    offset: int
    total: int  # the bundle's size as the coordinator holds it (0 when unknown)
    body: bytes  # data (status OK) or the reason (UTF-8)

    @property
    def reason(self) -> str:
        """The coordinator's reason for an error answer."""
        return self.body.decode("utf-8", "replace")[:500]


def topic(fleet: str, device: str, kind: str) -> str:
    """`edgerun/v1/<fleet>/<device>/<kind>` (runtime.wire.payloads.topic's layout)."""
    return f"edgerun/v1/{fleet}/{device}/{kind}"


def encode_chunk(status: int, bundle: str, offset: int, total: int, body: bytes) -> bytes:
    """A `bundle/chunk` payload."""
    bid = bundle.encode()[:255]
    return HEADER.pack(MAGIC, FORMAT, status, len(bid), offset, total, len(body)) + bid + body


def decode_chunk(raw: bytes) -> Chunk:
    """Parse a `bundle/chunk` payload; ValueError for anything malformed or truncated."""
    if len(raw) < HEADER.size:
        raise ValueError(f"{len(raw)} bytes: shorter than the {HEADER.size}-byte header")
    magic, fmt, status, idlen, offset, total, n = HEADER.unpack_from(raw)
    if magic != MAGIC or fmt != FORMAT:
        raise ValueError(f"not a bundle chunk (magic {magic!r}, format {fmt})")
    if status not in STATUS:
        raise ValueError(f"unknown status {status}")
    if len(raw) != HEADER.size + idlen + n:
        raise ValueError(f"{len(raw)} bytes, the header declares {HEADER.size + idlen + n}: "
                         "truncated or padded")
    if status == OK and n > MAX_CHUNK:
        raise ValueError(f"a chunk of {n} bytes is over {MAX_CHUNK}")
    try:
        bundle = raw[HEADER.size:HEADER.size + idlen].decode()
    except UnicodeDecodeError:
        raise ValueError("bundle id is not UTF-8") from None
    return Chunk(status, bundle, offset, total, raw[HEADER.size + idlen:])


def encode_request(bundle: str, offset: int, length: int, token: str) -> bytes:
    """A `bundle/req` payload."""
    return json.dumps({"v": 1, "bundle": bundle, "offset": offset, "length": length,
                       "token": token}, separators=(",", ":")).encode()


def nodelay(client: object) -> None:
    """Nagle off on a bulk-transfer connection: a request written right after the PUBACK of
    a chunk otherwise waits for the broker's delayed ACK (40 ms a request on Linux, measured:
    a window of 1 moved 2.6 MB/s)."""
    import contextlib
    import socket

    with contextlib.suppress(OSError, AttributeError):
        client.socket().setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore
