"""`edgerun serve`: the long-running appliance process.

Start-up order (each step logs; a failure says which step and why):
config -> device profile -> simulator (if enabled) -> sensors -> outbox -> model manifest and
profiles (cached) -> selector and ladder -> first session loaded and warmed -> pipeline ->
MQTT publisher -> READY=1.

The main thread then runs the control loop: governor + energy budget every `governor.tick_s`
(pure decisions from power/), commands from the publisher's queue, health every
`telemetry.health_interval_s`, WATCHDOG=1 only while the infer loop's heartbeat is fresh, and
signals: SIGTERM drains in-flight frames and stops; SIGHUP reloads the config (an invalid file
is reported and the old config kept).

`Daemon` is the composition root: `start()` names its steps, `run()` is the main loop, and the
work lives in its parts (runtime/device/): a model and its ladder `served_model.py` (the
[model]'s and each source's own alike), the models and the box's ladder `box.py`, the sources'
keys, tiles and targets `source_plan.py`, switching rungs `rung_switch.py`, the commands and
SIGHUP `commands.py`, the operator's state `operator_state.py`, background profiling
`profiling.py`, sensors `sensing.py`, live energy `live_energy.py`, the STATUS= line and birth
fields `status.py`, the stop's order `shutdown.py`. OTA, sleep, health, status and the stop
reach the daemon through the Protocols of `host.py`.
"""

from __future__ import annotations

import logging
import math
import queue
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from power import control
from power.accel_throttle import read_devfreq
from power.box_energy import BoxEnergy
from power.cputime import named_threads_cpu_s
from power.device import DeviceProfile
from power.nvml import gpu_meters, meter_for
from power.rungs import Rung, with_other
from power.sensors import Reading, SensorSet, detect_meter
from power.thermal_source import ThermalSource
from runtime.choice.ladders import ladder_for
from runtime.choice.measure import Measured, measure_first, measure_model
from runtime.choice.selector import Constraints, NoVariantError
from runtime.config import Config, ConfigError, load
from runtime.device import commands
from runtime.device.box import Box
from runtime.device.health import health, share_reasons, versions
from runtime.device.host import Install, Stopping
from runtime.device.live_energy import LiveEnergy
from runtime.device.local_api import LocalApi, start_local_api
from runtime.device.operator_state import OperatorState
from runtime.device.ota import DeviceOta
from runtime.device.profiles import load_profile
from runtime.device.profiling import (
    Profiler,
    progress_reporter,
)
from runtime.device.rung_switch import RungSwitch, rung_label
from runtime.device.sensing import RefusalWatch, SensorWatch, control_config, open_sensors
from runtime.device.served_model import ServedModel, preprocess_chooser
from runtime.device.shutdown import stop_steps
from runtime.device.source_plan import SourcePlan, bundled_model
from runtime.device.state import DeviceState, snapshot
from runtime.device.status import birth, ha_info, status_line
from runtime.device.systemd import Notifier
from runtime.device.wakeup import Wakeup, WakingQueue
from runtime.engine.backends import discover
from runtime.frames.multisource import planned_rate
from runtime.frames.pipeline import Active, Pipeline
from runtime.frames.results_local import LocalResults
from runtime.telemetry.client import Publisher, device_id
from runtime.telemetry.homeassistant import Discovery
from runtime.telemetry.outbox import Outbox
from runtime.wire.commands import Command
from runtime.wire.health_history import HealthHistory

log = logging.getLogger("edgerun.daemon")

# The main loop sleeps until its next duty; at most this long, so the status line and a
# watchdog beat held back by a stalled pipeline are looked at again soon.
MAX_SLEEP_S = 1.0


class Daemon:
    """One `edgerun serve` process (see module docstring). Wires the parts and loops; the
    decisions live in power.control, the measurements in runtime.choice.measure, the health message
    in runtime.device.health."""

    def __init__(self, cfg: Config, config_path: Path | None = None):
        self.cfg = cfg
        self.config_path = config_path
        self.notify = Notifier()
        self.state_dir = Path(cfg.daemon.state_dir).expanduser()
        self.started = time.monotonic()
        # Set by signal handlers, read by the main loop. Plain attributes on purpose: a handler
        # that takes a lock (Event.set) can deadlock against the main thread's own wait.
        self._stop_requested = False
        self._reload_requested = False
        self.wakeup = Wakeup()  # the main loop sleeps on it (runtime/device/wakeup.py)
        self.sim: Any = None  # runtime.device.simdevice.SimulatedDevice when simulating
        self.publisher: Publisher | None = None
        self.sparkplug: Any = None  # runtime.telemetry.sparkplug.node.SparkplugNode ([sparkplug])
        self.local_api: LocalApi | None = None  # opt-in /metrics and /healthz ([local_api])
        self.plc: Any = None  # runtime.telemetry.opcua_server.PlcServer ([opcua], docs/plc.md)
        self.sleeper: Any = None  # runtime.device.sleep.Sleeper when [sleep] is enabled
        self.ota: DeviceOta | None = None  # model versions, deploy, probation ([models])
        self.operator = OperatorState(self.state_dir)  # overrides and learnt state, kept
        # -- parts made by start(), in its order --
        self.device: DeviceProfile | None = None
        self.sensors: SensorSet | None = None
        self.meter: Any = None  # power.sensors.PowerMeter
        self.box_energy: BoxEnergy | None = None  # the box's energy per frame
        self.outbox: Outbox | None = None
        self.device_id = ""
        self.backends: list = []
        self.devices: list[dict] = []  # discovered once, fixed for the process
        self.pipeline: Pipeline | None = None
        self.local: LocalResults | None = None  # [results]: print, JSONL, snapshots
        # -- the models and their ladders --
        # model keys, tiles and targets of the sources
        self.plan = SourcePlan(lambda: self.cfg, self.state_dir)
        self.box = Box(self.plan)  # every served model and the box's ladder over them
        self.switch = RungSwitch(lambda *a, **kw: self.event(*a, **kw))  # the actuator
        # -- control --
        self.ccfg: control.ControlConfig | None = None
        self.cstate = control.ControlState()
        self.control_out: control.Output | None = None
        self.reading: Reading | None = None
        self.trips: dict[str, float] = {}
        self.thermal_disabled = ""  # why the thermal governor is off despite the config
        self.thermal: ThermalSource | None = None  # (runtime.device.sensing)
        self.refusals = RefusalWatch()  # says why the rung is not stepping up, not at each tick
        self.sensor_watch = SensorWatch()  # says when readings go bad, not at each
        self.energy = LiveEnergy()  # each running variant's J per inference, learnt live
        self.history = HealthHistory(self.state_dir)  # for `edgerun report` when offline
        # the device at the last tick, frozen: what every reader reads (runtime/device/
        # state.py); replaced whole by the main loop, None until the pipeline runs
        self.state: DeviceState | None = None
        # -- background profiling --
        self._installs: queue.Queue[Install] = WakingQueue(self.wakeup.set)
        self.queue_install = self._installs.put  # an Install for the main loop (any thread)
        self.profiler = Profiler(lambda *a, **kw: self.event(*a, **kw), self.queue_install)
        self.print_results = False  # `serve --print` (serve() sets it; reload keeps it)
        self._model_gen = 0  # bumped when another model is installed: older jobs are stale

    # -- start-up --------------------------------------------------------------------------

    def start(self) -> None:
        """Bring every part up in order; raises with the failing step named."""
        self._restore_operator_state()
        self._open_device()
        self._open_outbox()
        self._open_links()
        rest = self._install_models()
        self._start_pipeline()
        self.refresh_state()  # birth, Home Assistant and OPC UA read it from now on
        self._start_services()
        self.refresh_state()
        self.notify.ready(self.status_line())
        log.info("ready in %.2f s: %s", time.monotonic() - self.started, self.status_line())
        if rest is not None:  # the fast schedule: serve on the first choice, refine meanwhile
            self.profiler.run(lambda: rest(self.pipeline.exclusive), "profiling refined",
                              self._model_gen)

    def _restore_operator_state(self) -> None:
        """Commands sent earlier outlive restarts (and the config file's [constraints]); so
        do the harvest forecast learnt and the operator's rate cap."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.cstate = replace(self.cstate, energy=self.operator.load())
        if self.operator.settings:
            self.cfg = replace(self.cfg, constraints=self.operator.constraints(
                self.cfg.constraints))

    def _open_device(self) -> None:
        """The device profile, the simulator (if enabled), the sensors and the power meter."""
        cfg = self.cfg
        self.device = load_profile(cfg.device.profile)
        root = Path(cfg.device.sysfs_root)
        if cfg.simulator.enabled:
            from runtime.device.simdevice import SimulatedDevice

            root = Path(cfg.simulator.root or self.state_dir / "sim-sysfs")
            self.sim = SimulatedDevice(self.device, root, cfg.simulator.scenario,
                                       cfg.simulator.speed, cfg.simulator.start_hour,
                                       self._sim_load, cfg.constraints.latency_ms / 1e3,
                                       duration_s=cfg.simulator.hours * 3600 or math.inf)
            log.info("simulated %s, scenario %s at %gx, sysfs tree %s", self.device.name,
                     cfg.simulator.scenario, cfg.simulator.speed, root)
        clock = (lambda: self.sim.plant.s.t) if self.sim else time.time
        found = open_sensors(root, self.device, cfg.governor.policy, clock)
        self.sensors, self.thermal, self.trips = found.sensors, found.thermal, found.trips
        self.thermal_disabled = found.disabled
        self.meter = detect_meter(root, self.device)
        self.box_energy = BoxEnergy(self.meter, self.device.power.idle_w,
                                    self.device.power.active_w_per_core,
                                    lambda t, sev, f: self.event(t, sev, **f))
        self.gpu_meters = gpu_meters()  # a GPU variant is billed its own meter (power/nvml.py)

    def _open_outbox(self) -> None:
        """The outbox, and the events that waited for it (its own start-up, the governor)."""
        self.outbox = Outbox(self.cfg.telemetry.outbox, on_event=self._event_of)
        if (ev := self.outbox.take_startup_event()) is not None:
            self.event(ev.pop("type"), "critical", **ev)
        if self.thermal_disabled:
            self.event("governor_disabled", "critical", reason=self.thermal_disabled)

    def _open_links(self) -> None:
        """The local API (503 until the pipeline runs), OTA and the publisher: made now so a
        bad key file fails before minutes of profiling."""
        cfg = self.cfg
        self.device_id = device_id(cfg.telemetry)
        self.plan.device_id = self.device_id
        self.local_api = start_local_api(  # up during profiling: 503 until the pipeline runs
            cfg.local_api, self.latest_health,
            lambda: self.pipeline.alive(cfg.local_api.stall_s), self.device_id)
        try:
            self.ota = DeviceOta(self, cfg.models, cfg.telemetry, self.state_dir,
                                 self.device_id)
            if cfg.opcua.enabled:  # [opcua]: certificates read now; PLC edges for the sources
                from runtime.telemetry.opcua_server import open_plc

                self.plc = open_plc(cfg)
                self.plan.edges = self.plc.edges
        except (ValueError, ImportError) as e:  # a key file, an [opcua] file or asyncua
            raise ConfigError(str(e)) from e
        if not cfg.telemetry.broker.host:
            return
        try:
            ha = Discovery(cfg.homeassistant, cfg.telemetry.fleet, self.device_id,
                           self.state_dir, lambda: ha_info(self.state),
                           cfg.telemetry.result_per_message)
            self.publisher = Publisher(cfg.telemetry, self.outbox, lambda: birth(self.state),
                                       state_dir=self.state_dir, homeassistant=ha,
                                       session_expiry_s=(cfg.sleep.session_expiry_s
                                                         if cfg.sleep.enabled else 0),
                                       precheck=self.ota.precheck,
                                       command_queue=WakingQueue(self.wakeup.set, 100))
        except ValueError as e:  # an unreadable trusted key or device key file
            raise ConfigError(str(e)) from e
        if cfg.sparkplug.enabled:  # imported only then: protobuf and the schema cost ~3 MB
            from runtime.telemetry.sparkplug.node import sparkplug_node

            self.sparkplug = sparkplug_node(cfg.sparkplug, cfg.telemetry, self.device_id,
                                            self.outbox, self.state_dir, self.event)

    def _install_models(self) -> Callable | None:
        """The engines (discovered once per process), the [model]'s model (the version OTA
        serves) measured on the first schedule, and each source's own model; returns the rest
        of the [model]'s schedule (to refine in the background) or None."""
        cfg = self.cfg
        path = self.ota.model_path(Path(cfg.model.path) if cfg.model.path else bundled_model())
        # Engines are discovered once per process: re-creating them (a second ov.Core while the
        # first is torn down) was seen to leave the process crashing on its next signal.
        self.backends = discover(cfg.backends)
        self.devices = [{"backend": b.name, "id": d.id, "name": d.name, **d.details}
                        for b in self.backends for d in b.devices()]  # fixed for the process
        first, rest = self.ota.first_model(
            path, lambda p: self._measure_model(p, first_only=True))
        # one ladder, built once every model is in: building it here too logged the start-up
        # `choice:` line twice (issue 32)
        self._install(first, ladder=False)
        self._install_source_models()
        return rest

    def _start_pipeline(self) -> None:
        """Local results, the pipeline, each model on its top rung."""
        cfg = self.cfg
        if cfg.results.enabled:
            self.local = LocalResults(cfg.results, self._event_of)
            self.local.start()
        lanes = self.plan.lanes(self.sim.clock if self.sim else None)
        sink = self.plc.tap(self.outbox.append_many) if self.plc else self.outbox.append_many
        self.pipeline = Pipeline(lanes, self.box.model.manifest, sink,
                                 self._event_of, cfg.daemon.queue_size,
                                 self._preprocess_chooser(), self.local)
        self.pipeline.set_slo(*cfg.constraints.in_force())
        for m in self.box.models:
            m.current = len(m.rungs) - 1
        self.box.joint_current = len(self.box.joint) - 1
        self.pipeline.start(self.box.model.session(self.box.model.current),
                            {k: m.session(m.current) for k, m in self.box.source_models.items()})
        if math.isfinite(self.operator.rate_hz):
            self.pipeline.rate_cap_hz = self.operator.rate_hz

    def _start_services(self) -> None:
        """OTA (a probation resumes), the simulator, duty cycling, MQTT."""
        self.ota.started()
        if self.sim:
            self.sim.start()
        from runtime.device import sleep as sleep_mod

        self.sleeper = sleep_mod.create(self)
        if self.sparkplug:
            self.sparkplug.start()
        if self.plc:
            try:
                self.plc.start(self.latest_health)
            except ValueError as e:  # the port taken, a certificate asyncua refuses
                raise ConfigError(str(e)) from e
        if self.publisher:
            self.publisher.start()
        else:
            log.info("no telemetry.broker.host: results are kept in the outbox only")
            if (self.cfg.homeassistant.enabled or self.cfg.telemetry.result_per_message
                    or self.cfg.sparkplug.enabled):
                log.warning("homeassistant.enabled / telemetry.result_per_message / "
                            "sparkplug.enabled need a broker "
                            "(telemetry.broker.host); nothing is published")

    # -- measuring and installing models ---------------------------------------------------

    def _measure_model(self, path: Path, fresh: bool = False, first_only: bool = False,
                       key: str = "", section: Any = None):
        """The whole profiling schedule (a Measured), measured between the pipeline's frames
        once it runs; or, with `first_only`, measure_first's (first Measured, rest or None).
        `key`/`section`: a source's own model (its target and its [model]-like section)."""
        cfg = self.cfg if section is None else replace(self.cfg, model=section)
        recorded = Path(cfg.simulator.profiles) if (cfg.simulator.enabled
                                                    and cfg.simulator.profiles) else None
        args = (path, cfg, self.backends, self.meter, self.device.name,
                self.device.power.active_w_per_core, self.sensors.read().temp_c,
                self._variant_refused, progress_reporter(self.notify, self.stopping),
                self._constraints(key), fresh,
                recorded)
        billing = {"accelerators": self.device.accelerators, "gpu_meters": self.gpu_meters}
        if first_only:
            return measure_first(*args, **billing)
        return measure_model(*args, pause=self.pipeline.exclusive if self.pipeline else None,
                             **billing)

    measure_model = _measure_model  # OtaHost's: the whole schedule of a [model] directory

    def _variant_refused(self, variant: str, error: str) -> None:
        log.error("variant %s refused: %s; running on the others", variant, error)
        self.event("variant_refused", "critical", variant=variant, error=error)

    def _install(self, m: Measured, ladder: bool = True) -> None:
        """Make measured profiles current (main thread only) and rebuild the ladder (`ladder`
        False: the caller builds it, at start-up once the sources' own models are in)."""
        old = self.box.model.manifest
        if old is not None and Path(m.manifest.root) != Path(old.root):
            self._model_gen += 1  # profiles of the model before are stale from now on
        self.box.model.install(m)
        self.energy.forget_model()  # the sources' own models did not change
        if ladder:
            self._build_ladder()
        if self.pipeline is not None:  # a new model brings its own preprocessing to measure
            # (another version with the same preprocessing keeps the measured choice: measuring
            # again runs 21 preprocessings inline on the first frame after the swap)
            self.pipeline.set_manifest(self.box.model.manifest, self.box.model.pre if (
                old is not None and old.preprocess == self.box.model.manifest.preprocess)
                else self._preprocess_chooser())

    def _install_source_models(self) -> None:
        """Measure the models `[[sources]]` name (once each; cached like the [model]'s), plan
        every source's tiles and build the ladders (start-up, before the pipeline runs)."""
        for s in self.cfg.sources:
            key = self.plan.model_key(s)
            if not key or key in self.box.source_models or key in self.plan.failed:
                continue
            sm = ServedModel.of_source(key, s, self.cfg.model)
            log.info("source %s: model %s (%s)", s.name, key, sm.path)
            try:
                sm.install(self._measure_model(sm.path, key=key, section=sm.section))
            except Stopping:
                raise
            except Exception as e:  # a corrupt or unusable model costs its sources only
                self._source_model_failed(key, sm.path, e)
                continue
            self.box.source_models[key] = sm
        self.plan.plan_tiles({k: m.manifest for k, m in self.box.source_models.items()},
                             self.box.model.manifest)
        self._build_ladder()

    def _source_model_failed(self, key: str, path: Path, e: Exception) -> None:
        """A source's own model cannot be used (corrupt, unreadable, no variant runs): its
        sources are not inspected, the daemon and the other sources run on (an error line and
        a critical `source_model_failed` event, and those sources' health says failed)."""
        names, why = self.plan.model_failed(key, path, e)
        log.error("source%s %s not inspected: %s; the other sources run (fix the model and "
                  "restart)", "s" if len(names) > 1 else "", ", ".join(names), why)
        self.event("source_model_failed", "critical", model=key[-256:], sources=names,
                   error=why)

    def _preprocess_chooser(self) -> Any:
        """A new preprocessing choice for the [model] (CPU or OpenCL, measured per size)."""
        self.box.model.pre = preprocess_chooser(self.backends, self.box.model.manifest, self.meter,
                                            self.box.model.idle_w, self.box.model.pre_paths)
        return self.box.model.pre

    # -- background profiling ----------------------------------------------------------------

    def load_in_background(self, path: Path, fresh: bool, why: str,
                           wait: bool = False) -> None:
        """Profile `path` on the reprofile thread (runtime.device.profiling); the main loop
        installs the result between ticks. `wait`: after the profiling under way."""
        self.profiler.load(lambda: self._measure_model(path, fresh), why, self._model_gen, wait)

    def _apply_installs(self) -> None:
        while True:
            try:
                job = self._installs.get_nowait()
            except queue.Empty:
                return
            if job.version:  # a new model version: pointer switch, swap, probation
                self.ota.apply(job.measured, job.why, job.version)
            elif job.gen is not None and job.gen != self._model_gen:  # began before a swap
                log.info("%s: dropped, it profiled %s and another model was installed "
                         "since it began", job.why, job.measured.manifest.name)
            else:
                self.install_model(job.measured, job.why)

    # -- what OTA asks of the daemon (runtime.device.host.OtaHost) ---------------------------

    def stopping(self) -> bool:
        """Whether a stop was requested."""
        return self._stop_requested

    def install_model(self, measured: Measured, why: str) -> float:
        """Install a measured [model] and go to its top rung, or stay down (_after_rebuild);
        the seconds the ladder took (the rest loaded and warmed the session)."""
        held = self.box.held_down()
        t0 = time.perf_counter()
        self._install(measured)
        took = time.perf_counter() - t0
        self._after_rebuild(why, held)
        return took

    def live_energy_j(self) -> float | None:
        """The running [model] variant's live energy per inference (None: none yet)."""
        return self.energy.live.get(self._running_id())

    def target_ms(self) -> float:
        """The [model]'s per-inference latency target."""
        return self.plan.target("")[0]

    def second_session(self) -> Active | None:
        """Another session of the running [model] variant (None: not one of its own)."""
        return self.box.model.second_session(self.pipeline.active)

    def rebirth(self) -> None:
        """A new birth message (the model or its rung changed): the snapshot it is made from
        is taken first (once there are any), so the MQTT thread sends the change."""
        if self.state is not None:
            self.refresh_state()
        if self.publisher:
            self.publisher.request_rebirth()

    # -- the sources' plan (runtime.device.source_plan) --------------------------------------

    def _constraints(self, key: str = "") -> Constraints:
        """The selector's constraints for a model ("" = the [model]'s)."""
        c = self.cfg.constraints
        # with an end-to-end target, inference alone must fit in it: the ladder's lower
        # rungs keep that bound (runtime/choice/selector.py judges the frame end to end,
        # by the box's energy per frame, on what serving has measured so far)
        return Constraints(latency_ms=c.end_to_end_ms or self.plan.target(key)[0],
                           percentile=c.percentile, accuracy_floor=c.accuracy_floor,
                           end_to_end_ms=c.end_to_end_ms,
                           # accelerators ranked at the rate frames are offered, not back to
                           # back (runtime/choice/at_rate.py)
                           rate_hz=self.cfg.governor.rate_hz,
                           frame=self.box.model.frame_costs(self.pipeline, self.box_energy,
                                                         self.device.power.idle_w,
                                                         self.cfg.governor.rate_hz)
                           if c.end_to_end_ms and not key else None)

    def _check_tiles(self) -> None:
        """A source whose frames cost another number of tiles than planned (a camera's size
        is known only from its frames): re-plan the targets and the box's ladder."""
        why = self.plan.learn_tiles(self.pipeline.lanes)
        if not why:
            return
        log.info("%s: latency targets and the ladders re-planned", why)
        held = self.box.held_down()
        try:
            self._build_ladder()
        except NoVariantError as e:
            log.error("re-planning for the tiles failed (%s); keeping the ladders", e)
            return
        self._after_rebuild(why, held)

    # -- ladders -----------------------------------------------------------------------------

    def _build_ladder(self) -> None:
        """Each model's rungs from its profiles (scaled to the simulated device when
        simulating, kept current from the running pipeline otherwise), the box's ladder with
        several models (runtime.device.box), and the control settings for them."""
        self.box.build(self._constraints, self.device.power if self.sim else None,
                       self.energy.live)
        g = self.cfg.governor
        self.ccfg = control_config(
            self.device, g, self.thermal if not self.thermal_disabled else None,
            # several sources: rung powers at their combined rate, so budgets are the box's
            planned_rate(self.plan.streams() if self.cfg.sources else (), g.rate_hz)
            or self.box.control_rungs()[-1].max_rate_hz()
            * (self.cfg.simulator.offered_share if self.sim else 1.0))

    def _after_rebuild(self, why: str, held: bool) -> None:
        """After the ladder was rebuilt: its top rung when nothing held the device down;
        otherwise the running variant's rung on the new ladder (the cheapest if it is gone):
        a re-profile starts *because* it got hot, and must not run the top rung for a tick
        at 95 °C. The control loop raises it when the budget allows. The same rule for each
        source's own model."""
        for m in self.box.models:
            # what runs: the [model]'s swapped-in session, a source model's pending one too
            a = self.pipeline.active if m is self.box.model else self.pipeline.target_of(m.key)
            top = len(m.rungs) - 1
            i = next((k for k, r in enumerate(m.rungs) if a and r.variant_id == a.variant_id),
                     0) if held else top
            m.current = min(m.current, top)
            self._move_model(m, i, why)
        self.box.build_joint()
        # the indices of the old ladder mean nothing on the new one: no actuation to judge a
        # step from, no excursion to come back from
        self.cstate = replace(self.cstate, hold=replace(self.cstate.hold,
                                                        rung=self.box.control_current(),
                                                        dwell_s=None),
                              actuation=None, excursion=None)

    def _move_model(self, m: ServedModel, rung: int, why: str) -> None:
        """Switch one model to a rung of its ladder (an event); the [model]'s also updates
        systemd's status and the birth message."""
        if self.switch.move(m, rung, why, self.pipeline) and m is self.box.model:
            self.rebirth()
            self.notify.status(self.status_line())

    # -- events and status -------------------------------------------------------------------

    def event(self, type_: str, severity: str = "info", **fields: Any) -> None:
        """Record an event for the operator (log + outbox)."""
        ev = {"v": 1, "t": time.time(), "type": type_, "severity": severity, **fields}
        try:
            self.outbox.put("event", ev)
        except Exception as e:  # the outbox itself failing is logged, never raised here
            log.error("could not queue event %s: %s", type_, e)

    def _event_of(self, ev: dict) -> None:
        """An event a part made whole (the outbox's, the pipeline's, local results')."""
        self.event(ev.pop("type"), ev.pop("severity", "warning"), **ev)

    def offered_rate_hz(self) -> float:
        """The rate the control loop plans for, under the caps now in force."""
        assert self.ccfg is not None
        return min(self.ccfg.rate_hz, self.pipeline.rate_cap_hz)

    def frame_rung(self) -> Rung | None:
        """The running rung per frame of any source (tiles and several models counted):
        what one frame costs in energy and time now."""
        return None if self.pipeline is None or not self.box.model.rungs else self.box.frame_rung()

    def _sim_load(self) -> tuple[Rung | None, float]:
        """The rung running and the rate it is offered (what the simulated device heats
        with)."""
        rung = self.frame_rung()
        return (rung, self.offered_rate_hz()) if rung is not None else (None, 0.0)

    def load_w(self) -> float:
        """Dynamic power of the inference load: the running rung at the rate it runs. A
        simulated device reports the offered rate, which is what its plant heats with; a real
        one the rate achieved over the last 30 s (a source slower than the plan, or a pause,
        draws less than the plan)."""
        rung, rate = self._sim_load()
        if rung is None:
            return 0.0
        return rung.power_w(rate if self.sim else self.pipeline.rate_hz())

    def refresh_state(self) -> DeviceState:
        """Take the device's snapshot now and swap it in (main loop only; one assignment of a
        frozen object, so a reader on another thread has the old one or the new one whole)."""
        self.state = s = snapshot(self)
        return s

    def status_line(self) -> str:
        """One line for systemd STATUS= and the log, of the latest snapshot."""
        return status_line(self.state) if self.state is not None else "starting"

    def health(self) -> dict[str, Any]:
        """The health message now (main loop only: a fresh snapshot first)."""
        return health(self.refresh_state())

    def latest_health(self) -> dict[str, Any] | None:
        """The health message of the latest snapshot, None before the first (any thread: it
        reads `state` once and nothing else of the daemon)."""
        s = self.state
        return None if s is None else health(s)

    # -- control ------------------------------------------------------------------------------

    def control_tick(self) -> None:
        """Read sensors, run the one control step, apply its rung and rate cap."""
        r = self.sensors.read()
        self.reading = r
        if (said := self.sensor_watch.read(r, self.cfg.governor.hold_invalid_s)) is not None:
            self.event("sensor_invalid", "warning", problems=list(r.problems), bad_reads=said)
        self._update_live_energy()
        if self.box_energy is not None:
            self.box_energy.sample(time.monotonic(), *self.pipeline.take_stage_cpu(),
                                   lambda: named_threads_cpu_s("mqtt"))
        assert self.ccfg is not None
        self._check_tiles()
        box = self.box
        rungs = box.control_rungs()
        if not self.sim and self.box_energy is not None:
            # budgets are box watts: the stages around inference draw power too (a simulated
            # plant heats with its rungs alone, so a simulation leaves them out)
            rungs = with_other(rungs, self.box_energy.around_j())
        self.cstate, out = control.step(self.cstate, r, rungs, self.ccfg,
                                        box.control_current(), self.operator.rate_hz)
        self.control_out = out
        if self.refusals.due(out.refused, r.t):
            log.info("not stepping up: %s (rung %d/%d)", out.refused, box.control_current() + 1,
                     len(rungs))
        for e in out.events:
            (log.critical if e.severity == "critical" else log.warning)("%s: %s", e.type,
                                                                         e.detail)
            self.event(e.type, e.severity, detail=e.detail)
        self.pipeline.rate_cap_hz = out.rate_cap_hz
        if out.rung != box.control_current() or box.off_chain:
            for m, i in box.picks(out.rung):  # the [model]'s rung, or each model's part
                self._move_model(m, i, out.reason or "budget")
            box.relocate()
        if box.control_current() != out.rung:  # the switch failed: keep what runs
            self.cstate = replace(self.cstate, hold=replace(self.cstate.hold,
                                                            rung=box.control_current()))
        self.operator.keep_energy(self.cstate.energy)  # when an hour slot closed
        self._check_conditions(r.temp_c)
        self.ota.tick()  # probation of a new model version
        if self.sleeper:  # duty cycling: the schedule's cap, and the sleep between bursts
            self.sleeper.after_control()

    def _update_live_energy(self) -> None:
        """Keep the running rung's energy per inference current: the inference threads' CPU
        time (power.cputime) per inference, converted at the joules per CPU-second its profile
        measured. Frozen while profiling (the profiler's work would be billed to it) and when
        simulating (this host's pipeline is not the simulated device: its rungs keep the
        profiles' CPU time scaled by the device profile)."""
        if self.sim:  # no /proc reads at the simulator's tick rate (every 10 ms at 300x)
            self.pipeline.take_infer_cpu()
            return
        running = self._running_id()
        if not self.energy.update(self.pipeline.take_infer_cpu, running,
                                  self.box.model.by_id.get(running), self.box.by_live,
                                  self.profiler.lock.locked(),
                                  lambda: self.device.power.active_w_per_core):
            return
        for m in self.box.models:  # the [model]'s first, then each source's own
            m.rungs = m.live_rungs(self.energy.live)
        if self.box.source_models:
            self.box.build_joint()

    def _running_id(self) -> str:
        a = self.pipeline.active
        return a.variant_id if a else ""

    def _check_conditions(self, temp: float | None) -> None:
        """Re-profile when the device asks for it (runtime.device.profiling.Profiler.due);
        never for a simulated device: its temperature is not this host's."""
        if self.sim:
            return
        why, slow = self.profiler.due(temp, self.pipeline, self.box.model, self.cfg.daemon,
                                       self.live_energy_j(), self._device_state)
        if slow:
            self.event("slow_inference", "warning", **slow)
        if why:
            self.reprofile(why)

    def _device_state(self, actual_device: str) -> Any:
        """What the accelerator a session reports says of its clocks (NVML's clock-event
        reasons, else the profile's GPU devfreq; power/accel_throttle.py), or None."""
        m = meter_for(self.gpu_meters, actual_device)
        if m is not None:
            return m.clock_state()
        devfreq = self.device.sensors.gpu_devfreq if self.device else ""  # a SoC GPU: devfreq
        return read_devfreq(Path(self.cfg.device.sysfs_root) / devfreq) if devfreq else None

    def reprofile(self, why: str) -> None:
        """Measure every variant again in the background and rebuild the ladder."""
        self.load_in_background(self.box.model.manifest.root, True, why)

    def reprofile_now(self, why: str) -> None:
        """Re-profile, however recently the last one ran (an operator's command)."""
        self.profiler.last = -math.inf
        self.reprofile(why)

    # -- commands and reload ------------------------------------------------------------------

    def handle(self, cmd: Command) -> None:
        """Apply a verified command (runtime.device.commands)."""
        commands.handle(self, cmd)

    def set_constraints(self, c, why: str = "new constraints", governor=None) -> None:
        """Rebuild the ladder for new constraints (and governor settings) and go to its top
        (or stay down, see _after_rebuild); on NoVariantError everything stays as it was."""
        old = self.cfg
        held = self.box.held_down()
        self.cfg = replace(self.cfg, constraints=c, governor=governor or self.cfg.governor)
        try:
            self._build_ladder()
        except NoVariantError as e:
            self.cfg = old
            self._build_ladder()
            raise ValueError(str(e)) from e
        self.pipeline.set_slo(*c.in_force())
        self._after_rebuild(why, held)

    def reload(self) -> None:
        """SIGHUP: re-read the config and apply constraints and governor; a failure of any
        kind is reported and the old config stays (runtime.device.commands.reload)."""
        if self.config_path is None:
            log.warning("SIGHUP without --config: nothing to reload")
            return
        commands.reload(self, self.config_path, self.print_results)

    def restore_config(self, old: Config) -> None:
        """Back to `old` after a reload failed half-way through applying it."""
        self.cfg = old
        try:
            self._build_ladder()
            self.pipeline.set_slo(*old.constraints.in_force())
        except Exception:
            log.exception("could not rebuild the ladder of the previous config")

    # -- main loop ----------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop, SIGHUP reloads; installed before start-up so a signal during
        a long cold-start profiling is honoured, not fatal."""
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGHUP, self._on_reload_signal)
        self.wakeup.take_signals()  # a signal also ends the main loop's sleep

    def run(self) -> int:
        """Run until SIGTERM/SIGINT; returns the exit code."""
        self.install_signal_handlers()
        # tick_s is device time. Simulating, the loop is the simulated board's clock
        # (lockstep, runtime/device/simdevice.py): each tick moves the plant by exactly
        # tick_s, paced to [simulator] speed when the host keeps up, slower when it cannot.
        tick = self.cfg.governor.tick_s
        nap = min(0.05, tick)
        next_tick = next_health = last_beat = 0.0
        status = ""
        while not self._stop_requested:
            if self.sim:
                self.wakeup.wait(min(nap, self.sim.due_in(tick)))
            else:  # until the next duty; signals, commands and installs wake it earlier
                now, wd = time.monotonic(), self.notify.watchdog_s
                beat = last_beat + wd / 4 if wd else math.inf
                due = min(next_tick, next_health, beat if beat > now else math.inf)
                self.wakeup.wait(min(MAX_SLEEP_S, due - now))
            now = time.monotonic()
            if self._reload_requested:
                self._reload_requested = False
                self.reload()
            self._drain_commands()
            self._apply_installs()
            # simulating, the ticks that are overdue run back to back (a batch: no nap)
            ticked = False
            for _ in range(self.sim.ticks_due(tick) if self.sim else int(now >= next_tick)):
                next_tick = now + tick
                self._safe_tick()
                ticked = True
                if self.sim:
                    self.sim.advance(tick)  # the plant runs the decision just taken
            if ticked:  # simulating, once per batch of ticks
                self._safe_refresh()
            if now >= next_health:
                next_health = now + self.cfg.telemetry.health_interval_s
                self._send_health()
            wd = self.notify.watchdog_s
            if wd and now - last_beat >= wd / 4 and self.pipeline.alive(wd / 2):
                self.notify.watchdog()  # only while the infer loop is alive
                last_beat = now
            if (line := self.status_line()) != status:
                status = line
                self.notify.status(line)
        self.stop()
        return 0

    def _safe_tick(self) -> None:
        try:
            self.control_tick()
        except Exception as e:  # the control loop must survive its own bugs
            log.exception("control tick failed")
            self.event("control_failed", "critical", error=str(e)[:300])

    def _safe_refresh(self) -> None:
        try:
            self.refresh_state()
        except Exception as e:  # the readers keep the previous snapshot
            log.exception("taking the device's snapshot failed")
            self.event("control_failed", "critical", error=str(e)[:300])

    def _send_health(self) -> None:
        h = self.health()
        self.outbox.put("health", h)
        if self.sparkplug:  # births and NDATA are made from the health snapshot
            self.sparkplug.feed(h)
        self.history.append(h, self.trips)

    def _on_stop_signal(self, *_: Any) -> None:
        self._stop_requested = True  # only a flag: no locks, no I/O in a signal handler

    def _on_reload_signal(self, *_: Any) -> None:
        self._reload_requested = True  # only a flag (the wake-up fd woke the loop)

    def request_reload(self) -> None:
        """Reload the config at the main loop's next turn (a flag, then a wake-up; any
        thread but a signal handler, which sets the flag alone)."""
        self._reload_requested = True
        self.wakeup.set()

    def _drain_commands(self) -> None:
        if self.publisher is not None:
            commands.drain(self, self.publisher.commands)

    def close_partial(self) -> None:
        """After start-up was abandoned while profiling (nothing had started threads yet):
        close the outbox, which keeps its data."""
        if self.outbox is not None:
            self.outbox.close()
        self.wakeup.close()

    def stop(self) -> None:
        """Drain in-flight frames (their results are stored), say offline, close
        (runtime.device.shutdown says in which order)."""
        self.notify.stopping()
        log.info("stopping: draining in-flight frames")
        for what, stop in stop_steps(self):
            try:
                stop()
            except Exception:
                log.exception("stopping %s failed; going on with the rest of the stop", what)
        stats = self.outbox.stats()
        self.outbox.close()
        self.wakeup.close()
        log.info("stopped; %d results not yet acked stay in the outbox for the next start",
                 stats["results_held"])


def serve(config_path: Path | None, print_results: bool = False,
          reload_pending: Callable[[], bool] = lambda: False) -> int:
    """Entry point of `edgerun serve` (`--print`: `print_results`; `reload_pending`: whether
    a SIGHUP arrived before the daemon's handler was installed)."""
    cfg = load(config_path)
    if print_results:
        cfg = replace(cfg, results=replace(cfg.results, print=True))
    daemon = Daemon(cfg, config_path)
    daemon.print_results = print_results
    daemon.install_signal_handlers()
    if reload_pending():
        daemon.request_reload()  # as its handler would have done
    try:
        daemon.start()
    except Stopping as e:
        log.info("%s: exiting before start-up finished", e)
        daemon.close_partial()
        return 0
    except Exception:
        Notifier().status("start-up failed; see the journal")
        raise
    return daemon.run()


__all__ = ["Daemon", "Stopping", "ladder_for", "rung_label", "serve", "share_reasons",
           "versions"]

