"""Topic tree and versioned payload schemas (v1), validated on both ends.

The schemas are JSON Schema (draft 2020-12) so other languages on the fleet side can use them
as they are; `edgerun schemas` prints them and docs/telemetry.md describes each field. A message
that fails validation is quarantined and counted by the receiver, never raised into its loop.
Integers are bounded (seqs in [0, 2^62), times below T_MAX) so nothing out of range reaches
SQLite; ids that become SQL values or topic levels are restricted to `A-Z a-z 0-9 _ . -`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import fastjsonschema

from runtime.wire import safejson

VERSION = 1
KINDS = ("state", "result", "health", "event", "cmd", "cmd/reply", "ack", "result/each")
PREFIX = "edgerun/v1"

SEQ_MAX = (1 << 62) - 1  # seqs and floors live in [0, 2^62): far from SQLite's 2^63 limit
T_MAX = 1e10  # seconds since the epoch (year 2286): anything later is a forgery or a bug
# The furthest a sleep's announced wake is believed (the device's [sleep] max_sleep_s may not
# exceed it): further is a device clock gone wrong or a hostile health (coordinator/fleet.py,
# wire/health_history.py)
LONGEST_SLEEP_S = 7 * 86400.0

_ID = {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"}
_T = {"type": "number", "minimum": 0, "maximum": T_MAX}
_V = {"const": VERSION}
_STR = {"type": "string", "maxLength": 4096}
_SHORT = {"type": "string", "maxLength": 256}
_NUM = {"type": "number"}
_NUM_OR_NULL = {"type": ["number", "null"]}
_COUNT = {"type": "integer", "minimum": 0, "maximum": SEQ_MAX}
_COUNT_OR_NULL = {"type": ["integer", "null"], "minimum": 0, "maximum": SEQ_MAX}
_SEQ = {"type": "integer", "minimum": 1, "maximum": SEQ_MAX}
_BOOL = {"type": "boolean"}
# When a message was made by a clock that may be wrong (runtime/wire/clock.py, docs/clocks.md):
# synced or not, the kernel's boot id, CLOCK_BOOTTIME in seconds. Optional everywhere: a
# device of an older version sends none and its times are taken as they are.
_CLK = {"type": "object", "required": ["sync", "kb", "bt"], "additionalProperties": False,
        "properties": {"sync": _BOOL, "kb": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
                       "bt": {"type": "number", "minimum": 0, "maximum": T_MAX},
                       # set by the coordinator that placed the message: the time the device
                       # claimed (its `t` is then the placed one)
                       "claimed": {"type": "number"}}}


def _obj(props: dict[str, Any], required: tuple[str, ...] = (), extra: Any = False
         ) -> dict[str, Any]:
    """An object schema; `extra` is the schema of undeclared members (False: none allowed)."""
    return {"type": "object", "properties": props, "required": list(required),
            "additionalProperties": extra}


# Health: every field Daemon.health() sends, typed (fleet alerts read these). Closed objects
# wherever the daemon's own code fixes the keys; counters and backend details stay open but
# typed. A field the daemon starts sending must be declared here first (a test checks).
_HEALTH = _obj({
    "v": _V, "t": _T, "boot": _ID, "uptime_s": {"type": "number", "minimum": 0},
    "clk": _CLK,
    # the clock's state (runtime/wire/clock.py Clock.health): implausible readings (1970,
    # past 2100) and steps of the wall clock counted
    "clock": _obj({"state": {"enum": ["synced", "unsynced", "implausible"]}, "reason": _STR,
                   "implausible_total": _COUNT, "jumps_total": _COUNT, "last_jump_s": _NUM}),
    "temp_c": _NUM_OR_NULL, "passive_trip_c": _NUM_OR_NULL, "throttled": _BOOL,
    "battery_frac": _NUM_OR_NULL, "harvest_w": _NUM_OR_NULL,
    "sensor_problems": {"type": "array", "maxItems": 64, "items": _STR},
    "model": _SHORT, "choice": _SHORT, "choice_reason": _STR,
    "model_version": _SHORT,  # the model store's name@version; "" = the configured model
    "probation": {"type": ["object", "null"], "properties": {
        "version": {"type": ["string", "null"], "maxLength": 256},
        "state": {"enum": ["pending", "passed", "failed", "rolled_back"]},
        "reasons": {"type": "array", "maxItems": 16, "items": _STR},
        "frames": _COUNT, "errors": _COUNT, "p95_ms": _NUM, "energy_mj": _NUM,
        "shadow_compared": _COUNT, "agreement": _NUM,
        # the swapped model's own per-inference target its p95 was judged against
        "target_ms": _NUM}, "additionalProperties": False},
    "rung": {"type": "integer", "minimum": 0, "maximum": 10_000},
    "rungs": {"type": "integer", "minimum": 0, "maximum": 10_000},
    "accuracy": _NUM_OR_NULL, "energy_mj": _NUM_OR_NULL, "energy_source": _SHORT,
    "rung_energy_mj": _NUM_OR_NULL, "power_w": _NUM_OR_NULL,
    "governor": _obj({"policy": _SHORT, "level": {"type": ["integer", "string", "null"]},
                      "budget_w": _NUM_OR_NULL, "reason": _STR, "enabled": _BOOL,
                      "disabled_reason": {"type": ["string", "null"], "maxLength": 4096},
                      "temp_filtered_c": _NUM_OR_NULL, "slope_c_per_min": _NUM_OR_NULL,
                      "physics_bounded": _BOOL,
                      "refused": {"type": ["string", "null"], "maxLength": 4096}}),
    "rate_cap_hz": _NUM_OR_NULL, "operator_rate_hz": _NUM_OR_NULL,
    # the box's energy per frame (power/box_energy.py): every stage + the idle floor's share,
    # the model's share beside it; null with `reason` where nothing could be measured
    "box_energy": _obj({
        "box_mj": _NUM_OR_NULL, "model_mj": _NUM_OR_NULL, "idle_mj": _NUM_OR_NULL,
        "stages_mj": _obj({s: _NUM_OR_NULL for s in (
            "capture", "decode", "crop", "preprocess", "infer", "postprocess", "persist",
            "publish")}),
        "source": _SHORT, "split": {"type": ["string", "null"], "maxLength": 4096},
        "frames": _COUNT, "window_s": _NUM,
        "reason": {"type": ["string", "null"], "maxLength": 4096},
        "unmeasured": {"type": "array", "maxItems": 16, "items": _SHORT},
        "meter_lost": _STR}),
    # each enabled integration's thread alive (sparkplug, opcua, modbus): false once it died
    "integrations": {**_obj({}, extra=_BOOL), "maxProperties": 8,
                     "propertyNames": {"maxLength": 64}},
    # a Jetson's INA3221 rails one by one (power/ina3221.py `report`); null: none named
    "power_rails": {"type": ["object", "null"], "properties": {
        "watts": {**_obj({}, extra=_NUM_OR_NULL), "maxProperties": 8,
                  "propertyNames": {"maxLength": 64}},
        "missing": {"type": "array", "maxItems": 8, "items": _SHORT},
        "resolution": {"type": ["string", "null"], "maxLength": 4096},
        "reason": {"type": ["string", "null"], "maxLength": 4096}},
        "additionalProperties": False},
    "pipeline": _obj({"rate_hz": _NUM_OR_NULL,
                      "latency_ms": _obj({"p50": _NUM_OR_NULL, "p95": _NUM_OR_NULL}),
                      "frames_bad": _obj({}, extra=_COUNT),
                      # results per label since start (at most 256 labels + "_other")
                      "labels": {**_obj({}, extra=_COUNT), "maxProperties": 257,
                                 "propertyNames": {"maxLength": 256}},
                      # per source (runtime/frames/multisource.py): name -> state, rate, e2e p95,
                      # frames waiting, and its counters
                      "sources": {"type": "object", "maxProperties": 64,
                                  "propertyNames": _ID, "additionalProperties": _obj(
                                      {"state": {"enum": ["opening", "running", "failed",
                                                          "ended"]},
                                       "rate_hz": _NUM, "e2e_p95_ms": _NUM_OR_NULL,
                                       "backlog": _COUNT,
                                       # its outage now (s so far) and the last one's length
                                       "down_s": _NUM_OR_NULL, "last_gap_s": _NUM_OR_NULL,
                                       # its model, the variant running it, tiles per frame
                                       "model": _SHORT, "variant": _SHORT, "tiles": _COUNT},
                                      extra=_COUNT)}},
                     extra=_COUNT),  # the pipeline's counters (frames, results, inline...)
    "slo": _obj({"target_ms": _NUM_OR_NULL, "compliance": _NUM_OR_NULL,
                 "of": {"enum": ["inference", "end_to_end"]}}),
    # each model the sources use (key "" = the [model] section's) and, with several, the
    # box's rung on their joint ladder (runtime/choice/joint.py, docs/sources.md)
    "models": {"type": "array", "maxItems": 65, "items": _obj({
        "key": _SHORT, "model": _SHORT, "choice": _SHORT,
        "rung": {"type": "integer", "minimum": 0, "maximum": 10_000},
        "rungs": {"type": "integer", "minimum": 0, "maximum": 10_000},
        "accuracy": _NUM_OR_NULL, "rung_energy_mj": _NUM_OR_NULL, "target_ms": _NUM_OR_NULL,
        "infer_hz": _NUM, "power_w": _NUM_OR_NULL,
        "sources": {"type": "array", "maxItems": 64, "items": _ID}, "reason": _STR,
        # what its first frames looked like when degenerate (runtime/engine/sanity.py)
        "blind": {"type": ["string", "null"], "maxLength": 4096}})},
    "box": _obj({"rung": {"type": "integer", "minimum": 0, "maximum": 10_000},
                 "rungs": {"type": "integer", "minimum": 0, "maximum": 10_000}}),
    # bytes the daemon writes to disk a day (its /proc/self/io write_bytes over `window_s`),
    # its card's (the state directory's block device, every writer) and a card of
    # [storage] rated_tbw's life at the card's rate, else the daemon's (runtime/device/wear.py)
    "storage": _obj({"write_bytes_per_day": _COUNT_OR_NULL,
                     "card_write_bytes_per_day": _COUNT_OR_NULL, "window_s": _NUM,
                     "rated_tbw": _NUM_OR_NULL, "life_days": _NUM_OR_NULL}),
    "backlog": _obj({"results_held": _COUNT, "bytes": _COUNT, "oldest_seq": _COUNT_OR_NULL,
                     "evicted_total": _COUNT,
                     # the disk refuses writes: what waits in memory (telemetry/held.py)
                     "disk_full": _BOOL, "held_in_memory": _COUNT, "held_bytes": _COUNT,
                     "refused_full_total": _COUNT,
                     # damaged lines the result log skipped at start (their results lost)
                     "log_damaged_bytes": _COUNT}),
    "mqtt": _obj({"connected": _BOOL, "acked_seq": _COUNT, "resends": _COUNT,
                  "commands_ok": _COUNT, "commands_refused": _COUNT, "quarantined": _COUNT,
                  "acks_refused": _COUNT, "connects": _COUNT, "takeovers": _COUNT,
                  "published_results": _COUNT,
                  "protocol": _SHORT, "client_id": _SHORT}),
    "devices": {"type": "array", "maxItems": 64,
                "items": _obj({"backend": _SHORT, "id": _SHORT, "name": _SHORT},
                              extra={"type": ["string", "number", "boolean", "null"]})},
    "preprocess": {"type": "object", "maxProperties": 64,
                   "additionalProperties": {"type": "array", "maxItems": 16, "items": _obj(
                       # the chosen row says why (runtime/engine/preprocessing.py)
                       {"path": _SHORT, "ms": _NUM, "mj": _NUM, "chosen": _BOOL,
                        "why": _SHORT})}},
    "simulated": _obj({"t": _NUM, "ambient_c": _NUM, "elapsed_s": _NUM,
                       "critical_trips": _COUNT, "throttled_min": _NUM, "good": _NUM,
                       "good_weighted": _NUM, "rung_changes": _COUNT, "energy_wh": _NUM,
                       "suspended_h": _NUM, "suspends": _COUNT,
                       "battery_frac": _NUM_OR_NULL,
                       # the lockstep pace (power/simclock.py): target, achieved, slowed
                       "speed": _NUM, "speed_x": _NUM_OR_NULL, "slowed": _BOOL,
                       "slowdowns": _COUNT,
                       # the hottest the simulated die got; simulated seconds per rung (by
                       # variant id, "" while none ran): the demo's closing summary
                       "die_max_c": _NUM,
                       "rung_s": {"type": "object", "maxProperties": 64,
                                  "propertyNames": {"maxLength": 256},
                                  "additionalProperties": _NUM}}),
    # duty cycling (runtime/device/sleep.py, docs/sleep.md)
    "sleep": _obj({"mode": {"enum": ["stay_up", "sleep", "disabled"]}, "period_s": _NUM_OR_NULL,
                   "per_hour": _NUM_OR_NULL, "requested_per_hour": _NUM_OR_NULL,
                   "break_even_s": _NUM_OR_NULL, "average_w": _NUM_OR_NULL,
                   "over_budget": _BOOL, "wakes": _COUNT, "phase": _SHORT, "reason": _STR,
                   "next_wake": {"type": ["number", "null"], "minimum": 0, "maximum": T_MAX},
                   "last_slept_s": _NUM_OR_NULL}),
}, required=("v", "t", "boot"))

# A detector result's boxes: centre x, y, width, height normalised to the frame (0..1).
_UNIT = {"type": "number", "minimum": 0, "maximum": 1}
_BOXES = {"type": "array", "maxItems": 300, "items": _obj(
    {"label": _SHORT, "score": _NUM, "x": _UNIT, "y": _UNIT, "w": _UNIT, "h": _UNIT},
    required=("label", "score", "x", "y", "w", "h"))}

SCHEMAS: dict[str, dict[str, Any]] = {
    "state": {
        "type": "object",
        "required": ["v", "online", "boot", "t"],
        "properties": {
            "v": _V, "online": _BOOL, "boot": _ID, "t": _T, "clk": _CLK,
            "stream": _ID, "versions": {"type": "object", "maxProperties": 32,
                                        "additionalProperties": _SHORT},
            "model": _SHORT, "choice": _SHORT, "reason": _STR,
            # announced before a suspend (runtime/device/sleep.py): offline on purpose until wake_at
            "asleep": _BOOL, "wake_at": _T,
            "model_version": _SHORT,  # the model store's name@version ("" = configured)
        },
    },
    "result": {
        "type": "object",
        "required": ["v", "stream", "boot", "floor", "results"],
        "properties": {
            "v": _V, "stream": _ID, "boot": _ID, "floor": _SEQ,
            "results": {
                "type": "array", "minItems": 1, "maxItems": 10_000,
                "items": {
                    "type": "object", "required": ["seq", "t"],
                    "properties": {"seq": _SEQ, "t": _T, "boot": _ID, "clk": _CLK,
                                   "source": _ID,  # the [source]/[[sources]] name
                                   "model": _SHORT,  # the model that inspected it
                                   "variant": _SHORT, "rung": {"type": "integer"},
                                   "label": _SHORT, "score": _NUM,
                                   # a detector's (docs/detectors.md): best first, normalised
                                   "boxes": _BOXES,
                                   "counts": {**_obj({}, extra=_COUNT), "maxProperties": 300,
                                              "propertyNames": {"maxLength": 256}}},
                },
            },
        },
    },
    "health": _HEALTH,
    # One result a message (`[telemetry] result_per_message`), for Node-RED and Home
    # Assistant; the coordinator does not subscribe to it (the batched `result` is durable).
    "result/each": {
        "type": "object",
        "required": ["v", "stream", "seq", "t", "boot"],
        "properties": {"v": _V, "stream": _ID, "seq": _SEQ, "t": _T, "boot": _ID, "clk": _CLK,
                       "variant": _SHORT, "rung": {"type": "integer"}, "label": _SHORT,
                       "score": _NUM, "ref": _STR},
    },
    "event": {
        "type": "object",
        "required": ["v", "t", "type"],
        "properties": {"v": _V, "t": _T, "type": _ID, "clk": _CLK,
                       "severity": {"enum": ["info", "warning", "critical"]}},
    },
    "cmd": {
        "type": "object",
        "required": ["v", "id", "device", "cmd", "args", "issued_at", "expires_at", "key_id",
                     "sig"],
        "additionalProperties": False,
        "properties": {
            "v": _V, "id": {"type": "string", "minLength": 8, "maxLength": 64},
            "device": _ID, "cmd": _SHORT, "args": {"type": "object"},
            "issued_at": _T, "expires_at": _T, "key_id": _SHORT,
            "sig": _SHORT,
        },
    },
    "cmd/reply": {
        "type": "object",
        "required": ["v", "id", "ok", "status", "t"],
        "properties": {"v": _V, "id": {"type": ["string", "null"], "maxLength": 64},
                       "ok": _BOOL, "status": {"enum": ["done", "accepted", "refused", "rejected"]},
                       "reason": _STR, "t": _T, "data": {},
                       "device": _ID, "key_id": _SHORT, "sig": _SHORT},
    },
    "ack": {
        "type": "object",
        "required": ["v", "stream", "seq", "from"],
        "properties": {"v": _V, "stream": _ID,
                       "seq": {"type": "integer", "minimum": 0, "maximum": SEQ_MAX},
                       "from": _SEQ},
    },
}


def interpreter(kind: str) -> Any:
    """The interpreting validator (jsonschema) of `kind`, made on first use: it only explains
    a refused payload, and importing it cost a daemon 6.3 MB of its idle RSS."""
    v = _INTERPRETERS.get(kind)
    if v is None:
        import jsonschema

        v = _INTERPRETERS[kind] = jsonschema.Draft202012Validator(SCHEMAS[kind])
    return v


_INTERPRETERS: dict[str, Any] = {}
# The same SCHEMAS compiled into Python code (fastjsonschema), made on first use of a kind:
# the interpreting validator cost 54-88 µs a message, the largest part of a coordinator's
# ingest (docs/fleet-scale.md); the compiled one 3-5 µs. It only says yes or no: the
# interpreter still writes the message (a path into the payload) of every refused one.
_COMPILED: dict[str, Callable[[Any], Any]] = {}


def _compiled(kind: str) -> Callable[[Any], Any]:
    fn = _COMPILED.get(kind)
    if fn is None:  # two threads compiling the same kind at once is harmless
        # no defaults filled in (the payload is never changed), no formats (none declared;
        # the interpreter checks none either)
        fn = _COMPILED[kind] = fastjsonschema.compile(SCHEMAS[kind], use_default=False,
                                                      use_formats=False)
    return fn


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


MAX_BYTES = {"result": 1 << 20, "health": 64 << 10, "state": 16 << 10, "event": 16 << 10,
             "cmd": 8 << 10, "cmd/reply": 64 << 10, "ack": 1 << 10, "result/each": 64 << 10}
# The largest MQTT packet a coordinator takes (its MQTT 5 Maximum Packet Size): the largest
# payload above plus room for the fixed header, the topic and properties. The broker drops
# a larger message for it instead of making it receive and hold one of up to 256 MB.
MAX_PACKET = max(MAX_BYTES.values()) + (16 << 10)


def decode(kind: str, raw: bytes, max_bytes: int | None = None) -> dict:
    """Parse (size- and depth-limited, see safejson) and validate a payload of `kind`;
    raises PayloadError saying what is wrong. Never raises anything else."""
    limit = MAX_BYTES[kind] if max_bytes is None else max_bytes
    try:
        obj = safejson.loads(raw, max_bytes=limit)
    except safejson.JsonRejected as e:
        raise PayloadError(f"{kind}: {e}") from None
    check(kind, obj)
    return obj


def check(kind: str, obj: Any) -> None:
    """Validate a decoded payload; raises PayloadError naming the failing field.

    The compiled validator decides; a payload it refuses is explained by the interpreting
    one (jsonschema's best match and its path). Where the two differ the stricter wins: the
    compiled `pattern` anchors `$` at the very end (`\\Z`), the interpreter lets one trailing
    newline through (Python's `$`), so an id "dev1\\n" is refused
    (tests/wire/test_payload_conformance.py).
    """
    try:
        _compiled(kind)(obj)
        return
    except fastjsonschema.JsonSchemaValueException as e:
        fast: Exception = e
    except Exception as e:  # the generated code failing on odd input is still a bad payload
        fast = e
    _explain(kind, obj, fast)


def _explain(kind: str, obj: Any, fast: Exception) -> None:
    """Raise the PayloadError for a payload the compiled validator refused."""
    try:
        from jsonschema.exceptions import best_match

        error = best_match(interpreter(kind).iter_errors(obj))
    except Exception as e:  # the validator itself failing on odd input is still a bad payload
        raise PayloadError(f"{kind}: cannot be validated: {type(e).__name__}") from None
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise PayloadError(f"{kind}: at {where}: {error.message}")
    if isinstance(fast, fastjsonschema.JsonSchemaValueException):
        where = "/".join(str(p) for p in (fast.path or [])[1:]) or "(top level)"
        raise PayloadError(f"{kind}: at {where}: {fast.message[:300]}")
    raise PayloadError(f"{kind}: cannot be validated: {type(fast).__name__}")


def encode(kind: str, obj: dict) -> bytes:
    """Validate and serialise a payload we are about to send (our own bugs surface here)."""
    check(kind, obj)
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
