"""Probation's shadow sample (runtime/device/ota.py): while a swapped-in model is on probation,
every `every`th frame of the [model]'s model is also run on the old one, after its result is
stored (so the comparison adds nothing to its latency), counting top-1 agreement by label
(the two models may order their classes differently). A failure of the old model costs the
comparison, not the frame. A source on its own model is not on probation: not sampled.

The old model's session is the form that ran at the swap. Where the new model has that form
too (a new version of the same model), only frames the new model runs on a form the old model
has a session of here are compared (like with like): a governor that moved the new model to a
cheaper rung meanwhile would otherwise count the difference between two forms against the new
version (seen in the field soak: an identical network passed at exactly the floor, 16 of 20,
after its solar node stepped from fp32-r60 to fp32-r56). A form the new model runs on with no
old session yet is noted in `wanted` (its form and variant id); the probation loads the old
version's session of it in the background and hands it over (`add`, between two frames), so
the sample follows the governor. A new model without the old session's form is compared on
every form (form names are generic: another network with the old session's form, `fp32`
beside `fp32`, is compared on it like a new version, which is still like with like in
precision). The frames on forms without an old session are sampled too (`mixed`, against the
session of the swap, as every frame was before): the figure judged, against the plain floor,
when the like-with-like sample cannot fill in time (runtime/ota/probation.py
`shadow_figures`: the old version lacks those forms, or their sessions would not load), so the
governor never holds a probation open and none goes unjudged. That figure still counts two
forms' difference against the new version (docs/ota.md, "Known")."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from runtime.engine.manifest import Manifest, frame_result
from runtime.engine.tiling import infer_tiles
from runtime.frames.frame import Frame

log = logging.getLogger("edgerun.pipeline")

LOADED_FAILS = 3  # failures that drop a session loaded for another form


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
    """`old`: the old model's session of the swap (None: no probation); `counts` =
    [compared, agreed] like with like. Sampled and compared on the thread that infers and
    stores (under the pipeline's work lock); `old` and the sessions of other forms (`add`) are
    set by the probation between two frames. `only`: the old session's form when the new
    model has it too (compared like with like, on every form an old session is held of),
    None: every form is compared with `old`; `mixed` = [compared, agreed] on every form;
    `wanted`: form -> the new model's variant id, for forms it ran on with no old session;
    `failed`: comparisons lost to the swap's session raising (`last_error`: its last
    error); a loaded session that keeps raising is dropped instead."""

    def __init__(self) -> None:
        self.old: Active | None = None
        self.every = 5
        self.counts = [0, 0]
        self.mixed = [0, 0]
        self.only: str | None = None
        self.other_form = 0  # frames of the new model on a form with no old session
        self.failed = 0  # shadow inferences on the old model that raised
        self.last_error = ""
        self.wanted: dict[str, str] = {}
        self._olds: dict[str, Active] = {}  # the old model's sessions by form (like with like)
        self._fails: dict[int, int] = {}  # failures of each loaded session (by id)
        self._i = self._j = 0  # frames on a form held (or every frame), on another form
        self._due: list[tuple[Frame, Any, Active, bool]] = []  # compared after the store

    def begin(self, old: Active | None, every: int, forms: frozenset[str] = frozenset()
              ) -> None:
        """A probation starts against `old`: every `every`th frame compared, counts from 0;
        `forms`: the new model's (every variant that runs), to compare like with like where
        it can; `old` None: none runs. The sessions held before are forgotten, not closed:
        the pipeline's `begin_shadow` closes them."""
        f = form(old.variant_id) if old is not None else ""
        self.only = f if f and f in forms else None
        self._olds = {f: old} if self.only is not None and old is not None else {}
        # frames kept under the last probation (its form, its shadow) are not compared
        self._due, self._i, self._j, self.other_form, self.wanted = [], 0, 0, 0, {}
        self.failed, self.last_error, self._fails = 0, "", {}
        self.counts, self.mixed, self.every, self.old = [0, 0], [0, 0], every, old

    def add(self, old: Active) -> bool:
        """The old model's session of another form (loaded by the probation): the new
        model's frames on that form are compared with it, like with like, from now on.
        False when not taken (no probation, no like-with-like, a session of that form held)."""
        f = form(old.variant_id)
        if self.old is None or self.only is None or f in self._olds:
            return False
        self._olds[f] = old
        self.wanted.pop(f, None)
        return True

    def sessions(self) -> list[Active]:
        """Every old session the sample holds, once each (the swap's first)."""
        return list({id(a): a for a in (self.old, *self._olds.values()) if a is not None
                     }.values())

    def sample(self, frame: Frame, out: Any, active: Active) -> None:
        """A frame of the [model]'s model inferred on `active`: kept for comparison when due
        (not while the old model is still the one running: the swap has not reached the
        inferring thread yet)."""
        if self.old is None or any(a is active for a in self.sessions()):
            return
        f = form(active.variant_id)
        if self.only is not None and f not in self._olds:
            self.other_form += 1
            self.wanted.setdefault(f, active.variant_id)
            self._j += 1
            if self._j % self.every == 0:
                self._due.append((frame, out, active, False))
            return
        self._i += 1
        if self._i % self.every == 0:
            self._due.append((frame, out, active, True))

    def _failed(self, old: Active, e: Exception) -> None:
        """A shadow inference on `old` raised: the swap's session counts towards giving the
        agreement up (`failed`, runtime/ota/probation.py `shadow_failed`); a session loaded
        for another form is dropped and closed after LOADED_FAILS, its form compared with
        the swap's session again, as when it never loaded."""
        if old is self.old:
            self.failed += 1
            self.last_error = str(e)[:300]
            # said once a probation; the probation says what it does about it
            (log.warning if self.failed == 1 else log.debug)(
                "shadow inference on the old model failed: %s", e)
            return
        n = self._fails[id(old)] = self._fails.get(id(old), 0) + 1
        if n >= LOADED_FAILS:
            f = form(old.variant_id)
            self._olds.pop(f, None)
            old.session.close()  # never the running one: a loaded old session only
            log.warning("shadow: the old version's %s failed %d inferences (last: %s); "
                        "closed, its frames compared with the swap's session", old.variant_id,
                        n, e)

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
        `manifest`: the pipeline's, for a session without its own): a like-with-like frame
        through the old session of its form, any other through the swap's."""
        due, self._due = self._due, []
        for frame, out, active, like in due if self.old is not None else ():
            old = self._olds.get(form(active.variant_id)) if like else None
            like = old is not None or (like and self.only is None)  # its session may be gone
            old = old or self.old
            hw = frame.image.shape[:2]  # a detector's label is its best box's
            try:  # the new model's own result: its failure is not the old model's
                new_label = frame_result(out, active.manifest or manifest, hw,
                                         active.input_shape)["label"]
            except Exception as e:
                log.debug("shadow: the new model's result did not read back: %s", e)
                continue
            try:
                got = infer_tiles(old.session, pre_of(old)(frame.image, old.input_shape))
                old_label = frame_result(got, old.manifest or manifest, hw,
                                         old.input_shape)["label"]
            except Exception as e:
                self._failed(old, e)
                continue
            self.mixed[0] += 1
            self.mixed[1] += new_label == old_label
            if like:
                self.counts[0] += 1
                self.counts[1] += new_label == old_label
