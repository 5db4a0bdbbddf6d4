"""Per-model counts of a pipeline that may run several models: what probation judges by.

The pipeline's own counters and latency ring are the box's totals (every source, every
model). Probation (runtime/device/ota.py) judges one model, the one OTA swapped, against the
one it replaced, so the pipeline also counts per model: results, errors (an inference that
raised, or an output its model's postprocessing refused) and the latency of each inference
(a tiled frame's inference time over its tiles, as runtime/choice/joint.py's per-inference targets
are). On a box where a classifier camera runs the [model] section's model and a 9-tile
detector its own, the detector's inferences, errors and frames are not the classifier's.

A model is a `ModelId`: its key in the pipeline (`Active.key`, "" for the [model] section's
model) and its directory. The old and the new version of the [model] share the key "", not
the directory, so frames the old model still runs after a swap count for the old model.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Any

from runtime.config.source import MAX_SOURCES

ModelId = tuple[str, str]  # (pipeline key, model directory)

RING = 2000  # inference latencies kept per model (the pipeline's own ring is 2000 frames)
# Models counted at once; the one silent longest is forgotten first. Every model the box may
# run at once must fit: each of the MAX_SOURCES sources on a model of its own, the [model]'s,
# and its old version during a swap. With 16, a box of 17+ models served in turn forgot each
# one before its next frame (LRU in a round robin): the [model]'s count restarted at 1, so
# probation never reached its frames and the throttling check never its 50 results.
MAX_MODELS = MAX_SOURCES + 2


def model_id(key: str, manifest: Any) -> ModelId:
    """The id of the model `manifest` (engine.manifest.Manifest) under pipeline key `key`."""
    return key, str(getattr(manifest, "root", ""))


@dataclass(frozen=True)
class Tally:
    """One model's counts: results and errors since it was first counted (not reset by a
    swap: the caller subtracts an earlier tally), and inference latencies (ms per inference)
    stored at or after the time asked for, from the last `RING`."""

    results: int = 0
    errors: int = 0
    latencies_ms: tuple[float, ...] = ()
    # of those, the inferences that ran alone (the inline path: no other stage of the
    # pipeline beside them, so their wall time is the model's, not a wait for a core)
    alone_ms: tuple[float, ...] = ()


class ModelCounts:
    """Thread-safe per-model tallies (the infer and capture threads count, the main thread
    reads)."""

    def __init__(self, ring: int = RING, max_models: int = MAX_MODELS):
        self._lock = threading.Lock()
        self._ring, self._max = ring, max_models
        self._n: dict[ModelId, list[int]] = {}  # [results, errors]
        self._ms: dict[ModelId, collections.deque] = {}  # (wall time, ms per inference, alone)
        self._seen: dict[ModelId, float] = {}  # last counted (wall time)

    def _slot(self, m: ModelId, now: float) -> list[int]:
        got = self._n.get(m)
        if got is None:
            if len(self._n) >= self._max:  # bounded across years of swaps
                gone = min(self._seen, key=self._seen.__getitem__)
                del self._n[gone], self._ms[gone], self._seen[gone]
            got = self._n[m] = [0, 0]
            self._ms[m] = collections.deque(maxlen=self._ring)
        self._seen[m] = now
        return got

    def result(self, m: ModelId, now: float, ms_per_inference: float,
               alone: bool = False) -> None:
        """One result of model `m` stored at monotonic time `now` (`alone`: see Tally)."""
        with self._lock:
            self._slot(m, now)[0] += 1
            self._ms[m].append((now, ms_per_inference, alone))

    def error(self, m: ModelId, now: float) -> None:
        """One frame model `m` failed (inference raised, or its output was refused)."""
        with self._lock:
            self._slot(m, now)[1] += 1

    def tally(self, m: ModelId, since: float = 0.0) -> Tally:
        """Model `m`'s counts, with its latencies stored at or after `since` (monotonic
        time: a wall step must not hide or double a probation's window)."""
        with self._lock:
            n = self._n.get(m)
            if n is None:
                return Tally()
            recent = [x for x in self._ms[m] if x[0] >= since]
            return Tally(n[0], n[1], tuple(ms for _, ms, _ in recent),
                         tuple(ms for _, ms, alone in recent if alone))


__all__ = ["MAX_MODELS", "RING", "ModelCounts", "ModelId", "Tally", "model_id"]
