"""Query strings and bodies of the coordinator API, validated: integers without sign or
exponent, `STREAM:SEQ` cursors, the results and health-history parameters. Pure functions;
errors are BadRequest with the HTTP status to answer (runtime/coordinator/routes.py)."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl

MAX_LIMIT = 10_000
INT = re.compile(r"^[0-9]{1,18}$")  # no sign, no exponent, below 2^62
_RESULT_PARAMS = {"cursor", "limit"}


class BadRequest(ValueError):
    """A request the API refuses; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def parse_int(name: str, text: str, lo: int, hi: int) -> int:
    """A decimal integer in [lo, hi]; anything else (sign, exponent, huge) is a BadRequest."""
    if not INT.match(text) or not lo <= int(text) <= hi:
        raise BadRequest(f"{name} must be an integer in [{lo}, {hi}], got {text[:40]!r}")
    return int(text)


def parse_cursor(text: str) -> tuple[str, int]:
    """`STREAM:SEQ` -> (stream, seq)."""
    stream, sep, seq = text.rpartition(":")
    if not sep or not stream or len(stream) > 128:
        raise BadRequest(f"cursor must be STREAM:SEQ as returned in `next`, got {text[:40]!r}")
    return stream, parse_int("cursor seq", seq, 0, 2**62 - 1)


def result_query(query: str) -> tuple[tuple[str, int] | None, int]:
    """Validated (cursor, limit) of a results request."""
    pairs = parse_qsl(query, keep_blank_values=True)
    names = [k for k, _ in pairs]
    unknown = set(names) - _RESULT_PARAMS
    if unknown:
        hint = " (`after` is gone: page with the `next` cursor)" if "after" in unknown else ""
        raise BadRequest(f"unknown query parameter(s) {sorted(unknown)}{hint}")
    if len(names) != len(set(names)):
        raise BadRequest("a query parameter is repeated")
    params = dict(pairs)
    cursor = parse_cursor(params["cursor"]) if "cursor" in params else None
    limit = parse_int("limit", params["limit"], 1, MAX_LIMIT) if "limit" in params else 1000
    return cursor, limit


def health_query(query: str, now: float | None = None) -> tuple[float, float, int]:
    """Validated (since, until, limit) of a health history request (whole seconds since the
    epoch; since defaults to a day before now, until to now, limit to 5000)."""
    import time

    now = time.time() if now is None else now
    pairs = parse_qsl(query, keep_blank_values=True)
    names = [k for k, _ in pairs]
    if unknown := set(names) - {"since", "until", "limit"}:
        raise BadRequest(f"unknown query parameter(s) {sorted(unknown)}")
    if len(names) != len(set(names)):
        raise BadRequest("a query parameter is repeated")
    params = dict(pairs)
    since = parse_int("since", params["since"], 0, 10**10) if "since" in params else now - 86400
    until = parse_int("until", params["until"], 0, 10**10) if "until" in params else now
    limit = parse_int("limit", params["limit"], 1, 20_000) if "limit" in params else 5000
    return float(since), float(until), limit
