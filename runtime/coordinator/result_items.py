"""A result message the schema refuses, taken item by item (pure: no store, no clock).

A results message carries one device stream's results seqs n..m. Refused whole, one bad item
(a frame stamped t = -7.9e-05 by a clock stepped to 1970, a label too long, a field a later
device version types otherwise) was a poison pill: nothing of the message was stored, the ack
stopped at n, and the device re-sent the same message for ever. So a result message whose
envelope is sound (v, stream, boot, floor, a results array) but whose items are not all valid
is split: its valid items are stored as any, and each refused item with a usable seq becomes
a *refusal* — quarantined with its reason, and its seq counts as done for the ack (the store
keeps a marker row under the same (device, stream, seq) key: ingest.py), a counted loss,
never a silent gap. The rule, as `split` decides it:

- not JSON, too big or too deep, not an object: refused whole (nothing can be trusted);
- the envelope fails its schema (a version we do not speak, a bad stream or floor): whole;
- no item has a usable seq (an integer in [1, 2^62)): whole (nothing could be acked);
- otherwise each item with a usable seq is valid (stored) or refused (its seq done, counted);
  an item without one is refused and counted, but no seq can be marked for it.

docs/telemetry.md ("Acks") says the same for the device's side.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fastjsonschema

from runtime.wire import payloads, safejson

_RESULT = payloads.SCHEMAS["result"]
ITEM_SCHEMA: dict[str, Any] = _RESULT["properties"]["results"]["items"]
# the result message with its items unchecked: what must hold for items to be taken one by one
ENVELOPE_SCHEMA: dict[str, Any] = {
    **_RESULT, "properties": {**_RESULT["properties"], "results": {
        **{k: v for k, v in _RESULT["properties"]["results"].items() if k != "items"}}}}
_checks: dict[str, Callable[[Any], Any]] = {}  # compiled: yes or no, 3-5 µs an item
_explainers: dict[str, Any] = {}  # jsonschema's: why not (made once: ~1 ms each)
EXPLAINED = 10  # refused items of one message explained by jsonschema
# schema errors of one refused item jsonschema reads to explain it: an item with 300 bad
# boxes has 1,800, and reading them all cost 22 ms an item (64: 1 ms)
EXPLAIN_ERRORS = 64


@dataclass(frozen=True)
class Split:
    """A result message taken item by item: `msg` (the envelope with its valid items only,
    possibly none), `refused` (seq, reason, bytes) of each refused item with a usable seq,
    and `unseq` (reason, bytes) of each refused item without one."""

    msg: dict
    refused: tuple[tuple[int, str, int], ...]
    unseq: tuple[tuple[str, int], ...] = ()


def decode(raw: bytes) -> Split:
    """A result payload admitted item by item (the coordinator's admission): `Split(msg)`
    with nothing refused when it is valid whole (at payloads.decode's cost), its valid items
    and refusals when only some items fail; raises payloads.PayloadError, explained, when it
    must be refused whole. Only a message refused whole is explained whole (jsonschema over
    every item: 2.9 ms for 100 items, wasted on one that is split)."""
    try:
        obj = safejson.loads(raw, max_bytes=payloads.MAX_BYTES["result"])
    except safejson.JsonRejected as e:
        raise payloads.PayloadError(f"result: {e}") from None
    obj = integral(obj)
    if _ok("whole", _RESULT, obj):
        return Split(obj, ())
    got = split_obj(obj)
    if got is None:
        payloads.check("result", obj)  # raises, saying why
        raise payloads.PayloadError("result: refused")  # (the two validators disagreed)
    return got


def split(raw: bytes) -> Split | None:
    """The item-wise reading of a result message the whole-message schema refused (see the
    module docstring), or None when it must be refused whole."""
    try:
        obj = safejson.loads(raw, max_bytes=payloads.MAX_BYTES["result"])
    except safejson.JsonRejected:
        return None
    return split_obj(integral(obj))


def split_obj(obj: Any) -> Split | None:
    """`split` of a parsed payload."""
    if _why("envelope", ENVELOPE_SCHEMA, obj) is not None:
        return None
    good, refused, unseq = [], [], []
    for item in obj["results"]:
        size = len(json.dumps(item, separators=(",", ":"), default=str))
        # the first EXPLAINED refused items of a message by jsonschema (~50 µs each), the
        # rest by the compiled validator's own words (10,000 bad items explained: 0.5 s)
        why = _why("item", ITEM_SCHEMA, item, len(refused) + len(unseq) < EXPLAINED)
        seq = item.get("seq") if isinstance(item, dict) else None
        if why is None:
            good.append(item)
        elif usable_seq(seq):
            refused.append((seq, why, size))
        else:
            unseq.append((why, size))
    if not refused and not unseq:  # (the whole schema refused it: never split it then)
        return None
    if not good and not refused:
        return None
    return Split({**obj, "results": good}, tuple(refused), tuple(unseq))


def integral(obj: Any) -> Any:
    """A result payload with its `floor` and items' `seq` written as integral numbers (2.0,
    1e2) made ints, as the schema reads them (draft 2020-12: 2.0 is an integer): a float
    seq passed the schema, then failed ingest's row (an int key), so the message was
    refused whole and re-sent for ever. Anything else is returned as it is."""
    if not isinstance(obj, dict) or not isinstance(items := obj.get("results"), list):
        return obj
    if _whole(obj.get("floor")):
        obj = {**obj, "floor": int(obj["floor"])}
    if any(isinstance(r, dict) and _whole(r.get("seq")) for r in items):
        obj = {**obj, "results": [{**r, "seq": int(r["seq"])} if isinstance(r, dict)
                                  and _whole(r.get("seq")) else r for r in items]}
    return obj


def _whole(x: Any) -> bool:
    """Whether `x` is a float that writes an integer (its int is what the schema checks)."""
    return isinstance(x, float) and x.is_integer()


def usable_seq(seq: Any) -> bool:
    """Whether `seq` can key a result (an int, not a bool, in [1, 2^62))."""
    return isinstance(seq, int) and not isinstance(seq, bool) and 1 <= seq <= payloads.SEQ_MAX


def _compiled(name: str, schema: dict[str, Any]) -> Callable[[Any], Any]:
    """`schema` compiled (fastjsonschema, on first use): raises on a refused object."""
    fn = _checks.get(name)
    if fn is None:
        fn = _checks[name] = fastjsonschema.compile(schema, use_default=False,
                                                    use_formats=False)
    return fn


def _ok(name: str, schema: dict[str, Any], obj: Any) -> bool:
    """Whether `obj` matches `schema` (the compiled check)."""
    try:
        _compiled(name, schema)(obj)
        return True
    except Exception:  # the generated code failing on odd input is a refusal too
        return False


def _why(name: str, schema: dict[str, Any], obj: Any, explain: bool = True) -> str | None:
    """None when `obj` matches `schema`, else where and why not: jsonschema's best match
    when `explain`, else the compiled validator's own message."""
    try:
        _compiled(name, schema)(obj)
        return None
    except fastjsonschema.JsonSchemaValueException as e:
        fast = f"at {'/'.join(str(p) for p in (e.path or [])[1:]) or '(top level)'}: " \
               f"{e.message[:300]}"
    except Exception as e:
        fast = f"cannot be validated: {type(e).__name__}"
    if not explain:
        return fast
    try:
        from jsonschema.exceptions import best_match

        explainer = _explainers.get(name)
        if explainer is None:
            import jsonschema

            explainer = _explainers[name] = jsonschema.Draft202012Validator(schema)
        error = best_match(itertools.islice(explainer.iter_errors(obj), EXPLAIN_ERRORS))
    except Exception:
        return fast
    if error is None:
        return fast
    where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
    return f"at {where}: {error.message[:300]}"
