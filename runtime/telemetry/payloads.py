"""Topic tree and versioned payload schemas (v1), validated on both ends.

The schemas are JSON Schema (draft 2020-12) so other languages on the fleet side can use them
as they are; `edgerun schemas` prints them and docs/telemetry.md describes each field. A message
that fails validation is counted and logged by the receiver, never raised into its loop.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema

VERSION = 1
KINDS = ("state", "result", "health", "event", "cmd", "cmd/reply", "ack")
PREFIX = "edgerun/v1"

_ID = {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"}
_T = {"type": "number", "minimum": 0}
_V = {"const": VERSION}

SCHEMAS: dict[str, dict[str, Any]] = {
    "state": {
        "type": "object",
        "required": ["v", "online", "boot", "t"],
        "properties": {
            "v": _V, "online": {"type": "boolean"}, "boot": {"type": "string"}, "t": _T,
            "stream": {"type": "string"}, "versions": {"type": "object"},
            "model": {"type": "string"}, "choice": {"type": "string"},
            "reason": {"type": "string"},
        },
    },
    "result": {
        "type": "object",
        "required": ["v", "stream", "boot", "floor", "results"],
        "properties": {
            "v": _V, "stream": {"type": "string"}, "boot": {"type": "string"},
            "floor": {"type": "integer", "minimum": 1},
            "results": {
                "type": "array", "minItems": 1,
                "items": {
                    "type": "object", "required": ["seq", "t"],
                    "properties": {"seq": {"type": "integer", "minimum": 1}, "t": _T,
                                   "variant": {"type": "string"}, "rung": {"type": "integer"},
                                   "label": {"type": "string"}, "score": {"type": "number"}},
                },
            },
        },
    },
    "health": {
        "type": "object",
        "required": ["v", "t", "boot"],
        "properties": {"v": _V, "t": _T, "boot": {"type": "string"},
                       "temp_c": {"type": ["number", "null"]}, "rung": {"type": "integer"},
                       "choice": {"type": "string"}, "backlog": {"type": "object"}},
    },
    "event": {
        "type": "object",
        "required": ["v", "t", "type"],
        "properties": {"v": _V, "t": _T, "type": {"type": "string"},
                       "severity": {"enum": ["info", "warning", "critical"]}},
    },
    "cmd": {
        "type": "object",
        "required": ["v", "id", "device", "cmd", "args", "issued_at", "expires_at", "key_id",
                     "sig"],
        "additionalProperties": False,
        "properties": {
            "v": _V, "id": {"type": "string", "minLength": 8, "maxLength": 64},
            "device": _ID, "cmd": {"type": "string"}, "args": {"type": "object"},
            "issued_at": _T, "expires_at": _T, "key_id": {"type": "string"},
            "sig": {"type": "string"},
        },
    },
    "cmd/reply": {
        "type": "object",
        "required": ["v", "id", "ok", "status", "t"],
        "properties": {"v": _V, "id": {"type": ["string", "null"]}, "ok": {"type": "boolean"},
                       "status": {"enum": ["done", "accepted", "refused"]},
                       "reason": {"type": "string"}, "t": _T, "data": {}},
    },
    "ack": {
        "type": "object",
        "required": ["v", "stream", "seq"],
        "properties": {"v": _V, "stream": {"type": "string"},
                       "seq": {"type": "integer", "minimum": 0}},
    },
}

_VALIDATORS = {k: jsonschema.Draft202012Validator(s) for k, s in SCHEMAS.items()}


class PayloadError(ValueError):
    """A message is not valid JSON or does not match its schema; the text says where."""


def topic(fleet: str, device: str, kind: str) -> str:
    """`edgerun/v1/{fleet}/{device}/{kind}`."""
    return f"{PREFIX}/{fleet}/{device}/{kind}"


def parse_topic(name: str) -> tuple[str, str, str] | None:
    """(fleet, device, kind) of an edgerun topic, or None when it is not one."""
    parts = name.split("/")
    if len(parts) < 5 or f"{parts[0]}/{parts[1]}" != PREFIX:
        return None
    kind = "/".join(parts[4:])
    return (parts[2], parts[3], kind) if kind in KINDS else None


def decode(kind: str, raw: bytes, max_bytes: int = 1 << 20) -> dict:
    """Parse and validate a payload of `kind`; raises PayloadError saying what is wrong."""
    if len(raw) > max_bytes:
        raise PayloadError(f"{kind}: payload of {len(raw)} bytes exceeds the {max_bytes} limit")
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PayloadError(f"{kind}: not JSON: {e}") from e
    check(kind, obj)
    return obj


def check(kind: str, obj: Any) -> None:
    """Validate a decoded payload; raises PayloadError naming the failing field."""
    error = jsonschema.exceptions.best_match(_VALIDATORS[kind].iter_errors(obj))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise PayloadError(f"{kind}: at {where}: {error.message}")


def encode(kind: str, obj: dict) -> bytes:
    """Validate and serialise a payload we are about to send (our own bugs surface here)."""
    check(kind, obj)
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
