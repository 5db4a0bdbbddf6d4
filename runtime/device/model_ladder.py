"""The models a box serves and the ladder the control step climbs over them.

One model (the [model] section's, for one `[source]` or for every `[[sources]]` entry): the
control step climbs its rungs per frame (x its tiles per frame). Several (sources that name
their own models, runtime/choice/joint.py): the box's joint ladder, each of whose rungs picks
a rung of every model. Either way `control_rungs`/`control_current` are what the control step
sees, and `picks` what a control rung asks of each model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from power.rungs import Rung
from runtime.choice import joint
from runtime.choice.selector import Constraints
from runtime.device.served_model import ServedModel
from runtime.device.source_plan import SourcePlan
from runtime.frames.pipeline import live_id

log = logging.getLogger("edgerun.daemon")


class Box:
    """Every served model (`model`: the [model] section's; `source_models`: the sources'
    own, by key) and the box's ladder over them (main thread only)."""

    def __init__(self, plan: SourcePlan):
        self.plan = plan
        self.model = ServedModel()
        self.source_models: dict[str, ServedModel] = {}
        self.by_live: dict[str, Any] = {}  # every model's profiles by pipeline.live_id
        self.joint: list[joint.JointRung] = []  # the box's ladder (several models)
        self.joint_current = 0
        self.off_chain = False  # the models run a combination the box's ladder lacks

    @property
    def models(self) -> list[ServedModel]:
        """Every model served: the [model]'s first, then the sources' own."""
        return [self.model, *self.source_models.values()]

    def build(self, constraints: Callable[[str], Constraints], sim_power: Any,
              live_energy: dict[str, float]) -> None:
        """Every model's ladder for its constraints (by key), then the box's. One that cannot
        be built (NoVariantError) changes none of them."""
        built = [(m, m.ladder(constraints(m.key), self.plan.target(m.key)[1]))
                 for m in self.models]
        self.by_live = {}
        for m, ladder in built:
            m.take(ladder, sim_power, live_energy)
            self.by_live.update(m.by_live())  # ids of two models may clash: live ids do not
        self.build_joint()

    def build_joint(self) -> None:
        """The box's ladder over every model's live rungs (several models only)."""
        if not self.source_models:
            self.joint = []
            return
        loads = self.loads()
        self.joint = joint.joint_ladder(loads, sum(s.rate_hz for s in self.plan.streams()))
        # off the chain (live energies reordered it): the next tick moves the models onto it
        self.joint_current, on = joint.locate(self.joint, self.running())
        self.off_chain = not on
        log.debug("the box's ladder: %s", joint.describe(loads, self.joint))

    def running(self) -> tuple[int, ...]:
        """Each model's rung, the [model]'s first."""
        return tuple(m.current for m in self.models)

    def loads(self) -> list[joint.Load]:
        """Each model's ladder (per inference) and the inferences and frames per second its
        sources ask of it: the [model]'s first, then the sources' own models."""
        streams = self.plan.streams()
        out = []
        for m in self.models:
            mine = [s for s in streams if s.model == m.key]
            out.append(joint.Load(m.key or "[model]", tuple(m.rungs),
                                  sum(s.rate_hz * s.tiles for s in mine),
                                  sum(s.rate_hz for s in mine)))
        return out

    def control_rungs(self) -> list[Rung]:
        """The ladder the control step climbs, per frame at the combined frame rate: the
        [model]'s rungs (x its tiles per frame), or the box's joint ladder."""
        if self.joint:
            return [j.rung for j in self.joint]
        streams = self.plan.streams()
        frames = sum(s.rate_hz for s in streams)
        tiles = (sum(s.rate_hz * s.tiles for s in streams) / frames) if frames > 0 else \
            max((s.tiles for s in streams), default=1)
        return joint.per_frame(self.model.rungs, tiles)

    def control_current(self) -> int:
        """The control step's rung now (index into control_rungs)."""
        return self.joint_current if self.joint else self.model.current

    def held_down(self) -> bool:
        """The control loop holds a rung under the top (hot, or short of energy)."""
        return bool(self.model.rungs) and (
            self.control_current() < len(self.control_rungs()) - 1)

    def frame_rung(self) -> Rung:
        """The running rung per frame of any source (tiles and several models counted)."""
        rungs = self.control_rungs()
        return rungs[min(self.control_current(), len(rungs) - 1)]

    def picks(self, rung: int) -> list[tuple[ServedModel, int]]:
        """The switches control rung `rung` asks for: the [model]'s, or each model's part of
        the box's rung where it differs from what runs."""
        if not self.joint:
            return [(self.model, rung)]
        return [(m, i) for m, i in zip(self.models, self.joint[rung].picks, strict=True)
                if i != m.current]

    def relocate(self) -> None:
        """After the switches of a control rung: the box's rung the models now run (a
        failed switch kept what runs: off the chain, moved again at the next tick)."""
        if self.joint:
            k, on = joint.locate(self.joint, self.running())
            self.joint_current, self.off_chain = (k, False) if on else (self.joint_current,
                                                                        True)

    def health(self, pipeline: Any) -> dict[str, Any]:
        """health's `models`: each model the sources use, its ladder position and target,
        and with several models the box's rung (runtime/choice/joint.py)."""
        streams = self.plan.streams()
        out = []
        for ld, m in zip(self.loads(), self.models, strict=True):
            a = pipeline.target_of(m.key) if pipeline else None
            r = m.rungs[min(m.current, len(m.rungs) - 1)]
            # a bare .onnx's accuracy is unknown (its rung takes it as 1.0): null, not 1.0
            prof = self.by_live.get(live_id(m.key, r.variant_id))
            acc = r.accuracy if prof is None or prof.accuracy is not None else None
            # a long path as key: its end (the schema allows 256 characters)
            out.append({"key": m.key[-256:], "model": m.manifest.name,
                        "choice": a.variant_id if a else "",
                        "rung": m.current + 1, "rungs": len(m.rungs), "accuracy": acc,
                        "rung_energy_mj": round(r.energy_j * 1e3, 4),
                        "target_ms": round(self.plan.target(m.key)[0], 4),
                        "infer_hz": round(ld.infer_hz, 3),
                        "power_w": round(r.power_w(ld.infer_hz), 4),
                        "sources": [st.name for st in streams if st.model == m.key],
                        "reason": m.reason,
                        # model_blind: its first frames' outputs looked degenerate
                        "blind": pipeline.sight.blind.get(m.manifest.name)
                        if pipeline else None})
        box = {"rung": self.joint_current + 1, "rungs": len(self.joint)} if self.joint else {}
        return {"models": share_reasons(out), **({"box": box} if box else {})}


MODELS_REASON_CHARS = 8_000  # health's models[].reason, all models together


def share_reasons(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """health's `models` with each reason cut to its share of MODELS_REASON_CHARS (at most
    the schema's 4096): 65 models' reasons of ~1000 characters, with their keys and sources,
    pushed health over the 64 KiB a coordinator admits (64 sources on 64 models with short
    paths measured 54 KB even so: the rest is per-source and per-model figures). Cut at the
    end: the choice and its target come first; the sources' share of the box, the same for
    every model, is also in the top-level choice_reason."""
    per = min(4000, MODELS_REASON_CHARS // max(len(models), 1))
    for m in models:
        if len(m["reason"]) > per:
            m["reason"] = m["reason"][:per - 3] + "..."
    return models
