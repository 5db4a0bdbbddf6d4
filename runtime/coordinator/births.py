"""The coordinator's model rollouts fed from a stored batch: devices' events, and births
(a device coming back online) re-sent their desired model and settings.

Births are bounded work: one re-send a boot, at most one a `resend_window_s` (the latest of a
burst is answered at the window's end, coalesce.py); with several coordinators on one store
(share_group) only the one that claims a birth first in the store re-sends (two `deploy`s
make the device refuse the second). The births between two events are handed over together,
so their desired state is read once.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.coalesce import Coalescer
from runtime.coordinator.rollout import Rollouts
from runtime.coordinator.store import Inbound, Store
from runtime.wire.quarantine import RateLimitedLog

log = logging.getLogger("edgerun.coordinator")


class Births:
    """A stored batch's events and births into the rollouts (see module docstring)."""

    def __init__(self, cfg: CoordinatorConfig, store: Store, rollouts: Rollouts,
                 counters: collections.Counter, rlog: RateLimitedLog,
                 clock: Callable[[], float] = time.monotonic):
        """`clock`: the coordinator's monotonic clock (`due` is called with its readings)."""
        self.cfg, self._store, self._rollouts = cfg, store, rollouts
        self.counters, self._rlog, self._clock = counters, rlog, clock
        self._births = Coalescer(cfg.resend_window_s)

    def stats(self) -> dict[str, int]:
        """The births' coalescer: held, bound, passed."""
        return self._births.stats()

    def due(self, mono: float) -> None:
        """Hand the rollouts the births whose window ended by `mono` (monotonic clock)."""
        self._births_to_rollouts([v for _, v in self._births.due(mono)])

    def stored(self, stored: list[tuple[int, Inbound]]) -> None:
        """Model rollouts follow devices' events and returns, in the batch's order; the births
        between two events are handed over together (one read of their desired state)."""
        first = self._first_for_births([(i, m) for i, m in stored
                                        if m.kind == "state" and m.msg.get("online")])
        births: list[tuple[str, str | None]] = []
        for i, m in stored:
            if m.kind == "state" and m.msg.get("online") and first.get(i, False):
                # one re-send a boot, at most one a resend_window_s (the latest birth of a
                # burst is answered at the window's end): 300 forged births were 300 threads
                # and 300 commands
                if self._births.offer(m.device, (m.device, m.msg.get("model_version")),
                                      self._clock(), same=m.msg.get("boot")):
                    births.append((m.device, m.msg.get("model_version")))
                else:
                    self.counters["births_coalesced"] += 1
            elif m.kind == "event":
                self._births_to_rollouts(births)
                try:
                    self._rollouts.on_event(m.device, m.msg)
                except Exception:
                    log.exception("rollout bookkeeping for %s failed", m.device)
        self._births_to_rollouts(births)

    def _births_to_rollouts(self, births: list[tuple[str, str | None]]) -> None:
        """Hand (device, model_version) births to the rollouts (re-sends) and empty the list."""
        if not births:
            return
        try:
            self._rollouts.on_online_many(births)
        except Exception:
            names = sorted({d for d, _ in births})
            log.exception("rollout bookkeeping for the births of %s failed",
                          ", ".join(names[:5])
                          + (f" and {len(names) - 5} more" if len(names) > 5 else ""))
        births.clear()

    def _first_for_births(self, births: list[tuple[int, Inbound]]) -> dict[int, bool]:
        """Per (index, birth) of a batch, whether this coordinator re-sends the returning
        device its desired model and settings: every coordinator of a share_group gets every
        birth (states are not shared), and two `deploy`s make the device refuse the second
        ("busy"), which failed its part of a rollout. The first to claim the birth in the
        store does it; a batch's births are claimed in one transaction."""
        if not self.cfg.share_group or not births:
            return {i: True for i, _ in births}
        try:
            won = self._store.claim_many([(m.device, "birth", f"{m.msg['boot']}@{m.msg['t']}",
                                           time.time()) for _, m in births])
        except Exception as e:
            self._rlog.log("birth-claim", "could not check the store for another "
                           "coordinator's re-send (re-sending): %s", e, level=logging.ERROR)
            won = [True] * len(births)
        return {i: w for (i, _), w in zip(births, won, strict=True)}
