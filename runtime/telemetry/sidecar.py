"""Small durable facts that must outlive the outbox database: seen command ids and
`evicted_total`.

A corrupt outbox is moved aside and restarted empty (the device keeps working); if replay
protection and the eviction counter lived only inside it, a captured command would be accepted
again and the operator's record of lost results would restart at 0. So they live in their own
small JSON file next to the outbox (`<outbox>.keep.json`), rewritten atomically (temp file,
fsync, rename) on the rare occasions they change: an accepted command, an eviction.

When the file itself is unreadable or missing while an older outbox existed, the ids seen
before are unknown: `not_before` is set to now, so every command issued before this moment is
refused (a captured one can no longer be replayed); new commands work at once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from runtime.durable import write_atomic

log = logging.getLogger("edgerun.outbox")

MAX_IDS = 10_000  # commands are rare; a flood of valid signed ids is the coordinator's bug


class Sidecar:
    """The `<outbox>.keep.json` file (see module docstring)."""

    def __init__(self, path: Path, lost_history: bool):
        self.path = path
        self._lock = threading.Lock()
        self.evicted_total = 0
        self.not_before = 0.0
        self.seen: dict[str, float] = {}
        self.problem = ""  # why the history was reset, for an event
        if path.exists():
            try:
                data = json.loads(path.read_text())
                self.evicted_total = int(data["evicted_total"])
                self.not_before = float(data.get("not_before", 0.0))
                self.seen = {str(k): float(v) for k, v in data["seen_commands"].items()}
            except (OSError, ValueError, KeyError, TypeError, AttributeError,
                    RecursionError) as e:  # deep nesting too: it stopped every start
                aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
                path.rename(aside)
                self.problem = f"{path} was unreadable ({e}); moved to {aside}"
                self._reset_history()
        elif lost_history:
            self.problem = f"{path} is missing while an older outbox existed"
            self._reset_history()
        if self.problem:
            log.error("command replay record lost: %s; commands issued before now are refused",
                      self.problem)
        self._write()

    def _reset_history(self) -> None:
        self.seen = {}
        self.not_before = time.time()

    def remember(self, command_id: str, expires: float) -> bool:
        """Record an accepted command id until it expires; False when already seen."""
        with self._lock:
            now = time.time()
            self.seen = {k: v for k, v in self.seen.items() if v >= now}
            if command_id in self.seen:
                return False
            if len(self.seen) >= MAX_IDS:  # refuse rather than forget: forgetting allows replays
                from runtime.wire.commands import CommandRefused

                raise CommandRefused(f"{MAX_IDS} unexpired command ids are remembered already; "
                                     "refused rather than forgetting one (send shorter TTLs)")
            self.seen[command_id] = expires
            self._write()
            return True

    def set_evicted_total(self, value: int) -> None:
        """Persist the eviction counter (monotonic)."""
        with self._lock:
            self.evicted_total = max(self.evicted_total, value)
            self._write()

    def _write(self) -> None:
        write_atomic(self.path, json.dumps({
            "evicted_total": self.evicted_total, "not_before": self.not_before,
            "seen_commands": self.seen}), mode=0o600)
