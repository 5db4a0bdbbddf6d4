"""Fair shares of the coordinator's store: no device can cost another one its stored data.

The store counts, per device and pool (results; health with its timeline row; events), the
logical bytes it holds (`pool_usage`; the byte sizes below are the rows' own contents, so the
sum is what the devices sent, not what the database spends on it). The size cap, turned into
a logical budget with the store's measured overhead (`budget`), is shared equally among the
devices holding data, and each device's share among its pools by POOLS. While the store has
room anyone may borrow past a quota; in a full store a device past its quota of a pool sheds
its own oldest rows of that pool before writing (`admit`), and retention takes back what was
borrowed pool by pool, most over first (`over_share`): a pool within its quota is never taken
from, so another device's data is never deleted to make room for one device's flood.

Everything here is pure: the store applies it inside its transactions (budget.py admits and
reclaims by it, pruning.py retains by it), on SQLite and PostgreSQL alike.
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

# The pools: every kind of row the store keeps of a device, each with its quota, the weight
# here times the device's equal share of the budget (a policy, not a measurement: results are
# what devices exist for; health is the dashboard's history; events are rare). A pool past
# its quota is what retention and admission take from, and only from that device.
POOLS = {"results": 0.6, "health": 0.3, "events": 0.1}
POOL_BYTES_SQL = {"results": RESULT_BYTES_SQL, "health": HEALTH_BYTES_SQL,
                  "events": EVENT_BYTES_SQL}


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


def pool_of(kind: str) -> str | None:
    """The pool a message of `kind` is charged to (None: not charged, a device's state)."""
    return {"result": "results", "health": "health", "event": "events"}.get(kind)


def pool_share(budget_bytes: int, devices: int, pool: str) -> float:
    """One device's quota of one pool: its share of the budget times the pool's weight."""
    return share(budget_bytes, devices) * POOLS[pool]


def admit(pool_bytes: int, incoming: int, total: int, devices: int, budget_bytes: int,
          pool: str) -> int:
    """Admission before write: how many of its own bytes of `pool` a device holding
    `pool_bytes` there must shed before `incoming` more is written, with `total` held by
    the `devices` (this one counted) holding data; 0 when it is written as is.

    While the store has room anyone may write (borrowing past its quota). In a full store a
    device within its quota of the pool still writes (retention takes back what those over
    theirs borrowed); one past it sheds its own oldest rows of that pool: enough to bring
    the store back to its budget, never more than what takes it past its quota. So no
    device's writes push the store past its budget, and none sheds for another's."""
    if budget_bytes <= 0 or incoming <= 0 or total + incoming <= budget_bytes:
        return 0
    over = pool_bytes + incoming - pool_share(budget_bytes, devices, pool)
    if over <= 0:
        return 0
    return int(min(over, total + incoming - budget_bytes)) + 1


def refusal(device: str, pool: str, pool_bytes: int, budget_bytes: int, devices: int) -> str:
    """Why a message is refused when its device had too little of `pool` to shed."""
    mine = pool_share(budget_bytes, devices, pool)
    return (f"device {device}: over its quota of {pool} in a full store: it holds "
            f"{pool_bytes / 2**20:.2f} MB of {pool}, its quota is {mine / 2**20:.2f} MB "
            f"(max_store_mb shared by {devices} devices) and nothing of it may be shed; "
            "it may re-send once its rows are acked")


def over_share(usage: Mapping[tuple[str, str], int], budget_bytes: int
               ) -> list[tuple[str, str, int]]:
    """(device, pool, bytes over its quota) of every pool of a device past its quota, most
    over first, ties by name (the order retention reclaims in)."""
    devices = len({d for (d, _), b in usage.items() if b > 0})
    over = [(d, p, int(b - pool_share(budget_bytes, devices, p)))
            for (d, p), b in usage.items() if b > pool_share(budget_bytes, devices, p)]
    return sorted(over, key=lambda x: (-x[2], x[0], x[1]))
