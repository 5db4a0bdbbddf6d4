"""The coordinator store's fair shares (quotas.py) applied: the devices' logical budget under
the store's cap, admission of a batch against it, and the deletes that free a pool.

`pool_usage` keeps each device's logical bytes per pool (results, health, events), charged by
ingest and taken off by every delete here and in pruning.py. With a cap (`set_cap`) a device
past its quota of a pool in a full store sheds its own oldest rows of it before its batch is
written (or the message is refused); retention (pruning.py) reclaims through the same deletes.
The store's bytes per logical byte are measured (quotas.overhead) so the budget follows the
file as it is. docs/fleet-scale.md.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from runtime.coordinator import quotas
from runtime.coordinator.store_rows import Dialect, Inbound, marker_row, query, uncharge

# a device's oldest acked results (device, limit): what admission and retention take first
ACKED_OLDEST = ("SELECT r.device, r.stream, r.seq FROM results r JOIN streams s ON "
                "s.device = r.device AND s.stream = r.stream WHERE r.device = ? AND "
                "r.seq <= s.acked ORDER BY r.received LIMIT ?")


class Budget:
    """The devices' budget in the store and the deletes that keep them to it (see module
    docstring); its deletes run in the transaction they are handed."""

    def __init__(self, d: Dialect):
        self._d = d
        # fair shares (quotas.py): the devices' logical budget, 0 = no cap; set_cap sets it
        self._budget, self._ratio = 0, 1.0
        # set_cap: the cap, the bundle shelf's bytes in it, whether a ratio was measured
        self._cap, self._reserved, self._measured = 0, 0, False
        self.over_budget = False  # the last batch found the devices over their budget
        # rows admission shed before writing, per (device, pool) (read and reset by retention)
        self.shed: Counter = Counter()
        self._batch_shed: Counter = Counter()
        self._shed_lock = threading.Lock()
        self._total = 0  # the devices' logical bytes after the last batch admitted

    def admit(self, db: Any, messages: Sequence[Inbound]
              ) -> tuple[list[int], list[tuple[int, str]]]:
        """(indexes admitted, (index, reason) refused) under the pools of quotas.py, decided
        before anything of the batch is written: a device past its quota of a pool in a full
        store sheds its own oldest rows of that pool first (`_shed`, in this transaction),
        and a message it cannot make room for (its results not yet acked) is refused.
        Everything is admitted when there is no cap. Reads the pools of the batch's devices
        (locked by lock_devices) and the store's total in the storing transaction."""
        if self._budget <= 0:
            return list(range(len(messages))), []
        devices = sorted({m.device for m in messages})
        match, args = self._d.in_list(devices)
        have: Counter = Counter({(d, p): int(b) for d, p, b in db.execute(
            f"SELECT device, pool, bytes FROM pool_usage WHERE device{match}", args).fetchall()})
        total, held = (int(x) for x in db.execute(
            "SELECT COALESCE(SUM(bytes), 0), COUNT(DISTINCT device) FROM pool_usage "
            "WHERE bytes > 0").fetchone())
        holding = {d for (d, _), b in have.items() if b > 0}
        self._batch_shed = Counter()  # added to `shed` once the batch is committed
        admitted, refused = [], []
        for i, m in enumerate(messages):
            pool = quotas.pool_of(m.kind)
            if pool is None:  # a state: one row a device, replaced, not charged
                admitted.append(i)
                continue
            size = self._charge_of(m)
            devices_n = held + (m.device not in holding)
            shed = quotas.admit(have[m.device, pool], size, total, devices_n, self._budget,
                                pool)
            if shed > 0:
                rows, freed = self._shed(db, m.device, pool, shed)
                have[m.device, pool] -= freed
                total -= freed
                self._batch_shed[m.device, pool] += rows
                if freed < shed:
                    refused.append((i, quotas.refusal(m.device, pool, have[m.device, pool],
                                                      self._budget, devices_n)))
                    continue
            admitted.append(i)
            if m.device not in holding:
                holding.add(m.device)
                held += 1
            have[m.device, pool] += size
            total += size
        self.over_budget, self._total = total > self._budget, total
        return admitted, refused

    def committed(self) -> None:
        """The batch admitted last is committed: count what it shed, and measure the store
        again where the budget follows the file."""
        if self._batch_shed:
            with self._shed_lock:
                self.shed.update(self._batch_shed)
            self._batch_shed = Counter()  # told once (a batch with no cap sets none)
        if self._budget > 0 and (self._d.name == "sqlite" or not self._measured):
            # the file's bytes per logical byte move with the rows' mix and with the pages
            # deletes leave part-filled: measured after each batch (three PRAGMAs), so the
            # next batch is admitted against the file as it is, not as the last pass saw it
            self._measure(self._total)

    def _charge_of(self, m: Inbound) -> int:
        """What storing `m` charges its device's pool, from above (results: quotas.py's
        estimate; health and events: exactly, their bodies as stored)."""
        if m.kind == "health":
            return quotas.health_bytes(m.device, json.dumps(m.msg))
        if m.kind == "event":
            return quotas.event_bytes(m.device, str(m.msg.get("type", "")), json.dumps(m.msg))
        markers = 0
        for q, why, _ in m.refused:  # a result's refused items' markers, exactly
            r = marker_row(m.device, str(m.msg.get("stream", "")), q, why, 0.0)
            markers += quotas.result_bytes(r[0], r[1], r[3], r[6])
        return markers + quotas.message_bytes(m.device, m.kind, m.msg, m.size or len(
            json.dumps(m.msg, separators=(",", ":"))))

    def _shed(self, db: Any, device: str, pool: str, need: int) -> tuple[int, int]:
        """Delete `device`'s oldest rows of `pool` inside the storing transaction until `need`
        logical bytes are freed or nothing more may go (results: only acked ones; events:
        never the record of a quarantine); returns (rows, bytes) deleted."""
        rows = freed = 0
        while freed < need:
            per_row = max(1, self.pool_row_bytes(db, device, pool))
            limit = min(2000, (need - freed) // per_row + 1)
            if pool == "results":
                gone = [int(r[3]) for r in self.delete_results(db, ACKED_OLDEST,
                                                               (device, limit))]
            else:
                gone = self.delete_oldest(db, pool, device, limit)
            if not gone:
                break
            rows, freed = rows + len(gone), freed + sum(gone)
        return rows, freed

    def pool_row_bytes(self, db: Any, device: str, pool: str) -> int:
        """The mean logical bytes of a row of `device`'s `pool` (from the maintained counts
        where there are any; else one row's, read)."""
        if pool == "results":
            row = db.execute("SELECT u.bytes, c.n FROM pool_usage u JOIN result_counts c ON "
                             "c.device = u.device WHERE u.device = ? AND u.pool = 'results'",
                             (device,)).fetchone()
            if row and row[1]:
                return int(row[0]) // int(row[1])
        table = "results" if pool == "results" else pool
        row = db.execute(f"SELECT {quotas.POOL_BYTES_SQL[pool]} FROM {table} WHERE device = ? "
                         "LIMIT 1", (device,)).fetchone()
        return int(row[0]) if row else 1

    def delete_oldest(self, db: Any, pool: str, device: str, limit: int) -> list[int]:
        """Delete `device`'s `limit` oldest health rows (with their timeline rows) or events
        (never a `stream_quarantined`: the operator needs it) in `db`; their logical bytes."""
        oc = self._d.order_col
        keep = " AND type <> 'stream_quarantined'" if pool == "events" else ""
        gone = [int(n) for (n,) in db.execute(
            f"DELETE FROM {pool} WHERE {oc} IN (SELECT {oc} FROM {pool} WHERE device = ?{keep} "
            f"ORDER BY t LIMIT ?) RETURNING {quotas.POOL_BYTES_SQL[pool]}",
            (device, limit)).fetchall()]
        if gone and pool == "health":
            db.execute(f"DELETE FROM health_points WHERE {oc} IN (SELECT {oc} FROM "
                       "health_points WHERE device = ? ORDER BY t LIMIT ?)",
                       (device, len(gone)))
        uncharge(db, Counter({(device, pool): sum(gone)}))
        return gone

    def delete_results(self, db: Any, which: str, args: tuple) -> list[tuple]:
        """Delete the results `which` selects (device, stream, seq) inside `db`, with their
        keys (PostgreSQL), counts and usage; the (device, stream, seq, bytes) deleted."""
        gone = [tuple(r) for r in db.execute(
            "DELETE FROM results WHERE (device, stream, seq) IN "
            f"({which}) RETURNING device, stream, seq, {quotas.RESULT_BYTES_SQL}",
            args).fetchall()]
        if gone and self._d.keys_table != "results":
            db.executemany("DELETE FROM result_keys WHERE device=? AND stream=? AND seq=?",
                           [r[:3] for r in gone])
        per = Counter(r[0] for r in gone)
        db.executemany("UPDATE result_counts SET n = n - ? WHERE device = ?",
                       [(n, d) for d, n in sorted(per.items())])
        size: Counter = Counter()
        for r in gone:
            size[r[0], "results"] += int(r[3])
        uncharge(db, size)
        return gone

    def used_bytes(self) -> int:
        """Bytes of the database in use (SQLite: pages minus free pages; PostgreSQL: this
        schema's tables with indexes and TOAST)."""
        return self._d.used_bytes()

    def usage(self) -> dict[str, int]:
        """The logical bytes each device holds (quotas.py; devices holding nothing left out)."""
        return {d: int(b) for d, b in query(
            self._d, "SELECT device, SUM(bytes) FROM pool_usage GROUP BY device "
            "HAVING SUM(bytes) > 0")}

    def pools(self) -> dict[tuple[str, str], int]:
        """The logical bytes of each (device, pool) holding any (quotas.POOLS)."""
        return {(d, p): int(b) for d, p, b in query(
            self._d, "SELECT device, pool, bytes FROM pool_usage WHERE bytes > 0")}

    def size_bytes(self) -> int:
        """The store's size as held against max_store_mb: SQLite, the file's pages in use;
        PostgreSQL, the devices' logical bytes times the overhead measured while the files
        grew, plus the bundle shelf (row deletes there leave space for reuse, never a smaller
        file, so pg_total_relation_size stays at its high-water mark: see set_cap)."""
        if self._d.name == "sqlite":
            return self.used_bytes()
        return int(sum(self.usage().values()) * self._ratio) + self._reserved

    @property
    def budget_bytes(self) -> int:
        """The devices' logical budget (set_cap; 0 = no cap)."""
        return self._budget

    @property
    def overhead(self) -> float:
        """The store's bytes per logical byte as last measured (quotas.overhead)."""
        return self._ratio

    def take_shed(self) -> Counter:
        """The rows admission shed since the last call, per (device, pool); reset."""
        with self._shed_lock:
            out, self.shed = self.shed, Counter()
        return out

    def set_cap(self, max_bytes: int, reserved: int = 0) -> int:
        """Share `max_bytes` (0 = no cap) among the devices from now on (ingest refuses what
        a device over its share sends while the store is full): `reserved` of the store's
        bytes are not the devices' (the bundle shelf). The store's overhead per logical byte
        is measured here (quotas.overhead). Returns the devices' logical budget."""
        self._cap, self._reserved = max(0, max_bytes), reserved
        if max_bytes <= 0:
            self._budget = 0
            return 0
        return self._measure(sum(self.usage().values()))

    def _measure(self, logical: int) -> int:
        """The overhead measured with the devices holding `logical` bytes, and the budget
        from it (set_cap; after each batch on SQLite, and on PostgreSQL until measured)."""
        cap, reserved = max(0, self._cap - self._reserved), self._reserved
        ratio = quotas.overhead(self.used_bytes() - reserved, logical, cap, self._ratio)
        if self._d.name != "sqlite" and self._measured:
            # PostgreSQL's files keep their high-water mark: after deletes the same bytes
            # hold fewer live rows, and measuring them again would raise the ratio until the
            # budget collapsed (every device "over its share"). The lowest ratio measured is
            # the one of rows packed as inserted; later inserts reuse the freed space.
            ratio = min(ratio, self._ratio)
        self._measured = self._measured or logical >= cap * quotas.MEASURE_MIN_FRACTION
        self._ratio = ratio
        self._budget = quotas.budget(cap, self._ratio)
        return self._budget

    def remeasure(self, max_bytes: int, reserved: int) -> None:
        """The file still over `max_bytes` with no device over its share (SQLite): the
        overhead per logical byte was measured on another mix of rows; measured again (never
        lower), the budget shrinks and the devices holding most are over their share again."""
        self._ratio = max(self._ratio, min(quotas.MAX_OVERHEAD, (
            self.used_bytes() - reserved) / max(1, sum(self.usage().values()))))
        self._budget = quotas.budget(max(0, max_bytes - reserved), self._ratio)

    def over_cap(self, max_bytes: int) -> bool:
        """Whether the store is over its cap: its file (SQLite), or the devices' logical
        bytes over their budget (PostgreSQL: row deletes do not shrink its files)."""
        if self._d.name == "sqlite":
            return self.used_bytes() > max_bytes
        return sum(self.usage().values()) > self._budget
