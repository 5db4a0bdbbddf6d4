"""Sparkplug B payloads through the Tahu schema (sparkplug_b.proto, compiled by protoc into
sparkplug_b_pb2.py): metrics in, protobuf bytes out, and the checks on what comes in.

No wire encoding is written here: the `protobuf` package encodes and decodes. This module
maps edgerun's values to the schema's typed fields (the spec's table: Int8..UInt32 in
`int_value`, Int64/UInt64/DateTime in `long_value`, ...), and refuses commands it does not
know. `python -m grpc_tools.protoc -I. --python_out=. sparkplug_b.proto` in this folder
regenerates the _pb2 module (tests/telemetry/test_sparkplug_payload.py checks it is current).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from runtime.telemetry.sparkplug import sparkplug_b_pb2 as pb

NAMESPACE = "spBv1.0"
REBIRTH = "Node Control/Rebirth"
BD_SEQ = "bdSeq"

# The datatypes edgerun's metrics use (the schema's DataType enum)
INT32, INT64 = pb.DataType.Value("Int32"), pb.DataType.Value("Int64")
UINT32, UINT64 = pb.DataType.Value("UInt32"), pb.DataType.Value("UInt64")
DOUBLE, BOOLEAN = pb.DataType.Value("Double"), pb.DataType.Value("Boolean")
STRING, DATETIME = pb.DataType.Value("String"), pb.DataType.Value("DateTime")

_INT_FIELD = {INT32: 32, UINT32: 32}  # in int_value (uint32): signed as two's complement
_LONG_FIELD = {INT64: 64, UINT64: 64, DATETIME: 64}


@dataclass(frozen=True)
class Value:
    """One metric's value: its Sparkplug datatype, the value (None: null), the time it was
    taken (ms since the epoch) and whether it is history (not the live tag's value)."""

    datatype: int
    value: Any
    t_ms: int
    historical: bool = False


def topic(group: str, kind: str, edge_node: str, device: str = "") -> str:
    """spBv1.0/<group>/<kind>/<edge node>[/<device>]."""
    return f"{NAMESPACE}/{group}/{kind}/{edge_node}" + (f"/{device}" if device else "")


def state_topic(host_id: str) -> str:
    """The primary host's STATE topic (3.0)."""
    return f"{NAMESPACE}/STATE/{host_id}"


def encode(metrics: dict[str, Value], t_ms: int, seq: int | None) -> bytes:
    """A payload with these metrics (in order), the message's timestamp and its seq (None:
    none, as NDEATH has)."""
    p = pb.Payload()
    p.timestamp = t_ms
    if seq is not None:
        p.seq = seq
    for name, v in metrics.items():
        m = p.metrics.add()
        m.name, m.datatype, m.timestamp = name, v.datatype, v.t_ms
        if v.historical:
            m.is_historical = True
        _set(m, v)
    return p.SerializeToString()


def _set(m: Any, v: Value) -> None:
    """Put the value in the field the datatype calls for (null: is_null)."""
    x = v.value
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        m.is_null = True
    elif v.datatype in _INT_FIELD:
        m.int_value = int(x) & 0xFFFFFFFF
    elif v.datatype in _LONG_FIELD:
        m.long_value = int(x) & 0xFFFFFFFFFFFFFFFF
    elif v.datatype == DOUBLE:
        m.double_value = float(x)
    elif v.datatype == BOOLEAN:
        m.boolean_value = bool(x)
    elif v.datatype == STRING:
        m.string_value = str(x)
    else:
        raise ValueError(f"datatype {v.datatype} is not one edgerun sends")


def death(bd_seq: int, t_ms: int) -> bytes:
    """NDEATH: the bdSeq of the connection it ends, and no seq."""
    return encode({BD_SEQ: Value(INT64, bd_seq, t_ms)}, t_ms, None)


class CommandRefused(ValueError):
    """An NCMD/DCMD that is not acted on; the message says why."""


def parse_node_command(raw: bytes, max_bytes: int) -> bool:
    """Whether an NCMD asks for a rebirth; CommandRefused for anything else: larger than
    `max_bytes`, not a payload, a metric other than Node Control/Rebirth, or Rebirth not a
    Boolean. Checked whole before anything is acted on."""
    p = _decode(raw, max_bytes)
    if not p.metrics:
        raise CommandRefused("an NCMD without metrics")
    rebirth = False
    for m in p.metrics:
        name = m.name if m.HasField("name") else f"alias {m.alias}"
        if name != REBIRTH:
            raise CommandRefused(f"unknown metric {name[:100]!r} (this node takes only "
                                 f"{REBIRTH!r})")
        if m.datatype != BOOLEAN or m.WhichOneof("value") != "boolean_value":
            raise CommandRefused(f"{REBIRTH!r} must be a Boolean, got datatype {m.datatype} "
                                 f"with {m.WhichOneof('value') or 'no value'}")
        rebirth = rebirth or m.boolean_value
    return rebirth


def refuse_device_command(raw: bytes, max_bytes: int) -> str:
    """Why a DCMD is refused (a device of this node has no writable metric): the reason,
    naming the metric when the payload can be read; CommandRefused when it cannot."""
    p = _decode(raw, max_bytes)
    names = [m.name if m.HasField("name") else f"alias {m.alias}" for m in p.metrics]
    return (f"unknown metric {names[0][:100]!r} (edgerun's devices take no commands)"
            if names else "a DCMD without metrics")


def _decode(raw: bytes, max_bytes: int) -> Any:
    if len(raw) > max_bytes:
        raise CommandRefused(f"{len(raw)} bytes, more than the {max_bytes} a command may have")
    p = pb.Payload()
    try:
        p.ParseFromString(raw)
    except Exception as e:  # protobuf's DecodeError, or worse on hostile bytes
        raise CommandRefused(f"not a Sparkplug B payload: {type(e).__name__}") from e
    return p
