"""A model and its ladder, as the daemon serves it: the [model] section's model and each model a
`[[sources]]` entry names (runtime/choice/joint.py) are one kind of thing.

A `ServedModel` holds a measurement (manifest, profiles, how to load each variant), the ladder
built from it for its latency target (as profiled, and with live energies), the rung it runs
and how to load and warm a rung's session. Switching rungs is runtime/device/rung_switch.py's;
which rung to run, the control step's (power/control.py).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from power.rungs import Rung, on_device
from runtime.choice.frame_cost import FrameCosts, live_costs
from runtime.choice.ladders import Ladder, build_ladder
from runtime.choice.measure import Measured
from runtime.choice.selector import Constraints, Profile
from runtime.config.source import model_path
from runtime.frames.pipeline import Active, live_id

log = logging.getLogger("edgerun.daemon")  # the journal's name for the ladder lines


class ServedModel:
    """One model the pipeline runs (`key` "" = the [model] section's; else the `model` value
    of the sources that use it, the pipeline's Active.key)."""

    def __init__(self, key: str = "", path: Path | None = None, section: Any = None):
        self.key = key
        self.path = path  # a source's model directory (None: the [model]'s, its manifest's)
        self.section = section  # a runtime.config.ModelConfig for a source's model
        self.manifest: Any = None  # runtime.engine.manifest.Manifest, once measured
        self.profiles: list[Profile] = []
        self.idle_w = 0.0
        self.gpu_idle_w: dict[str, float] = {}  # each GPU meter's idle floor (Measured)
        self.loaders: dict = {}  # variant id -> (backend, variant)
        self.temp_c: float | None = None  # temperature while profiled
        self.by_id: dict[str, Profile] = {}
        self.host_rungs: list[Rung] = []  # as profiled (scaled to a simulated device)
        self.rungs: list[Rung] = []  # with live energies: what the control step uses
        self.current = 0  # index into rungs (shown 1-based, rung_label)
        self.reason = ""  # why the ladder is what it is (the choice, its target)
        self.pre: Any = None  # its preprocessing (None: the pipeline's own)
        # variant id -> the preprocessing path the box judged its rung on (Ladder.pre_paths)
        self.pre_paths: dict[str, str] = {}

    @classmethod
    def of_source(cls, key: str, s: Any, model: Any) -> ServedModel:
        """The model of `[[sources]]` entry `s` (key `key`), with a [model]-like section made
        from `model` (runtime.config.ModelConfig) and the entry's path and tiling."""
        path = model_path(s.model)
        return cls(key, path, replace(model, path=str(path), tiling=s.tiling,
                                      tile_size=s.tile_size, tile_overlap=s.tile_overlap,
                                      labels="", preprocess="", input_shape=()))

    @property
    def root(self) -> Any:
        """Its model directory: what a variant's backoff is keyed by, with the key (two
        versions of the [model] share variant ids, not files)."""
        return self.path if self.path is not None else self.manifest.root

    def install(self, m: Measured) -> None:
        """Take a new measurement (the ladder is rebuilt by the caller, `ladder`, `take`). A
        source's model preprocesses with its own manifest's (the [model]'s: the daemon's
        chooser, set apart)."""
        self.manifest, self.profiles, self.idle_w = m.manifest, m.profiles, m.idle_w
        self.loaders, self.temp_c, self.gpu_idle_w = m.loaders, m.temp_c, m.gpu_idle_w
        if self.key:
            self.pre = m.manifest.preprocess.apply  # one bound method: the pipeline caches

    def measured(self) -> Measured:
        """The measurement installed (a rollback installs the previous one again)."""
        return Measured(self.manifest, self.profiles, self.idle_w, self.loaders, self.temp_c,
                        self.gpu_idle_w)

    def ladder(self, constraints: Constraints, target_why: str) -> Ladder:
        """Its ladder for `constraints` and why (`target_why`: how its latency target was
        derived); raises NoVariantError when no variant fits. Changes nothing (`take`)."""
        built = build_ladder(self.profiles, constraints)
        return replace(built, reason=built.reason + (f"; {target_why}" if target_why else ""))

    def take(self, built: Ladder, sim_power: Any, live_energy: dict[str, float]) -> None:
        """Run on the ladder `built` (`sim_power`: the simulated device's power model, whose
        rungs cost this host's CPU time scaled, or None on a real device), with the live
        energies learnt so far; its preprocessing runs each rung on the path the box judged
        it on (runtime/engine/preprocessing.py)."""
        rungs, self.reason, self.pre_paths = built.rungs, built.reason, built.pre_paths
        self.pin_paths()
        self.by_id = {p.variant_id: p for p in self.profiles}
        if sim_power is not None:
            rungs = on_device(rungs, [self.by_id[r.variant_id].cpu_ms / 1e3 for r in rungs],
                              sim_power)
        self.host_rungs = rungs
        self.rungs = self.live_rungs(live_energy)
        self.current = min(self.current, len(self.rungs) - 1)
        ladder = ", ".join(f"{i + 1}: {r.variant_id} acc {r.accuracy:.3f} "
                           f"{r.energy_j * 1e3:.3f} mJ" for i, r in enumerate(self.rungs))
        if self.key:
            log.info("model %s: choice: %s; ladder: %s", self.key, self.reason, ladder)
        else:
            log.info("choice: %s; ladder (rung 1 = cheapest): %s", self.reason, ladder)

    def frame_costs(self, pipeline: Any, box_energy: Any, idle_w: float,
                    rate_hz: float) -> FrameCosts | None:
        """The stages around this ([model]'s) inference as `pipeline` served them so far,
        from `box_energy` (power.box_energy.BoxEnergy; None: not serving yet)."""
        if pipeline is None or box_energy is None:
            return None
        st = pipeline.stats()
        e2e = [s["e2e_p95_ms"] for s in st["sources"].values() if s.get("e2e_p95_ms")]
        a = pipeline.active
        return live_costs(box_energy.report(), getattr(self.pre, "report", {}),
                          {vid: v.model.input_shape for vid, (_b, v) in self.loaders.items()},
                          idle_w, rate_hz,
                          max([lane.tiles for lane in pipeline.lanes if not lane.model] + [1]),
                          max(e2e) if e2e else None, st["latency_ms"]["p95"],
                          a.variant_id if a else "")

    def pin_paths(self) -> None:
        """Hand the rungs' preprocessing paths to its chooser (a source's model has none: the
        box choice is the [model]'s)."""
        pin = getattr(self.pre, "pin", None)
        if pin is not None:
            pin(self.pre_paths)

    def session_pre(self, variant_id: str) -> Any:
        """The preprocessing a session of `variant_id` runs: the chooser's view for that
        variant (its pinned path), or the model's own preprocessing."""
        view = getattr(self.pre, "for_variant", None)
        return view(variant_id) if view is not None else self.pre

    def live_rungs(self, live_energy: dict[str, float]) -> list[Rung]:
        """Its rungs as profiled with the live energies per inference learnt so far."""
        return [replace(r, energy_j=live_energy.get(live_id(self.key, r.variant_id),
                                                    r.energy_j))
                for r in self.host_rungs]

    def by_live(self) -> dict[str, Profile]:
        """Its profiles by the id its inferences are counted under (pipeline.live_id)."""
        return {live_id(self.key, p.variant_id): p for p in self.profiles}

    def session(self, rung: int) -> Active:
        """Load and warm the session of a rung (the caller swaps it in)."""
        vid = self.rungs[rung].variant_id
        backend, variant = self.loaders[vid]
        shape = variant.model.input_shape
        session = warmed(backend.load(variant), self.manifest.preprocess, shape)
        return Active(rung, vid, session, shape, self.manifest, self.session_pre(vid),
                      key=self.key)

    def second_session(self, a: Active | None) -> Active | None:
        """Another session of the variant `a` runs (OTA's shadow sample), unwarmed; None
        when it is not one of this model's variants; raises when it will not load."""
        if a is None or a.variant_id not in self.loaders:
            return None
        backend, variant = self.loaders[a.variant_id]
        return Active(a.rung, a.variant_id, backend.load(variant), a.input_shape,
                      a.manifest or self.manifest, a.pre or self.session_pre(a.variant_id))


def old_session(m: Measured, variant_id: str, f: str) -> Active | None:
    """A session of the model measured as `m` (the version a swap replaced, for OTA's shadow
    sample, runtime/device/shadow_loads.py): of `variant_id` itself (ids carry no version), else
    of another of its variants of the form `f`; warmed (three mid-grey frames, as a rung's
    session: its first comparisons run on the inference thread), preprocessing with `m`'s
    own manifest. None when `m` has no variant of that form; raises when it will not load."""
    from runtime.frames.shadow import form

    vid = variant_id if variant_id in m.loaders else next(
        (v for v in m.loaders if form(v) == f), None)
    if vid is None:
        return None
    backend, variant = m.loaders[vid]
    shape, pre = variant.model.input_shape, m.manifest.preprocess
    return Active(-1, vid, warmed(backend.load(variant), pre, shape), shape, m.manifest,
                  pre.apply)


def warmed(session: Any, pre: Any, shape: tuple[int, ...]) -> Any:
    """`session` after three inferences of a mid-grey frame preprocessed by `pre` for
    `shape` (its first, slow ones, before it serves); closed and the error raised when one
    fails."""
    try:
        warm = pre.apply(np.full((*pre.hw(shape), 3), 128, np.uint8), shape)
        for _ in range(3):
            session.infer(warm)
    except Exception:
        session.close()
        raise
    return session


def preprocess_chooser(backends: list, manifest: Any, meter: Any, idle_w: float,
                       pins: dict[str, str] | None = None) -> Any:
    """CPU or OpenCL preprocessing for `manifest`, measured per frame size
    (runtime.engine.preprocessing.PreprocessChooser): OpenCL where a device has it and the
    model's preprocessing is one it implements; `pins`: each rung's path (Ladder.pre_paths)."""
    from runtime.engine.preprocessing import PreprocessChooser

    ocl = next((b for b in backends if b.name == "opencl" and b.devices()), None)
    factory, name = None, "opencl"
    pre = manifest.preprocess
    if ocl is not None and pre.layout == "NCHW" and pre.resize in ("bilinear", "nearest"):
        from runtime.engine.backends.opencl import OpenClPreprocessor

        dev = ocl.devices()[0].id
        name = f"opencl:{dev}"
        cache: dict = {}

        def factory(shape, ocl=ocl, dev=dev, cache=cache):
            if shape not in cache:
                cache[shape] = OpenClPreprocessor(ocl, dev, pre, shape)
            return cache[shape]

    return PreprocessChooser(pre, meter, idle_w, factory, name, pins)
