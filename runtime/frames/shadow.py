"""Probation's shadow sample (runtime/device/ota.py): while a swapped-in model is on probation,
every `every`th frame of the [model]'s model is also run on the old one, after its result is
stored (so the comparison adds nothing to its latency), counting top-1 agreement by label
(the two models may order their classes differently). A failure of the old model costs the
comparison, not the frame. A source on its own model is not on probation: not sampled."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from runtime.engine.manifest import Manifest, frame_result
from runtime.engine.tiling import infer_tiles
from runtime.frames.frame import Frame

log = logging.getLogger("edgerun.pipeline")


class Active(Protocol):
    """What is compared of a pipeline's running variant (runtime/frames/pipeline.py Active)."""

    session: Any
    input_shape: tuple[int, ...]
    manifest: Manifest | None


class ShadowSample:
    """`old`: the old model's session (None: no probation); `counts` = [compared, agreed].
    Sampled and compared on the thread that infers and stores (under the pipeline's work
    lock); `old` is set by the probation between two frames."""

    def __init__(self) -> None:
        self.old: Active | None = None
        self.every = 5
        self.counts = [0, 0]
        self._i = 0
        self._due: list[tuple[Frame, Any, Active]] = []  # compared after the store

    def begin(self, old: Active | None, every: int) -> None:
        """A probation starts against `old`: every `every`th frame compared, counts from 0."""
        self.counts, self.every, self.old = [0, 0], every, old

    def sample(self, frame: Frame, out: Any, active: Active) -> None:
        """A frame of the [model]'s model inferred on `active`: kept for comparison when due
        (not while the old model is still the one running: the swap has not reached the
        inferring thread yet)."""
        if self.old is None:
            return
        self._i += 1
        if self.old is not active and self._i % self.every == 0:
            self._due.append((frame, out, active))

    def drop_due(self) -> None:
        """The frames due are not compared (their store failed: nothing piles up meanwhile)."""
        self._due.clear()

    def compare_due(self, pre_of: Callable[[Active], Callable[[Any, tuple[int, ...]], Any]],
                    manifest: Manifest) -> None:
        """Run the frames due through the old model (`pre_of(active)`: its preprocessing;
        `manifest`: the pipeline's, for a session without its own)."""
        due, self._due = self._due, []
        old = self.old
        for frame, out, active in due if old is not None else ():
            try:
                got = infer_tiles(old.session, pre_of(old)(frame.image, old.input_shape))
                hw = frame.image.shape[:2]  # a detector's label is its best box's
                new_label = frame_result(out, active.manifest or manifest, hw,
                                         active.input_shape)["label"]
                old_label = frame_result(got, old.manifest or manifest, hw,
                                         old.input_shape)["label"]
            except Exception as e:
                log.warning("shadow inference on the old model failed: %s", e)
                continue
            self.counts[0] += 1
            self.counts[1] += new_label == old_label
