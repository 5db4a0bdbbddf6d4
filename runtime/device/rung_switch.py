"""The actuator: puts a served model on a rung of its ladder, like the kernel's cooling device
(the governor picks the state, the cooling device reaches it).

A switch loads and warms the rung's session and hands it to the pipeline, which swaps it in
between two frames. A variant that will not load is retried with backoff, not every tick
(runtime/device/switch_retry.py: said at the first failure and when the interval reaches its
longest, and when it loads again); a step down whose rung will not load falls back to the next
cheaper rung that does (`candidates`): a hot box must get off the hotter rung.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from runtime.device.served_model import ServedModel
from runtime.device.switch_retry import Retries, candidates
from runtime.frames.pipeline import Active, Pipeline

log = logging.getLogger("edgerun.daemon")  # the journal's name for the rung lines


def rung_label(i: int, n: int) -> str:
    """Rungs count from 1 (the cheapest) to n (the selector's choice), everywhere."""
    return f"{i + 1}/{n}"


class RungSwitch:
    """Switches models between rungs (main thread only); `event(type, severity, **fields)`
    records what it did for the operator."""

    def __init__(self, event: Callable[..., None]):
        self.event = event
        self.retries = Retries()  # per (model key and directory, variant)

    def retry_now(self) -> None:
        """A command or a config reload that may have mended a failing variant: every switch
        in backoff is tried again at its next request."""
        self.retries.reset()

    def move(self, m: ServedModel, rung: int, why: str, pipeline: Pipeline) -> bool:
        """Put `m` on `rung` (an event); True when another session was handed over. Nothing
        loaded: `m` stays where it is (each rung retried with its backoff)."""
        a = pipeline.target_of(m.key)
        if a is not None and a.variant_id == m.rungs[rung].variant_id and (
                a.manifest is None or a.manifest.root == m.manifest.root):
            m.current = rung  # same variant, new index (the ladder was rebuilt)
            return False
        old = a.variant_id if a else m.rungs[m.current].variant_id
        n, wanted = len(m.rungs), rung
        got = self._load_first(m, wanted, old)
        if got is None:
            return False
        rung, active = got
        if rung != wanted:
            why += f"; rung {rung_label(wanted, n)} ({m.rungs[wanted].variant_id}) will not load"
        pipeline.switch(active)
        log.info("%srung %s -> %s: %s -> %s (%s)", f"model {m.key} " if m.key else "",
                 rung_label(m.current, n), rung_label(rung, n), old, active.variant_id, why)
        self.event("rung_changed", "info", **{"from": old, "to": active.variant_id,
                                              "rung": rung + 1, "rungs": n, "reason": why,
                                              **({"model": m.key} if m.key else {})})
        m.current = rung
        return True

    def _load_first(self, m: ServedModel, wanted: int, running: str) -> tuple[int, Active] | None:
        """Load the session of rung `wanted` of `m`; when that is a step down and it will not
        load, of the next cheaper rung that does. Rungs in backoff are skipped; None when
        nothing loaded (or the running variant is reached first: nothing to switch)."""
        # Backoff per model directory too: two versions of the [model] share variant ids, and
        # the failed file of one (a new version's) must not hold back the other's (the
        # rollback's switch back was skipped: the failed version's session kept running)
        rkey = f"{m.key}\x00{m.root}"
        vids = [r.variant_id for r in m.rungs]
        for r in candidates(wanted, m.current):
            vid = vids[r]
            if r != wanted and vid == running:
                return None  # the fallback reached what runs
            if not self.retries.due(rkey, vid, time.monotonic()):
                continue  # it failed to load: retried when its backoff is over
            try:
                active = m.session(r)
            except Exception as e:  # a variant that will not load is reported
                self._failed(m.key, vid, e, running, rkey)
                continue
            self._worked(m.key, active.variant_id, rkey)
            if r != wanted:
                log.warning("%s%s will not load; stepped down to rung %s (%s) instead, cheaper "
                            "than the one asked for", f"model {m.key}: " if m.key else "",
                            vids[wanted], rung_label(r, len(vids)), vid)
            return r, active
        return None

    def _failed(self, key: str, vid: str, e: Exception, running: str, rkey: str) -> None:
        """A variant that would not load: stay on what runs and retry it with backoff, saying
        so at the first failure and when the interval reaches its longest, not every tick."""
        b, say = self.retries.failed(rkey, vid, time.monotonic())
        model = f"model {key} " if key else ""
        extra: dict[str, Any] = {"model": key[-256:]} if key else {}
        if say == "failing":
            log.error("cannot switch %sto %s: %s; staying on %s and retrying in %g s, then at "
                      "doubling intervals up to %g s (a reprofile, deploy or choose_model "
                      "command or a config reload retries at once)", model, vid, e, running,
                      b.delay_s, self.retries.cap_s)
            self.event("switch_failed", "warning", variant=vid, error=str(e)[:300],
                       running=running, retry_s=b.delay_s, **extra)
        elif say == "capped":
            log.warning("switch of %sto %s still fails after %d attempts (%s); staying on %s, "
                        "retrying every %g s", model, vid, b.failures, e, running, b.delay_s)
            self.event("switch_failed", "warning", variant=vid, error=str(e)[:300],
                       running=running, retry_s=b.delay_s, attempts=b.failures, **extra)
        else:
            log.debug("switch of %sto %s failed again (%d): %s; next try in %g s", model, vid,
                      b.failures, e, b.delay_s)

    def _worked(self, key: str, vid: str, rkey: str) -> None:
        """A switch that loaded: any backoff of this model ends (said once)."""
        old, say = self.retries.succeeded(rkey, vid)
        if say == "recovered":
            log.info("%sswitch to %s loaded%s after %d failed attempt(s); the retries stop",
                     f"model {key}: " if key else "", vid,
                     "" if old.target == vid else f" (it had been to {old.target})",
                     old.attempts)
