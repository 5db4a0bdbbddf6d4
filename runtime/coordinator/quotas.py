"""Fair shares of the coordinator's store: no device can cost another one its stored data.

The store counts, per device, the logical bytes it holds (`device_usage`: results, health
with its timeline row, events; the byte sizes below are the rows' own contents, so the sum
is what the devices sent, not what the database spends on it). The size cap, turned into a
logical budget with the store's measured overhead (`budget`), is shared equally among the
devices holding data; a device may go past its share only while the store has room
(borrowing), and what it borrowed is what retention takes back first (`reclaim_order`):
another device's data is never deleted to make room while any device is over its share.

Everything here is pure: store.py applies it inside its transactions, on SQLite and
PostgreSQL alike.
"""

from __future__ import annotations

from collections.abc import Mapping

# The logical size of one stored row, in SQL (the same on SQLite and PostgreSQL) and in
# Python (for rows about to be written): its text columns' lengths plus 8 bytes a number.
RESULT_BYTES_SQL = "(length(device) + length(stream) + length(boot) + length(body) + 24)"
# a health row (device, t, body) and its timeline row in health_points (device, t and the
# 12 numbers of store.TIMELINE)
HEALTH_BYTES_SQL = "(2 * length(device) + length(body) + 112)"
EVENT_BYTES_SQL = "(length(device) + length(type) + length(body) + 8)"
# the overhead (index pages, free space in pages) is measured, never assumed: below this
# much data the measurement is mostly the empty schema's pages, so it is not taken
MEASURE_MIN_FRACTION = 0.05
MAX_OVERHEAD = 8.0  # a measured ratio is clamped to [1, MAX_OVERHEAD]


def result_bytes(device: str, stream: str, boot: str, body: str) -> int:
    """RESULT_BYTES_SQL of one row, in Python."""
    return len(device) + len(stream) + len(boot) + len(body) + 24


def health_bytes(device: str, body: str) -> int:
    """HEALTH_BYTES_SQL of one health row and its timeline row."""
    return 2 * len(device) + len(body) + 112


def event_bytes(device: str, kind: str, body: str) -> int:
    """EVENT_BYTES_SQL of one event row."""
    return len(device) + len(kind) + len(body) + 8


def message_bytes(device: str, kind: str, msg: dict, raw: int) -> int:
    """What storing a message of `raw` bytes on the wire charges its device, estimated from
    above without serialising it again: a result message's rows repeat the device, stream
    and boot and add their numbers (RESULT_BYTES_SQL); a health adds its timeline row."""
    if kind == "result":
        per_row = len(device) + len(str(msg.get("stream", ""))) + 24 + len(
            str(msg.get("boot", "")))
        return raw + per_row * len(msg.get("results") or ())
    if kind == "health":
        return raw + 2 * len(device) + 112
    return raw + len(device) + 8 + len(str(msg.get("type", "")))


def overhead(used_bytes: int, logical_bytes: int, cap_bytes: int, before: float) -> float:
    """The store's bytes per logical byte, measured (`before` when there is too little data
    to measure: under MEASURE_MIN_FRACTION of the cap), clamped to [1, MAX_OVERHEAD]."""
    if cap_bytes <= 0 or logical_bytes < cap_bytes * MEASURE_MIN_FRACTION:
        return before
    return min(MAX_OVERHEAD, max(1.0, used_bytes / logical_bytes))


def budget(cap_bytes: int, ratio: float) -> int:
    """The logical bytes the devices may hold together under a cap of `cap_bytes` (0: none)."""
    return int(cap_bytes / ratio) if cap_bytes > 0 else 0


def share(budget_bytes: int, devices: int) -> float:
    """One device's fair share of the budget among `devices` holding data."""
    return budget_bytes / max(1, devices)


def admit(device_bytes: int, incoming: int, total: int, devices: int, budget_bytes: int,
          margin: float) -> str | None:
    """Whether a device holding `device_bytes` may store `incoming` more, with `total` held
    by the `devices` (this one counted) holding data: None when it may, else why not.

    Within its share it always may (retention then makes room from whoever is over theirs);
    past it only while the store holds less than the budget plus `margin` of it (what a
    device over its share borrows until the retention pass this wakes takes it back)."""
    if budget_bytes <= 0 or incoming <= 0:
        return None
    mine = share(budget_bytes, devices)
    if device_bytes + incoming <= mine or total < budget_bytes * (1 + margin):
        return None
    return (f"over its share of the store: it holds {device_bytes / 2**20:.2f} MB, its share "
            f"is {mine / 2**20:.2f} MB (max_store_mb shared by {devices} devices) and the "
            "store is full; it may re-send once retention has made room")


def over_share(usage: Mapping[str, int], budget_bytes: int) -> list[tuple[str, int]]:
    """(device, bytes over its share) of every device past its share, most over first, ties
    by name (the order retention reclaims in)."""
    held = {d: b for d, b in usage.items() if b > 0}
    mine = share(budget_bytes, len(held))
    over = [(d, int(b - mine)) for d, b in held.items() if b > mine]
    return sorted(over, key=lambda x: (-x[1], x[0]))
