"""A small, bounded history of the device's own health, for `edgerun report` when offline.

The outbox keeps only the latest few health messages (older ones are stale for the fleet), so
a box without a coordinator, or cut off from it, would have nothing to draw its day from.
Every health message the daemon makes is also reduced to the dozen figures the report plots
(`record`; ~245 bytes as stored, `compact`) and appended as one JSON line to
`<state_dir>/health-history.jsonl`.
Past `MAX_BYTES` the file is rotated to `.1` (one rotated file is kept), so the history costs
at most 2 x MAX_BYTES of disk: about 1.8 days at the default 5 s health interval. A write
that fails (disk full) is logged once a minute and skipped; the daemon goes on.

With `flush_s` > 0 records wait in memory and are written whole pages (`PAGE`) at a time:
once the held records reach the end of the file's current 4 KiB page and `pages - 1` more
(`HOLD_PAGES`, 32 KiB: a bound on memory, reached first only at short health intervals),
those that fit are written followed by a line of spaces (which readers skip) ending exactly on
a page's boundary, and the rest wait; and everything held, padded the same way, once the
oldest is `flush_s` old (checked at each append). Every page of the file is then dirtied
once: a record every 5 s dirtied the tail page again after each writeback, and even a
minute's records written unaligned dirtied two pages for one (4 KiB counted each time, most
of what the daemon wrote at 1 result/s). Each write also dirties the file's inode (its size
and mtime: one more page of metadata on the disk, and on ext4 without a journal counted
against the daemon), so a write of several pages every few minutes costs less than a page
a minute. The padding costs file space, not writes (the page is written whole either way),
so the file holds a little less history before it rotates. At `close` what is held is
written unpadded. A reader sees the file up to the last write; a kill -9 loses what was held
(at most `flush_s` of history; never a result).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from runtime.wire import payloads

log = logging.getLogger("edgerun.history")

NAME = "health-history.jsonl"
MAX_BYTES = 4 << 20
MAX_LINE = 4096  # a longer line is not one of ours: skipped when reading
PAGE = 4096  # the page cache's unit: what one more byte on a clean page costs the disk
HOLD_PAGES = 8  # records held at most this many pages' worth before they are written


def _get(h: Mapping[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(h, Mapping):
            return None
        h = h.get(key)  # type: ignore[assignment]
    return h


def _num(x: Any) -> float | None:
    """A finite number, else None (a hostile or damaged record must not reach a plot)."""
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        return None
    return float(x)


def record(h: Mapping[str, Any], trips: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The figures of one health message the report plots (any missing one is None).
    `trips` are the device's thermal trip points (type -> °C) when known; health itself
    carries only the passive one."""
    out: dict[str, Any] = {
        "t": _num(h.get("t")),
        "temp_c": _num(h.get("temp_c")),
        "throttled": bool(h.get("throttled")) if isinstance(h.get("throttled"), bool) else None,
        "rung": _num(h.get("rung")), "rungs": _num(h.get("rungs")),
        "rate_hz": _num(_get(h, "pipeline", "rate_hz")),
        "p95_ms": _num(_get(h, "pipeline", "latency_ms", "p95")),
        "target_ms": _num(_get(h, "slo", "target_ms")),
        "energy_mj": _num(h.get("rung_energy_mj")),
        "power_w": _num(h.get("power_w")),
        "battery_frac": _num(h.get("battery_frac")),
        "accuracy": _num(h.get("accuracy")),
    }
    # the daemon's disk writes a day (health `storage`), only once measured: `edgerun check`
    # reads the newest to say how long the card lasts at that rate
    if (per_day := _num(_get(h, "storage", "write_bytes_per_day"))) is not None:
        out["write_bytes_per_day"] = per_day
    if (card := _num(_get(h, "storage", "card_write_bytes_per_day"))) is not None:
        out["card_write_bytes_per_day"] = card  # the card's, every writer's
    if (sim_t := _num(_get(h, "simulated", "t"))) is not None:
        out["sim_t"] = sim_t  # a simulated device: its own clock (s since a midnight)
    # the pipeline's results since the daemon started: the report counts them per hour (a
    # sleeping node's rate is its bursts', ~1000x what it inferred in the hour)
    if (results := _num(_get(h, "pipeline", "results"))) is not None:
        out["results"] = results
    # a sleeping node's last health before a sleep announces the wake (`sleep.next_wake`,
    # runtime/device/sleep.py, on the device's clock): kept as seconds from `t`, so a sleep
    # moves with a `t` the coordinator placed (runtime/coordinator/clock_place.py: the
    # device's own time is then `clk.claimed`)
    wake = _num(_get(h, "sleep", "next_wake"))
    claimed = _num(_get(h, "clk", "claimed"))
    said = claimed if claimed is not None else _num(h.get("t"))
    if wake is not None and said is not None and wake > said:
        # believed at most a week on, as the coordinator does (a wake in the year 318920
        # made `edgerun report` fail on a date out of range)
        out["asleep_s"] = min(wake - said, payloads.LONGEST_SLEEP_S)
        # a simulated sleep lasts its device seconds / speed of wall (runtime/device/sleep.py):
        # its length on the device's clock, which the report draws a simulator on
        if (speed := _num(_get(h, "simulated", "speed"))) is not None and speed > 0:
            out["asleep_sim_s"] = out["asleep_s"] * speed
    t = dict(trips or {})
    if (p := _num(h.get("passive_trip_c"))) is not None:
        t.setdefault("passive", p)
    out["trips"] = {str(k)[:32]: v for k, v in t.items() if _num(v) is not None}
    return out


# figures kept whole: the time (to the millisecond), a simulated clock, a byte count a day, a
# results counter, a sleep's length (to the millisecond: a simulated sleep lasts ~1 s of wall)
_WHOLE = {"t": 3, "sim_t": 3, "write_bytes_per_day": 0, "card_write_bytes_per_day": 0,
          "results": 0, "asleep_s": 3, "asleep_sim_s": 1}


def compact(rec: Mapping[str, Any]) -> dict[str, Any]:
    """`rec` as the file stores it: figures that are None left out (`read` gives them back
    as None) and the rest to 4 significant digits, what a plot shows (the time to the
    millisecond). A record held ~280 bytes, ~100 of them digits past what any plot draws
    and `null`s: the file's bytes are disk writes and days of history."""
    out: dict[str, Any] = {}
    for k, v in rec.items():
        if v is None:
            continue
        if isinstance(v, float):
            v = round(v, _WHOLE[k]) if k in _WHOLE else float(f"{v:.4g}")
            if v.is_integer() and abs(v) < 2**53:
                v = int(v)
        elif isinstance(v, dict):
            v = compact(v)
        out[k] = v
    return out


class HealthHistory:
    """Appends health records to `<state_dir>/health-history.jsonl` (see module docstring)."""

    def __init__(self, state_dir: Path, max_bytes: int = MAX_BYTES, flush_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, pages: int = HOLD_PAGES):
        self.path = Path(state_dir) / NAME
        self.max_bytes = max_bytes
        self.flush_s = flush_s  # 0: every record written at once
        self.pages = max(1, pages)
        # (size, ends mid-line) of the file as last seen: reading its last byte at every
        # append updated its atime, which dirtied its inode's metadata page again
        self._seen: tuple[int, bool] | None = None
        self._clock = clock
        self._held: list[tuple[float, str]] = []  # (clock when made, record), oldest first
        self._said = -math.inf
        self.errors = 0

    def append(self, h: Mapping[str, Any], trips: Mapping[str, float] | None = None) -> None:
        """Append one record (held for whole pages or `flush_s`, when that is set).
        Never raises."""
        try:
            line = json.dumps(compact(record(h, trips)), separators=(",", ":"),
                              allow_nan=False) + "\n"
        except ValueError as e:
            self._failed(e)
            return
        now = self._clock()
        self._held.append((now, line))
        if self.flush_s <= 0:
            self._flush(pad=False)
        elif now - self._held[0][0] >= self.flush_s:
            self._flush(pad=True)
        else:
            self._flush_page()

    def flush(self) -> None:
        """Write every held record now (unpadded). Never raises; a write that failed drops
        them (a gap in the report, logged)."""
        self._flush(pad=False)

    def close(self) -> None:
        """Write what is held (at a clean stop)."""
        self._flush(pad=False)

    def _flush(self, pad: bool) -> None:
        lines, self._held = [line for _, line in self._held], []
        if lines:
            self._guarded(lines, pad)

    def _flush_page(self) -> None:
        """Write the held records that fill the file's current page and `pages - 1` more,
        if they reach the end of the last."""
        if sum(len(line) for _, line in self._held) < (self.pages - 1) * PAGE:
            return  # cannot fill them yet: no need to look at the file
        try:
            size, prefix = self._tail()
        except OSError as e:
            self._failed(e)
            return
        room = PAGE - size % PAGE + (self.pages - 1) * PAGE
        if len(prefix) + sum(len(line) for _, line in self._held) < room:
            return  # the page is not full yet: wait
        n, used = 0, len(prefix)
        while n < len(self._held) and used + len(self._held[n][1]) <= room:
            used += len(self._held[n][1])
            n += 1
        if n == 0 and room >= PAGE:
            n = 1  # a record longer than a page (not one of ours): written as it is
        lines = [line for _, line in self._held[:n]]
        self._held = self._held[n:]
        self._guarded(lines, True)  # none fits: the page is closed with padding alone

    def _guarded(self, lines: list[str], pad: bool) -> None:
        try:
            self._write(lines, pad)
        except OSError as e:
            self._failed(e)

    def _tail(self) -> tuple[int, str]:
        """The file's size and what must go before the next record ("\n" after a line a
        power cut left unfinished, so no record is joined onto it)."""
        size = self.path.stat().st_size if self.path.exists() else 0
        if not size:
            return 0, ""
        if self._seen is None or self._seen[0] != size:  # not as this writer left it
            self._seen = (size, _ends_mid_line(self.path))
        return size, "\n" if self._seen[1] else ""

    def _write(self, lines: list[str], pad: bool) -> None:
        size, prefix = self._tail()
        blob = prefix + "".join(lines)
        if pad:
            # records are ASCII (json.dumps escapes the rest): characters are bytes
            blob = _padded(blob, -(size + len(blob)) % PAGE)
        if size + len(blob) <= self.max_bytes:  # the usual case: one write
            self._append(blob)
            return
        for line in lines:  # one at a time across a rotation: bounded as before
            size, prefix = self._tail()
            if size and size + len(prefix) + len(line) > self.max_bytes:
                self.path.replace(self.path.with_name(NAME + ".1"))
                prefix = ""
            self._append(prefix + line)

    def _append(self, text: str) -> None:
        # O_NOFOLLOW: a link planted in its place would have the daemon append to
        # whatever file it names (as every state file refuses, runtime/durable.py)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                     0o644)
        self._seen = None  # until the write is whole, as any other writer's
        with os.fdopen(fd, "a") as f:
            f.write(text)
            f.flush()
            if text.endswith("\n"):  # whole lines, as ours are
                self._seen = (os.fstat(fd).st_size, False)

    def _failed(self, e: Exception) -> None:
        self.errors += 1
        if time.monotonic() - self._said >= 60:
            self._said = time.monotonic()
            log.warning("cannot append to the health history %s (%s); `edgerun report` "
                        "will have a gap there", self.path, e)


def _padded(blob: str, pad: int) -> str:
    """`blob` (whole lines, or empty) made `pad` characters longer: a line of spaces after
    it, which no reader takes for a record (a record's own line padded could pass the
    readers' MAX_LINE and be dropped)."""
    return blob + " " * (pad - 1) + "\n" if pad > 0 else blob


def _ends_mid_line(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(-1, 2)
        return f.read(1) != b"\n"


def read(state_dir: Path, since: float = 0.0, until: float = math.inf) -> list[dict[str, Any]]:
    """The records in `<state_dir>` (rotated file first), oldest first, with `since <= t <=
    until`. Lines that are not a record (damaged, truncated by a power cut) are skipped."""
    base = Path(state_dir) / NAME
    out = []
    for path in (base.with_name(NAME + ".1"), base):
        if path.exists():
            out += _records(path.read_text(errors="replace").splitlines())
    return sorted((r for r in out if since <= r["t"] <= until), key=lambda r: r["t"])


def _speed(doc: Mapping[str, Any]) -> float | None:
    """The simulator's speed a stored record implies (its sleep's device and wall seconds)."""
    wall, sim = _num(doc.get("asleep_s")), _num(doc.get("asleep_sim_s"))
    return sim / wall if wall and sim is not None else None


def _records(lines: Iterable[str]) -> list[dict[str, Any]]:
    out = []
    for line in lines:
        if not line or len(line) > MAX_LINE:
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and _num(doc.get("t")) is not None:
            # re-derive from what was stored, so a hand-edited file is validated too
            r = record({**doc, "simulated": {"t": doc.get("sim_t"), "speed": _speed(doc)},
                        "pipeline": {"rate_hz": doc.get("rate_hz"),
                                     "latency_ms": {"p95": doc.get("p95_ms")},
                                     "results": doc.get("results")},
                        "sleep": {"next_wake": (doc["t"] + doc["asleep_s"]) if
                                  _num(doc.get("asleep_s")) is not None else None},
                        "slo": {"target_ms": doc.get("target_ms")},
                        "rung_energy_mj": doc.get("energy_mj"),
                        "storage": {"write_bytes_per_day": doc.get("write_bytes_per_day"),
                                    "card_write_bytes_per_day":
                                        doc.get("card_write_bytes_per_day")}},
                       doc.get("trips") if isinstance(doc.get("trips"), dict) else None)
            out.append(r)
    return out
