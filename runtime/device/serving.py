"""What the device serves and why, with one owner: `Serving`.

It holds the constraints and governor settings in force (`cfg`), the control state and the
last control output, the last reading, every served model and the box's ladder (`box`), the
sources' plan, the rung switch, the live energies and the accelerator's drift watch, and the
watches that say when readings go bad or an upgrade is refused. Each of these fields is
written here and nowhere else; the rest of the daemon reads them, or asks through a verb:

    tick(now)            one control step (power/control.py) and what follows it: the rung
                         and rate cap applied, live energy, the tiles' re-plan, re-profiling
    set_constraints(..)  new constraints (and governor settings): the ladders rebuilt
    rebuild(why)         the ladders rebuilt under the constraints in force
    restore(old)         back to a config after a reload failed half-way through applying it
    install_model(..)    a measured [model] made current (a re-profile, OTA, a re-rank)

Its collaborators are named in the constructor (Home Assistant's coordinators and Frigate's
subsystems are made the same way): the device profile and its sensors and meters, the
profiler, the operator's state, the sources' plan, an event sink, systemd's notifier, and
`changed`, called when the [model] or its rung changed (the daemon takes a new snapshot and
birth). The pipeline is handed over by `start`, once the first models are measured.

Main loop only, but `measure` on the reprofile thread too.
"""

from __future__ import annotations

import logging
import math
import queue
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from power import control
from power.accel_throttle import read_devfreq
from power.control_settings import control_config
from power.cputime import named_threads_cpu_s
from power.device import DeviceProfile
from power.energy import EnergyState
from power.nvml import meter_for
from power.rungs import Rung, with_other
from power.sensors import Reading
from runtime.choice.measure import Measured, measure_first, measure_model
from runtime.choice.selector import Constraints, NoVariantError
from runtime.config import Config
from runtime.device.conditions import conditions
from runtime.device.live_energy import LiveEnergy
from runtime.device.model_ladder import Box
from runtime.device.operator_state import OperatorState
from runtime.device.profiling import Install, Profiler, progress_reporter
from runtime.device.rung_switch import RungSwitch
from runtime.device.sensing import RefusalWatch, Sensing, SensorWatch
from runtime.device.served_model import ServedModel, preprocess_chooser
from runtime.device.serving_drift import ServingDrift
from runtime.device.source_plan import SourcePlan
from runtime.engine.backends import discover
from runtime.frames.multisource import planned_rate
from runtime.frames.pipeline import Active, Pipeline

log = logging.getLogger("edgerun.daemon")  # one logger for all the daemon's parts


class Serving:
    """What is served and why (module doc). Main thread only, but `measure`."""

    def __init__(self, cfg: Config, *, device: DeviceProfile, sensing: Sensing, meter: Any,
                 gpu_meters: list, box_energy: Any, profiler: Profiler,
                 operator: OperatorState, state_dir: Path, installs: queue.Queue[Install],
                 event: Callable[..., None], notify: Any, stopping: Callable[[], bool],
                 changed: Callable[[], None], energy: EnergyState | None = None,
                 simulated: bool = False):
        """`cfg`: the configuration at the start (the operator's overrides applied);
        `meter`/`gpu_meters`: power.sensors' and power/nvml.py's (a GPU variant is billed its
        own); `box_energy`: power.box_energy.BoxEnergy; `state_dir`: where a source keeps
        its state (a trigger's replay); `installs`: where the background
        threads queue what they measured; `notify`: runtime.device.systemd.Notifier;
        `energy`: the harvest forecast kept across restarts; `simulated`: the device is
        runtime/device/simdevice.py's plant, not this host."""
        self.cfg = cfg  # in force: its constraints and governor change here only
        self.device = device
        self.sensors = sensing.sensors
        self.thermal = sensing.thermal
        self.trips = sensing.trips
        self.thermal_disabled = sensing.disabled  # why the thermal governor is off
        self.meter = meter
        self.gpu_meters = gpu_meters
        self.box_energy = box_energy
        self.profiler = profiler
        self.operator = operator
        # the sources' model keys, tiles and targets, under the constraints in force
        self.plan = SourcePlan(lambda: self.cfg, state_dir)
        self.installs = installs
        self.event = event
        self.notify = notify
        self.stopping = stopping
        self.changed = changed
        self.simulated = simulated
        self.box = Box(self.plan)  # every served model and the box's ladder over them
        self.switch = RungSwitch(event)  # the actuator
        self.energy = LiveEnergy()  # each running variant's J per inference, learnt live
        self.drift = ServingDrift()  # an accelerator variant's, on its meter; re-ranks
        self.refusals = RefusalWatch()  # says why the rung is not stepping up, not each tick
        self.sensor_watch = SensorWatch()  # says when readings go bad, not at each
        self.ccfg: control.ControlConfig | None = None
        self.duty_cycled = False  # set_duty_cycled: a duty cycle spends the battery
        self.cstate = control.ControlState(energy=energy)
        self.out: control.Output | None = None  # the last control step's
        self.reading: Reading | None = None
        self.pipeline: Pipeline | None = None  # set by start
        self.backends: list = []  # the engines, discovered once (runtime.device.installing)
        self.devices: list[dict] = []  # their devices, fixed for the process
        self.model_gen = 0  # bumped when another model is installed: older jobs are stale

    # -- start ----------------------------------------------------------------------------

    def start(self, pipeline: Pipeline) -> None:
        """Serve on `pipeline`: each model on its top rung, the operator's rate cap kept."""
        self.pipeline = pipeline
        pipeline.set_slo(*self.cfg.constraints.in_force())
        for m in self.box.models:
            m.current = len(m.rungs) - 1
        self.box.joint_current = len(self.box.joint) - 1
        pipeline.start(self.box.model.session(self.box.model.current),
                       {k: m.session(m.current) for k, m in self.box.source_models.items()})
        if math.isfinite(self.operator.rate_hz):
            pipeline.rate_cap_hz = self.operator.rate_hz

    # -- the control tick -------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Read sensors, run the one control step (power.control), apply its rung and rate
        cap; live energy, the tiles' re-plan and re-profiling get their turn. `now`: the
        monotonic time of the tick."""
        r = self.sensors.read()
        self.reading = r
        if (said := self.sensor_watch.read(r, self.cfg.governor.hold_invalid_s)) is not None:
            self.event("sensor_invalid", "warning", problems=list(r.problems), bad_reads=said)
        self._update_live_energy()
        self.drift.tick(self)
        if self.box_energy is not None:
            self.box_energy.sample(now, *self.pipeline.take_stage_cpu(),
                                   lambda: named_threads_cpu_s("mqtt"))
        assert self.ccfg is not None
        self._check_tiles()
        box = self.box
        rungs = box.control_rungs()
        if not self.simulated and self.box_energy is not None:
            # budgets are box watts: the stages around inference draw power too (a simulated
            # plant heats with its rungs alone, so a simulation leaves them out)
            rungs = with_other(rungs, self.box_energy.around_j())
        self.cstate, out = control.step(self.cstate, r, rungs, self.ccfg,
                                        box.control_current(), self.operator.rate_hz)
        self.out = out
        if self.refusals.due(out.refused, r.t):
            log.info("not stepping up: %s (rung %d/%d)", out.refused,
                     box.control_current() + 1, len(rungs))
        for e in out.events:
            (log.critical if e.severity == "critical" else log.warning)("%s: %s", e.type,
                                                                         e.detail)
            self.event(e.type, e.severity, detail=e.detail)
        self.pipeline.rate_cap_hz = out.rate_cap_hz
        if out.rung != box.control_current() or box.off_chain:
            for m, i in box.picks(out.rung):  # the [model]'s rung, or each model's part
                self.move(m, i, out.reason or "budget")
            box.relocate()
        if box.control_current() != out.rung:  # the switch failed: keep what runs
            self.cstate = replace(self.cstate, hold=replace(self.cstate.hold,
                                                            rung=box.control_current()))
        self.operator.keep_energy(self.cstate.energy)  # when an hour slot closed
        self._check_conditions(self.temperature())

    def temperature(self) -> float | None:
        """The temperature the governor acts on (its last step's: the median of its readings
        or the die estimate, held through bad readings), else the sensor's reading now (before
        the first step). A re-profile is judged on it and a profile records it, so that both
        ends of the comparison are one quantity: on the raw reading one glitch started a
        re-profile, and a jump the governor had not yet followed started one whose quick
        round installed the top rung at 95 °C (nothing held the device down yet); a profile
        made while the sensor held recorded None, and no temperature re-profile came again."""
        out = self.out
        if out is not None and out.temp_c is not None:
            return out.temp_c
        return self.sensors.read().temp_c

    def _check_conditions(self, temp: float | None) -> None:
        """Act on what the tick's conditions call for (runtime/device/conditions.py): the
        events, and a re-profile when the device asks for it (Profiler.due, judged on `temp`);
        nothing for a simulated device."""
        calls = conditions(self.simulated, lambda: self.profiler.due(
            temp, self.pipeline, self.box.model, self.cfg.daemon, self.live_energy_j(),
            self.accelerator_state))
        for e in calls.events:
            self.event(e.type, e.severity, **e.fields)
        if calls.reprofile:
            self.reprofile(calls.reprofile)

    def accelerator_state(self, actual_device: str) -> Any:
        """What the accelerator a session reports says of its clocks (NVML's clock-event
        reasons, else the profile's GPU devfreq; power/accel_throttle.py), or None."""
        m = meter_for(self.gpu_meters, actual_device)
        if m is not None:
            return m.clock_state()
        devfreq = self.device.sensors.gpu_devfreq  # a SoC GPU: devfreq
        return read_devfreq(Path(self.cfg.device.sysfs_root) / devfreq) if devfreq else None

    # -- the load the running rung puts on the device ----------------------------------------

    def frame_rung(self) -> Rung | None:
        """The running rung per frame of any source (tiles and several models counted)."""
        return None if self.pipeline is None or not self.box.model.rungs else \
            self.box.frame_rung()

    def sim_load(self) -> tuple[Rung | None, float]:
        """The rung running and the rate it is offered, under the caps now in force (what
        the simulated device heats with)."""
        rung = self.frame_rung()
        if rung is None:
            return None, 0.0
        assert self.ccfg is not None
        return rung, min(self.ccfg.rate_hz, self.pipeline.rate_cap_hz)

    def load_w(self) -> float:
        """Dynamic power of the inference load: the running rung at the rate it runs. A
        simulated device reports the offered rate, which is what its plant heats with; a real
        one the rate achieved over the last 30 s (a source slower than the plan, or a pause,
        draws less than the plan)."""
        rung, rate = self.sim_load()
        if rung is None:
            return 0.0
        return rung.power_w(rate if self.simulated else self.pipeline.rate_hz())

    # -- the ladders --------------------------------------------------------------------------

    def constraints(self, key: str = "") -> Constraints:
        """The selector's constraints for a model ("" = the [model]'s): the config's
        [constraints] translated, with the model's latency target and, judged end to end,
        what a frame costs around inference."""
        c, g = self.cfg.constraints, self.cfg.governor
        # with an end-to-end target, inference alone must fit in it: the ladder's lower
        # rungs keep that bound (runtime/choice/selector.py judges the frame end to end,
        # by the box's energy per frame, on what serving has measured so far)
        return replace(c, latency_ms=c.end_to_end_ms or self.plan.target(key)[0],
                       # accelerators ranked at the rate frames are offered, not back to
                       # back (runtime/choice/at_rate.py)
                       rate_hz=g.rate_hz,
                       frame=self.box.model.frame_costs(self.pipeline, self.box_energy,
                                                        self.device.power.idle_w, g.rate_hz)
                       if c.end_to_end_ms and not key else None)

    def build(self) -> None:
        """Each model's rungs from its profiles (scaled to the simulated device when
        simulating, kept current from the running pipeline otherwise), the box's ladder with
        several models (runtime.device.model_ladder), and the control settings for them."""
        self.box.build(self.constraints, self.device.power if self.simulated else None,
                       self.energy.live)
        self._configure_control()

    def _configure_control(self) -> None:
        """The control step's settings (power/control_settings.py) for the ladder built."""
        g = self.cfg.governor
        self.ccfg = control_config(
            self.device, g, self.thermal if not self.thermal_disabled else None,
            # several sources: rung powers at their combined rate, so budgets are the box's
            planned_rate(self.plan.streams() if self.cfg.sources else (), g.rate_hz)
            or self.box.control_rungs()[-1].max_rate_hz()
            * (self.cfg.simulator.offered_share if self.simulated else 1.0),
            duty_cycled=self.duty_cycled)

    def set_duty_cycled(self, on: bool) -> None:
        """A duty cycle spends the battery now (runtime/device/sleep.py: [sleep] enabled on
        a board that can suspend): the energy budget leaves the rung and the rate to the
        thermal governor (power/control_settings.py says why)."""
        self.duty_cycled = on
        if self.ccfg is not None:
            self._configure_control()

    def rebuild(self, why: str) -> None:
        """The ladders rebuilt under the constraints in force, then each model on its rung
        after (`_after_rebuild`); raises NoVariantError, changing nothing, when none fits."""
        held = self.box.held_down()
        self.build()
        self._after_rebuild(why, held)

    def _check_tiles(self) -> None:
        """A source whose frames cost another number of tiles than planned (a camera's size
        is known only from its frames): re-plan the targets and the box's ladder."""
        why = self.plan.learn_tiles(self.pipeline.lanes)
        if not why:
            return
        log.info("%s: latency targets and the ladders re-planned", why)
        try:
            self.rebuild(why)
        except NoVariantError as e:
            log.error("re-planning for the tiles failed (%s); keeping the ladders", e)

    def _after_rebuild(self, why: str, held: bool) -> None:
        """After the ladder was rebuilt: its top rung when nothing held the device down;
        otherwise the running variant's rung on the new ladder (the cheapest if it is gone):
        a re-profile starts *because* it got hot, and must not run the top rung for a tick
        at 95 °C. The control loop raises it when the budget allows. The same rule for each
        source's own model."""
        box, p = self.box, self.pipeline
        for m in box.models:
            # what runs or is about to: a step-down the infer thread has not swapped in yet
            # (no frame since it was asked: a hot box's rate is held down) is where it is;
            # the swapped-in session was the rung it stepped down from, the top one at 95 °C
            a = p.target_of(m.key)
            top = len(m.rungs) - 1
            i = next((k for k, r in enumerate(m.rungs) if a and r.variant_id == a.variant_id),
                     0) if held else top
            m.current = min(m.current, top)
            self.move(m, i, why)
        box.build_joint()
        # the indices of the old ladder mean nothing on the new one: no actuation to judge a
        # step from, no excursion to come back from
        self.cstate = replace(self.cstate, hold=replace(self.cstate.hold,
                                                        rung=box.control_current(),
                                                        dwell_s=None),
                              actuation=None, excursion=None)

    def move(self, m: ServedModel, rung: int, why: str) -> None:
        """Switch one model to a rung of its ladder (an event); the [model]'s also tells
        `changed` (a new snapshot, birth and systemd status)."""
        if self.switch.move(m, rung, why, self.pipeline) and m is self.box.model:
            self.changed()

    def set_constraints(self, c: Any, why: str = "new constraints",
                        governor: Any = None) -> None:
        """Rebuild the ladder for new constraints (and governor settings) and go to its top
        (or stay down, see _after_rebuild); on NoVariantError (raised as ValueError)
        everything stays as it was."""
        old = self.cfg
        held = self.box.held_down()
        self.cfg = replace(old, constraints=c, governor=governor or old.governor)
        try:
            self.build()
        except NoVariantError as e:
            self.cfg = old
            self.build()
            raise ValueError(str(e)) from e
        self.pipeline.set_slo(*c.in_force())
        self._after_rebuild(why, held)

    def restore(self, old: Config) -> None:
        """Back to `old` after a reload failed half-way through applying it."""
        self.cfg = old
        try:
            self.build()
            self.pipeline.set_slo(*old.constraints.in_force())
        except Exception:
            log.exception("could not rebuild the ladder of the previous config")

    # -- live energy --------------------------------------------------------------------------

    def _update_live_energy(self) -> None:
        """Keep the running rung's energy per inference current (runtime/device/
        live_energy.py). Frozen while profiling (the profiler's work would be billed to it)
        and when simulating (this host's pipeline is not the simulated device: its rungs
        keep the profiles' CPU time scaled by the device profile)."""
        p = self.pipeline
        if self.simulated:  # no /proc reads at the simulator's tick rate (every 10 ms at 300x)
            p.take_infer_cpu()
            return
        running = self.running_id()
        if not self.energy.update(p.take_infer_cpu, running, self.box.model.by_id.get(running),
                                  self.box.by_live, self.profiler.lock.locked(),
                                  lambda: self.device.power.active_w_per_core):
            return
        for m in self.box.models:  # the [model]'s first, then each source's own
            m.rungs = m.live_rungs(self.energy.live)
        if self.box.source_models:
            self.box.build_joint()

    def running_id(self) -> str:
        """The [model]'s variant the pipeline runs ("": none)."""
        a = self.pipeline.active if self.pipeline is not None else None
        return a.variant_id if a else ""

    def live_energy_j(self) -> float | None:
        """The running [model] variant's live energy per inference (None: none yet)."""
        return self.energy.live.get(self.running_id())

    def target_ms(self) -> float:
        """The [model]'s per-inference latency target."""
        return self.plan.target("")[0]

    def second_session(self) -> Active | None:
        """Another session of the running [model] variant (None: not one of its own)."""
        return self.box.model.second_session(self.pipeline.active)

    # -- models measured and installed ---------------------------------------------------------

    def discover_engines(self) -> None:
        """The engines and their devices, once per process: re-creating them (a second
        ov.Core while the first is torn down) was seen to leave the process crashing on its
        next signal."""
        self.backends = discover(self.cfg.backends)
        self.devices = [{"backend": b.name, "id": dev.id, "name": dev.name, **dev.details}
                        for b in self.backends for dev in b.devices()]

    def measure(self, path: Path, fresh: bool = False, first_only: bool = False,
                key: str = "", section: Any = None) -> Any:
        """The whole profiling schedule (a Measured), measured between the pipeline's frames
        once it runs; or, with `first_only`, measure_first's (first Measured, rest or None).
        `key`/`section`: a source's own model (its target and its [model]-like section).
        Raises runtime.device.profiling.Stopping when a stop is requested."""
        cfg = self.cfg if section is None else replace(self.cfg, model=section)
        recorded = Path(cfg.simulator.profiles) if (cfg.simulator.enabled
                                                    and cfg.simulator.profiles) else None
        args = (path, cfg, self.backends, self.meter, self.device.name,
                self.device.power.active_w_per_core, self.temperature(),
                self.variant_refused, progress_reporter(self.notify, self.stopping),
                self.constraints(key), fresh, recorded)
        billing = {"accelerators": self.device.accelerators, "gpu_meters": self.gpu_meters}
        if first_only:
            return measure_first(*args, **billing)
        return measure_model(*args, pause=self.pipeline.exclusive if self.pipeline else None,
                             **billing)

    def variant_refused(self, variant: str, error: str) -> None:
        """A variant that would not run: the others serve (an error line, a critical event)."""
        log.error("variant %s refused: %s; running on the others", variant, error)
        self.event("variant_refused", "critical", variant=variant, error=error)

    def install(self, m: Measured, ladder: bool = True) -> None:
        """Make measured profiles current and rebuild the ladder (`ladder` False: the caller
        builds it, at start-up once the sources' own models are in)."""
        model = self.box.model
        old = model.manifest
        if old is not None and Path(m.manifest.root) != Path(old.root):
            self.model_gen += 1  # profiles of the model before are stale from now on
        model.install(m)
        self.energy.forget_model()  # the sources' own models did not change
        if ladder:
            self.build()
        if self.pipeline is not None:  # a new model brings its own preprocessing to measure
            # (another version with the same preprocessing keeps the measured choice:
            # measuring again runs 21 preprocessings inline on the first frame after the swap)
            self.pipeline.set_manifest(model.manifest, model.pre if (
                old is not None and old.preprocess == model.manifest.preprocess)
                else self.new_preprocess_chooser())

    def install_model(self, measured: Measured, why: str) -> float:
        """Install a measured [model] and go to its top rung, or stay down
        (_after_rebuild); the seconds the ladder took (the rest loaded and warmed the
        session)."""
        held = self.box.held_down()
        t0 = time.perf_counter()
        self.install(measured)
        took = time.perf_counter() - t0
        self._after_rebuild(why, held)
        return took

    def new_preprocess_chooser(self) -> Any:
        """A new preprocessing choice for the [model] (CPU or OpenCL, measured per size)."""
        m = self.box.model
        m.pre = preprocess_chooser(self.backends, m.manifest, self.meter, m.idle_w,
                                   m.pre_paths)
        return m.pre

    def load_in_background(self, path: Path, fresh: bool, why: str,
                           wait: bool = False) -> None:
        """Profile `path` on the reprofile thread (runtime.device.profiling); the main loop
        installs the result between ticks (`apply_installs`). `wait`: after the profiling
        under way."""
        self.profiler.load(lambda: self.measure(path, fresh), why, self.model_gen, wait)

    def reprofile(self, why: str) -> None:
        """Measure every variant again in the background and rebuild the ladder."""
        self.load_in_background(self.box.model.manifest.root, True, why)

    def reprofile_now(self, why: str) -> None:
        """Re-profile, however recently the last one ran (an operator's command)."""
        self.profiler.last = -math.inf
        self.reprofile(why)

    def apply_installs(self, apply_version: Callable[[Measured, str, str], None]) -> None:
        """Install what the background threads measured (the main loop's turn); a model-store
        version goes to `apply_version` (runtime.device.ota.DeviceOta.apply: the pointer
        switch, the swap and probation)."""
        while True:
            try:
                job = self.installs.get_nowait()
            except queue.Empty:
                return
            if job.version:
                apply_version(job.measured, job.why, job.version)
            elif job.gen is not None and job.gen != self.model_gen:  # began before a swap
                log.info("%s: dropped, it profiled %s and another model was installed "
                         "since it began", job.why, job.measured.manifest.name)
            else:
                self.install_model(job.measured, job.why)
