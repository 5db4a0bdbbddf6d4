"""Probation's shadow sample (runtime/device/ota.py): while a swapped-in model is on probation,
every `every`th frame of the [model]'s model is also run on the old one, after its result is
stored (so the comparison adds nothing to its latency), counting top-1 agreement by label
(the two models may order their classes differently). A failure of the old model costs the
comparison, not the frame. A source on its own model is not on probation: not sampled.

The old model's session is the form that ran at the swap. Where the new model has that form
too (a new version of the same model), only frames the new model runs on it are compared: a
governor that moved the new model to a cheaper rung meanwhile would otherwise count the
difference between two forms against the new version (seen in the field soak: an identical
network passed at exactly the floor, 16 of 20, after its solar node stepped from fp32-r60 to
fp32-r56). A new model without that form is compared on every form (form names are
generic: another network with the old session's form, `fp32` beside `fp32`, is compared on it
like a new version, which is still like with like in precision). The frames on other forms
are sampled too (`mixed`, as every frame was before): the figure judged, against the plain
floor, when the governor keeps the new model off the old form too long for the like-with-like
sample to fill (runtime/ota/probation.py `shadow_figures`), so the governor never holds a
probation open and none goes unjudged. That figure still counts two forms' difference against
the new version (docs/ota.md, "Known")."""

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

    variant_id: str
    session: Any
    input_shape: tuple[int, ...]
    manifest: Manifest | None


def form(variant_id: str) -> str:
    """A variant's math form without its model's name or engine: `fp32-r60` of
    `inspection/fp32-r60@onnxruntime:CPU/t1,opt=all`."""
    return variant_id.partition("/")[2].partition("@")[0]


class ShadowSample:
    """`old`: the old model's session (None: no probation); `counts` = [compared, agreed].
    Sampled and compared on the thread that infers and stores (under the pipeline's work
    lock); `old` is set by the probation between two frames. `only`: the form compared like
    with like (the old session's, when the new model has it too), None: every form is;
    `mixed` = [compared, agreed] on every form."""

    def __init__(self) -> None:
        self.old: Active | None = None
        self.every = 5
        self.counts = [0, 0]
        self.mixed = [0, 0]
        self.only: str | None = None
        self.other_form = 0  # frames of the new model on another form than `only`
        self._i = self._j = 0  # frames on `only` (or every frame), on another form
        self._due: list[tuple[Frame, Any, Active, bool]] = []  # compared after the store

    def begin(self, old: Active | None, every: int, forms: frozenset[str] = frozenset()
              ) -> None:
        """A probation starts against `old`: every `every`th frame compared, counts from 0;
        `forms`: the new model's (every variant that runs), to compare like with like where
        it can."""
        f = form(old.variant_id) if old is not None else ""
        self.only = f if f and f in forms else None
        # frames kept under the last probation (its form, its shadow) are not compared
        self._due, self._i, self._j, self.other_form = [], 0, 0, 0
        self.counts, self.mixed, self.every, self.old = [0, 0], [0, 0], every, old

    def sample(self, frame: Frame, out: Any, active: Active) -> None:
        """A frame of the [model]'s model inferred on `active`: kept for comparison when due
        (not while the old model is still the one running: the swap has not reached the
        inferring thread yet)."""
        if self.old is None or self.old is active:
            return
        if self.only is not None and form(active.variant_id) != self.only:
            self.other_form += 1
            self._j += 1
            if self._j % self.every == 0:
                self._due.append((frame, out, active, False))
            return
        self._i += 1
        if self._i % self.every == 0:
            self._due.append((frame, out, active, True))

    @property
    def due(self) -> tuple[int, int]:
        """Frames kept for comparison and not yet compared: (like with like, other forms)."""
        like = sum(1 for *_, lk in self._due if lk)
        return like, len(self._due) - like

    def drop_due(self) -> None:
        """The frames due are not compared (their store failed: nothing piles up meanwhile)."""
        self._due.clear()

    def compare_due(self, pre_of: Callable[[Active], Callable[[Any, tuple[int, ...]], Any]],
                    manifest: Manifest) -> None:
        """Run the frames due through the old model (`pre_of(active)`: its preprocessing;
        `manifest`: the pipeline's, for a session without its own)."""
        due, self._due = self._due, []
        old = self.old
        for frame, out, active, like in due if old is not None else ():
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
            self.mixed[0] += 1
            self.mixed[1] += new_label == old_label
            if like:
                self.counts[0] += 1
                self.counts[1] += new_label == old_label
