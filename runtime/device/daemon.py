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
"""

from __future__ import annotations

import importlib.metadata
import logging
import math
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from power import control
from power import energy as energy_mod
from power.box_energy import BoxEnergy
from power.cputime import named_threads_cpu_s, native_threads_cpu_s
from power.device import DeviceProfile, load_profile
from power.sensors import Reading, SensorError, SensorSet, detect_meter
from power.thermal_source import ThermalSource, discover_thermal
from runtime import __version__
from runtime.choice import joint
from runtime.choice.ladders import Rung, ladder_for, on_device
from runtime.choice.measure import Measured, measure_first, measure_model
from runtime.choice.selector import Constraints, NoVariantError, Profile
from runtime.config import Config, ConfigError, load
from runtime.device import control_store, operator_settings
from runtime.device.health import health
from runtime.device.local_api import LocalApi, start_local_api
from runtime.device.ota import DeviceOta
from runtime.device.switch_retry import Retries, candidates
from runtime.device.systemd import Notifier
from runtime.engine.backends import discover
from runtime.frames.model_counts import model_id
from runtime.frames.multisource import aggregate, lanes, model_path, planned_rate, single
from runtime.frames.pipeline import Active, Pipeline, live_id
from runtime.frames.results_local import LocalResults
from runtime.frames.sources import open_source
from runtime.ota.store import crash_point
from runtime.telemetry.client import Publisher, device_id
from runtime.telemetry.homeassistant import DeviceInfo, Discovery
from runtime.telemetry.outbox import Outbox
from runtime.wire.commands import Command, loggable
from runtime.wire.health_history import HealthHistory

log = logging.getLogger("edgerun.daemon")

LIVE_MIN_INFERENCES = 50  # inferences per live energy update of the running rung
# Commands after which a variant switch in backoff is tried again at once: the ones that may
# have mended what would not load (files measured or replaced). Any command did, so a stream of
# settings commands (a dashboard slider, a script) loaded the broken file, and said so, at each.
RETRY_COMMANDS = frozenset({"reprofile", "deploy", "choose_model"})
LIVE_ALPHA = 0.3  # EWMA weight of each live update
PROGRESS_LOG_S = 2.0  # profiling progress on the terminal: at most one line this often


def versions() -> dict[str, str]:
    """Versions of edgerun and the engines, for birth and health."""
    out = {"edgerun": __version__}
    for mod, name, dist in (("onnxruntime", "onnxruntime", "onnxruntime"),
                            ("openvino", "openvino", "openvino"),
                            ("cv2", "opencv", "opencv-python-headless")):
        try:  # an engine not in use is not imported for this (openvino: ~10 MB resident)
            out[name] = (str(sys.modules[mod].__version__) if mod in sys.modules
                         else importlib.metadata.version(dist))
        except Exception:  # an engine that is not installed has no version to report
            continue
    return out


def rung_label(i: int, n: int) -> str:
    """Rungs count from 1 (the cheapest) to n (the selector's choice), everywhere."""
    return f"{i + 1}/{n}"


class Stopping(Exception):
    """A stop was requested while a long step (profiling) was running."""


@dataclass
class SourceModel:
    """A model that `[[sources]]` entries name (`model`), besides the [model] section's: its
    measurement, its own ladder (live energies) and the rung it runs (runtime/choice/joint.py)."""

    key: str  # the `model` value as written (the pipeline's Active.key)
    path: Path
    section: Any  # a runtime.config.ModelConfig for it: its path and tiling
    measured: Measured | None = None
    host_rungs: list[Rung] = field(default_factory=list)
    rungs: list[Rung] = field(default_factory=list)
    current: int = 0
    reason: str = ""
    pre: Any = None  # its preprocessing (one bound method: the pipeline caches its tiler)


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
        self.sim: Any = None  # runtime.device.simdevice.SimulatedDevice when simulating
        self.publisher: Publisher | None = None
        self.local_api: LocalApi | None = None  # opt-in /metrics and /healthz ([local_api])
        self.sleeper: Any = None  # runtime.device.sleep.Sleeper when [sleep] is enabled
        self.ota: DeviceOta | None = None  # model versions, deploy, probation ([models])
        self.settings: dict[str, float] = {}  # operator overrides (operator_settings)
        # -- parts made by start(), in its order --
        self.device: DeviceProfile | None = None
        self.sensors: SensorSet | None = None
        self.meter: Any = None  # power.sensors.PowerMeter
        self.outbox: Outbox | None = None
        self.device_id = ""
        self.backends: list = []
        self.devices: list[dict] = []  # discovered once, fixed for the process
        self.pipeline: Pipeline | None = None
        self.local: LocalResults | None = None  # [results]: print, JSONL, snapshots
        self.preprocess: Any = None  # runtime.engine.preprocessing.PreprocessChooser
        # -- model and ladder (set by _install) --
        self.manifest: Any = None
        self.profiles: list = []
        self.by_id: dict = {}
        self._by_live: dict = {}  # every model's profiles by pipeline.live_id
        self.idle_w = 0.0
        self.profile_temp: float | None = None
        self._loaders: dict = {}
        self.rungs: list[Rung] = []  # what the control step uses (live energies)
        self._host_rungs: list[Rung] = []  # as profiled (scaled to a simulated device)
        self.choice_reason = ""
        self.current = 0  # index into rungs; shown as rung_label (1-based)
        # -- control --
        self.ccfg: control.ControlConfig | None = None
        self.cstate = control.ControlState()
        self.control_out: control.Output | None = None
        self.reading: Reading | None = None
        self.trips: dict[str, float] = {}
        self.thermal_disabled = ""  # why the thermal governor is off despite the config
        self.thermal: ThermalSource | None = None
        self.operator_rate_hz = math.inf  # `set_rate`; governor caps come on top
        self._last_problems: tuple[str, ...] = ()
        self._sensor_bad = 0  # invalid sensor reads so far
        self._sensor_said = -math.inf
        self._live_energy: dict[str, float] = {}  # live_id -> J per inference, live
        self._live_acc: dict[str, tuple[int, float]] = {}
        self._native_cpu = 0.0
        self._saved_slot: int | None = None
        self._control_file = self.state_dir / "control.json"
        self.history = HealthHistory(self.state_dir)  # for `edgerun report` when offline
        # -- background profiling --
        self._reprofiling = threading.Lock()
        self._installs: queue.Queue = queue.Queue()
        self.print_results = False  # `serve --print` (serve() sets it; reload keeps it)
        self._model_gen = 0  # bumped when another model is installed: older jobs are stale
        self._last_reprofile = -math.inf
        self._reprofile_thread: threading.Thread | None = None
        # -- sources with their own model (runtime/choice/joint.py) --
        self.source_models: dict[str, SourceModel] = {}  # by key
        # models of sources that could not be loaded or measured at start: key -> why. Their
        # sources are not inspected (health: state failed); the others run (docs/sources.md)
        self.failed_models: dict[str, str] = {}
        self.tiles: dict[str, int] = {}  # source name -> tiles per frame planned with
        self.joint: list[joint.JointRung] = []  # the box's ladder (several models)
        self.joint_current = 0
        self._off_chain = False  # the models run a combination the box's ladder lacks
        self._keys: dict[tuple, tuple] = {}  # ids of (entry, [model]) -> (them, its key)
        # a variant that will not load is retried with backoff, not every tick
        self._retries = Retries()

    # -- start-up --------------------------------------------------------------------------

    def start(self) -> None:
        """Bring every part up in order; raises with the failing step named."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.settings = operator_settings.load(self.state_dir)
        if self.settings:  # commands sent earlier outlive restarts (and the config file's)
            log.info("operator settings from %s override [constraints]: %s",
                     self.state_dir / operator_settings.FILE, self.settings)
            self.cfg = replace(self.cfg, constraints=operator_settings.apply(
                self.cfg.constraints, self.settings))
        cfg = self.cfg
        self.device = load_profile(cfg.device.profile)
        root = Path(cfg.device.sysfs_root)
        if cfg.simulator.enabled:
            from runtime.device.simdevice import SimulatedDevice

            root = Path(cfg.simulator.root or self.state_dir / "sim-sysfs")
            self.sim = SimulatedDevice(self.device, root, cfg.simulator.scenario,
                                       cfg.simulator.speed, cfg.simulator.start_hour,
                                       self._sim_load, cfg.constraints.latency_ms / 1e3)
            log.info("simulated %s, scenario %s at %gx, sysfs tree %s", self.device.name,
                     cfg.simulator.scenario, cfg.simulator.speed, root)
        self._open_sensors(root)
        self.meter = detect_meter(root, self.device)
        self.box = BoxEnergy(self.meter, self.device.power.idle_w,
                             self.device.power.active_w_per_core,
                             lambda t, sev, f: self.event(t, sev, **f))
        self.outbox = Outbox(cfg.telemetry.outbox, on_event=self._outbox_event)
        if (ev := self.outbox.take_startup_event()) is not None:
            self.event(ev.pop("type"), "critical", **ev)
        if self.thermal_disabled:
            self.event("governor_disabled", "critical", reason=self.thermal_disabled)
        energy_state, self.operator_rate_hz = control_store.load(self._control_file)
        self.cstate = replace(self.cstate, energy=energy_state)
        if energy_state is not None or math.isfinite(self.operator_rate_hz):
            log.info("control state restored from %s (harvest forecast %s, operator rate cap "
                     "%s)", self._control_file, "kept" if energy_state else "none",
                     f"{self.operator_rate_hz:g} Hz" if math.isfinite(self.operator_rate_hz)
                     else "none")
        self.device_id = device_id(cfg.telemetry)
        self.local_api = start_local_api(cfg.local_api, self.health, lambda: self.pipeline.alive(
            cfg.local_api.stall_s), self.device_id)  # up during profiling: 503 until it runs
        try:
            self.ota = DeviceOta(self)
        except ValueError as e:  # an unreadable publisher key file
            raise ConfigError(str(e)) from e
        if cfg.telemetry.broker.host:  # made now so a bad key file fails before profiling
            try:
                ha = Discovery(cfg.homeassistant, cfg.telemetry.fleet, self.device_id,
                               self.state_dir, self._ha_info, cfg.telemetry.result_per_message)
                self.publisher = Publisher(cfg.telemetry, self.outbox, self._birth,
                                           state_dir=self.state_dir, homeassistant=ha,
                                           session_expiry_s=(cfg.sleep.session_expiry_s
                                                             if cfg.sleep.enabled else 0),
                                           precheck=self.ota.precheck)
            except ValueError as e:  # an unreadable trusted key or device key file
                raise ConfigError(str(e)) from e
        model_path = self.ota.model_path(Path(cfg.model.path) if cfg.model.path
                                         else _bundled_model())
        # Engines are discovered once per process: re-creating them (a second ov.Core while the
        # first is torn down) was seen to leave the process crashing on its next signal.
        self.backends = discover(cfg.backends)
        self.devices = [{"backend": b.name, "id": d.id, "name": d.name, **d.details}
                        for b in self.backends for d in b.devices()]  # fixed for the process
        first, rest = self.ota.first_model(
            model_path, lambda p: self._measure_model(p, first_only=True))
        self._install(first)
        self._install_source_models()
        if cfg.results.enabled:
            self.local = LocalResults(cfg.results, self._pipeline_event)
            self.local.start()
        self.pipeline = Pipeline(self._lanes(), self.manifest, self.outbox.append_many,
                                 self._pipeline_event, cfg.daemon.queue_size,
                                 self._preprocess_chooser(), self.local)
        self.pipeline.latency_target_ms = cfg.constraints.latency_ms
        self.current = len(self.rungs) - 1
        for sm in self.source_models.values():
            sm.current = len(sm.rungs) - 1
        self.joint_current = len(self.joint) - 1
        self.pipeline.start(self._session(self.current),
                            {k: self._session_of(sm, sm.current)
                             for k, sm in self.source_models.items()})
        if math.isfinite(self.operator_rate_hz):
            self.pipeline.rate_cap_hz = self.operator_rate_hz
        self.ota.started()
        if self.sim:
            self.sim.start()
        from runtime.device import sleep as sleep_mod

        self.sleeper = sleep_mod.create(self)
        if self.publisher:
            self.publisher.start()
        else:
            log.info("no telemetry.broker.host: results are kept in the outbox only")
            if cfg.homeassistant.enabled or cfg.telemetry.result_per_message:
                log.warning("homeassistant.enabled / telemetry.result_per_message need a broker "
                            "(telemetry.broker.host); nothing is published")
        self.notify.ready(self.status_line())
        log.info("ready in %.2f s: %s", time.monotonic() - self.started, self.status_line())
        if rest is not None:  # the fast schedule: serve on the first choice, refine meanwhile
            self._background(lambda: rest(self.pipeline.exclusive), "profiling refined")

    def _open_sensors(self, root: Path) -> None:
        """Thermal sensor and trips discovered on the device (power.thermal_source; trips from
        sysfs where present, the profile's otherwise), battery and solar. A configured governor
        whose sensor cannot be found or read at start-up runs disabled with a critical event
        and health saying why: inspection goes on at full precision, the operator is told."""
        th = self.device.thermal
        clock = (lambda: self.sim.plant.s.t) if self.sim else time.time
        battery = self.device.sensors.battery or (
            self.device.battery.path if self.device.battery else "")
        solar = self.device.solar.path if self.device.solar else ""
        wanted = th is not None and self.cfg.governor.policy != "off"
        if wanted:
            try:
                self.thermal = discover_thermal(root, self.device)
                for line in self.thermal.describe():
                    log.info("%s", line)
            except SensorError as e:
                self.thermal_disabled = (f"no thermal sensor found ({e}): the thermal governor "
                                         "is off and nothing protects the device from "
                                         "overheating")
                log.critical("%s", self.thermal_disabled)
        self.sensors = SensorSet(root, self.thermal.temp_file if self.thermal else "", battery,
                                 solar, clock)
        if self.thermal is not None:
            self.trips = {t.type: t.temp_c for t in self.thermal.trips}
            r = self.sensors.read()
            if r.temp_c is None:
                self.thermal_disabled = (
                    f"thermal sensor {self.thermal.label} unreadable at start-up "
                    f"({'; '.join(r.problems)}): the thermal governor is off and nothing "
                    "protects the device from overheating")
                log.critical("%s", self.thermal_disabled)
        elif th is not None:
            self.trips = {t.type: t.temp_c for t in th.trips}

    def _measure_model(self, path: Path, fresh: bool = False, first_only: bool = False,
                       key: str = "", section: Any = None):
        """The whole profiling schedule (a Measured), measured between the pipeline's frames
        once it runs; or, with `first_only`, measure_first's (first Measured, rest or None).
        `key`/`section`: a source's own model (its target and its [model]-like section)."""
        cfg = self.cfg if section is None else replace(self.cfg, model=section)
        said = [-math.inf, ""]  # when and what the terminal was last told

        def refused(variant: str, error: str) -> None:
            log.error("variant %s refused: %s; running on the others", variant, error)
            self.event("variant_refused", "critical", variant=variant, error=error)

        def progress(i: int, n: int, name: str) -> None:
            if self._stop_requested:
                raise Stopping(f"stop requested while profiling {name} ({i}/{n})")
            if threading.current_thread().name == "model-install":
                crash_point("profile")  # tests: kill -9 while a new version is profiled
            # A cold first start profiles every variant (minutes): keep systemd's start
            # timeout moving and say how far it got.
            self.notify.send("EXTEND_TIMEOUT_USEC=120000000",
                             f"STATUS=profiling {name}: variant {i}/{n}")
            # ... and the terminal (the log, stderr): a phase's first and last variant, and
            # at most one line every PROGRESS_LOG_S in between.
            now = time.monotonic()
            if i == n or name != said[1] or now - said[0] >= PROGRESS_LOG_S:
                said[:] = [now, name]
                log.info("profiling %s: variant %d/%d", name, i, n)

        recorded = Path(cfg.simulator.profiles) if (cfg.simulator.enabled
                                                    and cfg.simulator.profiles) else None
        args = (path, cfg, self.backends, self.meter, self.device.name,
                self.device.power.active_w_per_core, self.sensors.read().temp_c, refused,
                progress, self._constraints(key), fresh, recorded)
        if first_only:
            return measure_first(*args)
        return measure_model(*args, pause=self.pipeline.exclusive if self.pipeline else None)

    def _install(self, m: Measured) -> None:
        """Make measured profiles current (main thread only) and rebuild the ladder."""
        old = self.manifest
        if old is not None and Path(m.manifest.root) != Path(old.root):
            self._model_gen += 1  # profiles of the model before are stale from now on
        self.manifest, self.profiles, self.idle_w = m.manifest, m.profiles, m.idle_w
        self._loaders, self.profile_temp = m.loaders, m.temp_c
        # the [model]'s live energies start afresh; the sources' own models did not change
        self._live_energy = {k: v for k, v in self._live_energy.items() if "\x00" in k}
        # ... and so does what was accumulating towards the next figure: two versions of one
        # model share variant ids, so the old version's last inferences would be billed to
        # the new version's first figure (the one probation's energy rule judges)
        self._live_acc = {k: v for k, v in self._live_acc.items() if "\x00" in k}
        self._build_ladder()
        if self.pipeline is not None:  # a new model brings its own preprocessing to measure
            # (another version with the same preprocessing keeps the measured choice: measuring
            # again runs 21 preprocessings inline on the first frame after the swap)
            self.pipeline.set_manifest(self.manifest, self.preprocess if (
                old is not None and old.preprocess == self.manifest.preprocess)
                else self._preprocess_chooser())

    def _load_in_background(self, path: Path, fresh: bool, why: str,
                            wait: bool = False) -> None:
        """Profile in a thread (minutes on a cold cache must not stall the main loop and its
        watchdog beats); the main loop installs the result between ticks. `wait`: after the
        profiling under way (another model chosen), instead of skipped (a re-profile)."""
        if self._reprofiling.locked() and not wait:  # only the main thread starts one
            self.event("reprofile_skipped", "info", reason=f"{why}: already profiling")
            return
        self._last_reprofile = time.monotonic()
        log.info("profiling in the background: %s%s", why, ", after the profiling under way"
                 if self._reprofiling.locked() else "")
        self.event("reprofile", "info", reason=why)
        self._background(lambda: self._measure_model(path, fresh), why, wait)

    def _background(self, job, why: str, wait: bool = False) -> None:
        """Run a profiling job (returning a Measured) on the reprofile thread; the main loop
        installs its result between ticks. Skipped while another one runs, unless `wait`."""
        if not wait and not self._reprofiling.acquire(blocking=False):
            self.event("reprofile_skipped", "info", reason=f"{why}: already profiling")
            return
        gen = self._model_gen

        def work() -> None:
            if wait:
                self._reprofiling.acquire()
            try:
                self._installs.put((job(), why, None, gen))
            except Stopping:
                log.info("background profiling abandoned: the daemon is stopping")
            except Exception as e:
                log.exception("profiling failed (%s); keeping the current model and profiles",
                              why)
                self.event("reprofile_failed", "warning", reason=why, error=str(e)[:300])
            finally:
                self._reprofiling.release()

        self._reprofile_thread = threading.Thread(target=work, name="reprofile", daemon=True)
        self._reprofile_thread.start()

    def _apply_installs(self) -> None:
        while True:
            try:
                measured, why, *version = self._installs.get_nowait()
            except queue.Empty:
                return
            if version and version[0]:  # a new model version: pointer switch, swap, probation
                self.ota.apply(measured, why, version[0])
                continue
            if version and version[1] != self._model_gen:  # started before a model swap
                log.info("%s: dropped, it profiled %s and another model was installed "
                         "since it began", why, measured.manifest.name)
                continue
            held = self._held_down()
            self._install(measured)
            self._after_rebuild(why, held)

    def _held_down(self) -> bool:
        """The control loop holds a rung under the top (hot, or short of energy)."""
        return bool(self.rungs) and (self.joint_current < len(self.joint) - 1
                                     if self.source_models else
                                     self.current < len(self.rungs) - 1)

    def _after_rebuild(self, why: str, held: bool) -> None:
        """After the ladder was rebuilt: its top rung when nothing held the device down;
        otherwise the running variant's rung on the new ladder (the cheapest if it is gone):
        a re-profile starts *because* it got hot, and must not run the top rung for a tick
        at 95 °C. The control loop raises it when the budget allows."""
        top = len(self.rungs) - 1
        target = top
        if held:
            running = self._running_id()
            target = next((i for i, r in enumerate(self.rungs) if r.variant_id == running), 0)
        self.current = min(self.current, top)
        self._move(target, self.reading.t if self.reading else 0.0, why)
        for sm in self.source_models.values():  # the same rule for each source's own model
            a = self.pipeline.target_of(sm.key)
            i = next((k for k, x in enumerate(sm.rungs) if a and x.variant_id == a.variant_id),
                     0) if held else len(sm.rungs) - 1
            self._move_source_model(sm, i, why)
        self._build_joint()
        self.cstate = replace(self.cstate, hold=replace(self.cstate.hold,
                                                        rung=self._control_current(),
                                                        dwell_s=None))

    def _preprocess_chooser(self):
        """CPU or OpenCL preprocessing, measured per frame size (engine/preprocessing.py)."""
        from runtime.engine.preprocessing import PreprocessChooser

        ocl = next((b for b in self.backends if b.name == "opencl" and b.devices()), None)
        factory, name = None, "opencl"
        pre = self.manifest.preprocess
        if ocl is not None and pre.layout == "NCHW" and pre.resize in ("bilinear", "nearest"):
            from runtime.engine.backends.opencl import OpenClPreprocessor

            dev = ocl.devices()[0].id
            name = f"opencl:{dev}"
            cache: dict = {}

            def factory(shape, ocl=ocl, dev=dev, cache=cache):
                if shape not in cache:
                    cache[shape] = OpenClPreprocessor(ocl, dev, pre, shape)
                return cache[shape]

        self.preprocess = PreprocessChooser(pre, self.meter, self.idle_w, factory, name)
        return self.preprocess

    def _lanes(self) -> list:
        """The pipeline's sources: one `[source]`, or each of `[[sources]]` (a trigger gets a
        client id of its own so two do not take over each other's session)."""
        cfg = self.cfg
        if not cfg.sources:
            return single(cfg.source, lambda: open_source(
                cfg.source, self.state_dir, cfg.telemetry.broker, self.device_id))
        out = lanes(cfg.sources, lambda s, i: open_source(
            s, self.state_dir, cfg.telemetry.broker, f"{self.device_id}-{s.name}"),
                    self._model_key)
        for lane in out:  # a source whose model failed at start is never opened
            if lane.model in self.failed_models:
                lane.refused, lane.model, lane.share = self.failed_models[lane.model], "", 0.0
        # a combined rate cap is shared by the sources inspected (a refused one's share was
        # lost: a 10 Hz cap over two 10 Hz cameras, one refused, gave the other 5 Hz)
        total = sum(lane.share for lane in out)
        for lane in out:
            lane.share = lane.share / total if total > 0 else lane.share
        return out

    def _constraints(self, key: str = "") -> Constraints:
        """The selector's constraints for a model ("" = the [model]'s): with several sources
        the per-inference latency target that holds each stream's at their combined rate,
        over the tiles of its most tiled source (runtime.choice.joint.targets)."""
        c = self.cfg.constraints
        latency = self._target(key)[0]
        return Constraints(latency_ms=latency, percentile=c.percentile,
                           accuracy_floor=c.accuracy_floor)

    def _target(self, key: str) -> tuple[float, str]:
        """(per-inference target ms, why) of a model; a model no source uses (the [model]'s
        when every source names its own) gets the per-frame one."""
        c = self.cfg.constraints
        got = joint.targets(c.latency_ms, self._streams())
        return got.get(key) or aggregate(c.latency_ms, [s.rate_hz for s in self._streams()])

    def _streams(self) -> list[joint.Stream]:
        """The sources as the budget sees them (model key, rate, tiles planned)."""
        if not self.cfg.sources:
            name = self.cfg.source.name or "main"
            return [joint.Stream(name, "", self.cfg.source.rate_hz, self.tiles.get(name, 1))]
        return [joint.Stream(s.name, k, s.rate_hz, self.tiles.get(s.name, 1))
                for s in self.cfg.sources
                if (k := self._model_key(s)) not in self.failed_models]

    def _model_key(self, s: Any) -> str:
        """The key of a `[[sources]]` entry's model: "" when it has none of its own, or names
        the [model] section's own model, tiled the same way (they share its session).
        Remembered: it resolves paths, and the budget asks for every source's key many times
        a tick (64 sources on 64 models took seconds per health message)."""
        if not s.model:
            return ""
        m = self.cfg.model
        memo = (id(s), id(m))  # hashing the entries costs more than the lookup saves
        if (got := self._keys.get(memo)) is None or got[0] is not s or got[1] is not m:
            got = self._keys[memo] = (s, m, self._find_model_key(s, m))  # held: ids stay theirs
        return got[2]

    def _find_model_key(self, s: Any, m: Any) -> str:
        default = Path(m.path).expanduser() if m.path else _bundled_model()
        if model_path(s.model).resolve() == default.resolve() and (
                s.tiling, s.tile_size, s.tile_overlap) == (m.tiling, m.tile_size,
                                                           m.tile_overlap):
            return ""
        # one key per model, however it is spelt (a bundled name, a path, a symlink): the
        # first entry's spelling, so the sources share one session, ladder and measurement
        here = model_path(s.model).resolve()
        return next((x.model for x in self.cfg.sources
                     if x.model and model_path(x.model).resolve() == here), s.model)

    def _install_source_models(self) -> None:
        """Measure the models `[[sources]]` name (once each; cached like the [model]'s), plan
        every source's tiles and build the ladders (start-up, before the pipeline runs)."""
        for s in self.cfg.sources:
            key = self._model_key(s)
            if not key or key in self.source_models:
                continue
            section = replace(self.cfg.model, path=str(model_path(s.model)), tiling=s.tiling,
                              tile_size=s.tile_size, tile_overlap=s.tile_overlap, labels="",
                              preprocess="", input_shape=())
            if key in self.failed_models:
                continue
            sm = SourceModel(key, model_path(s.model), section)
            log.info("source %s: model %s (%s)", s.name, key, sm.path)
            try:
                sm.measured = self._measure_model(sm.path, key=key, section=section)
            except Stopping:
                raise
            except Exception as e:  # a corrupt or unusable model costs its sources only
                self._source_model_failed(key, sm.path, e)
                continue
            sm.pre = sm.measured.manifest.preprocess.apply
            self.source_models[key] = sm
        self._plan_tiles()
        self._build_ladder()

    def _source_model_failed(self, key: str, path: Path, e: Exception) -> None:
        """A source's own model cannot be used (corrupt, unreadable, no variant runs): its
        sources are not inspected, the daemon and the other sources run on (an error line and
        a critical `source_model_failed` event, and those sources' health says failed)."""
        names = [s.name for s in self.cfg.sources if self._model_key(s) == key]
        why = (f"model {key!r} ({path}) cannot be used: {type(e).__name__}: {e}")[:1000]
        self.failed_models[key] = why
        log.error("source%s %s not inspected: %s; the other sources run (fix the model and "
                  "restart)", "s" if len(names) > 1 else "", ", ".join(names), why)
        self.event("source_model_failed", "critical", model=key[-256:], sources=names,
                   error=why)

    def _manifest_of(self, key: str) -> Any:
        return self.source_models[key].measured.manifest if key else self.manifest

    def _plan_tiles(self) -> None:
        """Tiles per frame of each source before its frames come (choice.joint.planned_tiles)."""
        srcs = self.cfg.sources or (self.cfg.source,)
        for s in srcs:
            name = s.name or "main"
            key = self._model_key(s) if self.cfg.sources else ""
            if key and key not in self.source_models:
                continue
            self.tiles[name] = joint.planned_tiles(s, self._manifest_of(key))

    def _check_tiles(self) -> None:
        """A source whose frames cost another number of tiles than planned (a camera's size
        is known only from its frames): re-plan the targets and the box's ladder."""
        seen = {lane.name: lane.tiles for lane in self.pipeline.lanes if lane.tiles}
        moved = {n: t for n, t in seen.items() if self.tiles.get(n, 1) != t}
        if not moved:
            return
        why = ", ".join(f"source {n}: {t} tiles per frame, planned {self.tiles.get(n, 1)}"
                        for n, t in moved.items())
        log.info("%s: latency targets and the ladders re-planned", why)
        self.tiles.update(moved)
        held = self._held_down()
        try:
            self._build_ladder()
        except NoVariantError as e:
            log.error("re-planning for the tiles failed (%s); keeping the ladders", e)
            return
        self._after_rebuild(why, held)

    def _session_of(self, sm: SourceModel, rung: int) -> Active:
        """Load and warm the session of a source model's rung (the caller swaps it in)."""
        vid = sm.rungs[rung].variant_id
        backend, variant = sm.measured.loaders[vid]
        session = backend.load(variant)
        m = sm.measured.manifest
        shape = variant.model.input_shape
        warm = m.preprocess.apply(np.full((*m.preprocess.hw(shape), 3), 128, np.uint8), shape)
        for _ in range(3):
            session.infer(warm)
        return Active(rung, vid, session, shape, m, sm.pre, key=sm.key)

    def _move_source_model(self, sm: SourceModel, rung: int, why: str) -> None:
        """Switch a source model to another rung of its ladder (an event, like _move)."""
        a = self.pipeline.target_of(sm.key)
        if a is not None and a.variant_id == sm.rungs[rung].variant_id:
            sm.current = rung
            return
        old = a.variant_id if a else sm.rungs[sm.current].variant_id
        n, wanted = len(sm.rungs), rung
        got = self._load_first(sm.key, sm.path, [r.variant_id for r in sm.rungs], wanted,
                               sm.current, old, lambda i: self._session_of(sm, i))
        if got is None:
            return  # nothing loaded: stay where we are (each retried with its backoff)
        rung, active = got
        if rung != wanted:
            why += f"; rung {rung_label(wanted, n)} ({sm.rungs[wanted].variant_id}) will not load"
        self.pipeline.switch(active)
        log.info("model %s rung %s -> %s: %s -> %s (%s)", sm.key, rung_label(sm.current, n),
                 rung_label(rung, n), old, active.variant_id, why)
        self.event("rung_changed", "info", **{"from": old, "to": active.variant_id,
                                              "rung": rung + 1, "rungs": n, "reason": why,
                                              "model": sm.key})
        sm.current = rung

    def _loads(self) -> list[joint.Load]:
        """Each model's ladder (per inference) and the inferences and frames per second its
        sources ask of it: the [model]'s first, then the sources' own models."""
        streams = self._streams()
        out = []
        for key, rungs in (("", self.rungs),
                           *((k, sm.rungs) for k, sm in self.source_models.items())):
            mine = [s for s in streams if s.model == key]
            out.append(joint.Load(key or "[model]", tuple(rungs),
                                  sum(s.rate_hz * s.tiles for s in mine),
                                  sum(s.rate_hz for s in mine)))
        return out

    def _control_rungs(self) -> list[Rung]:
        """The ladder the control step climbs, per frame at the combined frame rate: the
        [model]'s rungs (x its tiles per frame), or the box's joint ladder with several
        models (runtime.choice.joint)."""
        if not self.source_models:
            streams = self._streams()
            frames = sum(s.rate_hz for s in streams)
            tiles = (sum(s.rate_hz * s.tiles for s in streams) / frames) if frames > 0 else \
                max((s.tiles for s in streams), default=1)
            return joint.per_frame(self.rungs, tiles)
        return [j.rung for j in self.joint]

    def _control_current(self) -> int:
        return self.joint_current if self.source_models else self.current

    def _apply_control_rung(self, rung: int, t: float, why: str) -> None:
        """Run the control step's rung: the [model]'s, or each model's part of a box rung."""
        if not self.source_models:
            self._move(rung, t, why)
            return
        picks = self.joint[rung].picks
        if picks[0] != self.current:
            self._move(picks[0], t, why)
        for sm, i in zip(self.source_models.values(), picks[1:], strict=True):
            if i != sm.current:
                self._move_source_model(sm, i, why)
        running = (self.current, *(sm.current for sm in self.source_models.values()))
        k, on = joint.locate(self.joint, running)  # a failed switch: keep what runs
        self.joint_current, self._off_chain = (k, False) if on else (self.joint_current, True)

    def _build_ladder(self) -> None:
        """Rungs from the profiles (scaled to the simulated device when simulating, kept
        current from the running pipeline otherwise) and the control settings for them."""
        rungs, self.choice_reason = ladder_for(self.profiles, self._constraints())
        if why := self._target("")[1]:
            self.choice_reason += f"; {why}"
        self.by_id = {p.variant_id: p for p in self.profiles}  # the [model]'s
        self._by_live = dict(self.by_id)  # every model's, by live_id (their ids may clash)
        built = {}
        for key, sm in self.source_models.items():  # each with its own target
            built[key] = ladder_for(sm.measured.profiles, self._constraints(key))
            self._by_live.update({live_id(key, p.variant_id): p for p in sm.measured.profiles})
        if self.sim:
            # The simulated device is not this host: each rung's power there is its CPU time
            # here scaled by the device profile's perf_scale and active W per core.
            rungs = on_device(rungs, [self.by_id[r.variant_id].cpu_ms / 1e3 for r in rungs],
                              self.device.power)
            built = {k: (on_device(r, [self._by_live[live_id(k, x.variant_id)].cpu_ms / 1e3
                                       for x in r], self.device.power), why)
                     for k, (r, why) in built.items()}
        self._host_rungs = rungs
        self.rungs = self._live_rungs()
        log.info("choice: %s; ladder (rung 1 = cheapest): %s", self.choice_reason,
                 ", ".join(f"{i + 1}: {r.variant_id} acc {r.accuracy:.3f} "
                           f"{r.energy_j * 1e3:.3f} mJ" for i, r in enumerate(self.rungs)))
        for key, (r, why) in built.items():
            sm = self.source_models[key]
            sm.host_rungs, sm.reason = r, why + (f"; {t}" if (t := self._target(key)[1]) else "")
            sm.rungs = self._live_rungs(sm.host_rungs, key)
            sm.current = min(sm.current, len(sm.rungs) - 1)
            log.info("model %s: choice: %s; ladder: %s", key, sm.reason, ", ".join(
                f"{i + 1}: {x.variant_id} acc {x.accuracy:.3f} {x.energy_j * 1e3:.3f} mJ"
                for i, x in enumerate(sm.rungs)))
        self._build_joint()
        g = self.cfg.governor
        th = self.device.thermal
        gcfg = None
        if self.thermal is not None and g.policy != "off" and not self.thermal_disabled:
            trips = self.thermal
            gcfg = control.governor_config(self.device, g.policy,
                                           control_c=trips.trip("passive").temp_c,
                                           critical_c=trips.trip("critical").temp_c,
                                           hyst_c=trips.trip("passive").hyst_c)
        ecfg = None
        if self.device.battery is not None and g.energy:
            b = self.device.battery
            ecfg = energy_mod.EnergyConfig(b.capacity_wh, self.device.power.idle_w, math.inf,
                                           b.reserve_frac, b.charge_efficiency)
        self.ccfg = control.ControlConfig(
            governor=gcfg, energy=ecfg,
            # several sources: rung powers at their combined rate, so budgets are the box's
            rate_hz=planned_rate(self._streams() if self.cfg.sources else (), g.rate_hz)
            or self._control_rungs()[-1].max_rate_hz(),
            min_rate_hz=g.min_rate_hz,
            hold_invalid_s=g.hold_invalid_s, dwell_s=g.dwell_s,
            r_total_k_per_w=(th.model.r_die_case + th.model.r_case_amb) if th else None)

    def _live_rungs(self, host: list[Rung] | None = None, key: str = "") -> list[Rung]:
        """Rungs (the [model]'s, or `host` of model `key`) with their live energies."""
        return [replace(r, energy_j=self._live_energy.get(live_id(key, r.variant_id),
                                                          r.energy_j))
                for r in (self._host_rungs if host is None else host)]

    def _build_joint(self) -> None:
        """The box's ladder over every model's live rungs (several models only)."""
        if not self.source_models:
            self.joint = []
            return
        loads = self._loads()
        self.joint = joint.joint_ladder(loads, sum(s.rate_hz for s in self._streams()))
        running = (self.current, *(sm.current for sm in self.source_models.values()))
        # off the chain (live energies reordered it): the next tick moves the models onto it
        self.joint_current, on = joint.locate(self.joint, running)
        self._off_chain = not on
        log.debug("the box's ladder: %s", joint.describe(loads, self.joint))

    def _session(self, rung: int) -> Active:
        """Load and warm the session of a rung (the caller swaps it in)."""
        vid = self.rungs[rung].variant_id
        backend, variant = self._loaders[vid]
        session = backend.load(variant)
        pre, shape = self.manifest.preprocess, variant.model.input_shape
        warm = pre.apply(np.full((*pre.hw(shape), 3), 128, np.uint8), shape)  # mid-grey
        for _ in range(3):
            session.infer(warm)
        return Active(rung, vid, session, variant.model.input_shape, self.manifest,
                      self.preprocess)

    # -- events and status -------------------------------------------------------------------

    def event(self, type_: str, severity: str = "info", **fields: Any) -> None:
        """Record an event for the operator (log + outbox)."""
        ev = {"v": 1, "t": time.time(), "type": type_, "severity": severity, **fields}
        try:
            self.outbox.put("event", ev)
        except Exception as e:  # the outbox itself failing is logged, never raised here
            log.error("could not queue event %s: %s", type_, e)

    def _outbox_event(self, ev: dict) -> None:
        self.event(ev.pop("type"), "warning", **ev)

    def _pipeline_event(self, ev: dict) -> None:
        self.event(ev.pop("type"), ev.pop("severity", "warning"), **ev)

    def offered_rate_hz(self) -> float:
        """The rate the control loop plans for, under the caps now in force."""
        assert self.ccfg is not None
        return min(self.ccfg.rate_hz, self.pipeline.rate_cap_hz)

    def frame_rung(self) -> Rung | None:
        """The running rung per frame of any source (tiles and several models counted):
        what one frame costs in energy and time now."""
        if self.pipeline is None or not self.rungs:
            return None
        rungs = self._control_rungs()
        return rungs[min(self._control_current(), len(rungs) - 1)]

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

    def _birth(self) -> dict[str, Any]:
        a = self.pipeline.active
        return {"versions": versions(), "model": self.manifest.name,
                "choice": a.variant_id if a else "",
                "model_version": (self.ota.version or "") if self.ota else ""}

    def _ha_info(self) -> DeviceInfo:
        """What Home Assistant's entities describe (called on the MQTT thread)."""
        return DeviceInfo(labels=self.manifest.labels if self.manifest else (),
                          model=self.device.name, sw_version=__version__,
                          battery=bool(self.device.sensors.battery or self.device.battery))

    def status_line(self) -> str:
        """One line for systemd STATUS= and the log."""
        a = self.pipeline.active
        out = self.control_out
        temp = self.reading.temp_c if self.reading else None
        return (f"{a.variant_id if a else '-'} rung {rung_label(self.current, len(self.rungs))}"
                + (f", box rung {rung_label(self.joint_current, len(self.joint))} over "
                   f"{len(self.joint and self.joint[0].picks)} models" if self.joint else "")
                + (f", {temp:.1f} °C" if temp is not None else "")
                + (f", {out.reason}" if out and out.reason else "")
                + (", GOVERNOR OFF: no thermal sensor" if self.thermal_disabled else ""))

    def health(self) -> dict[str, Any]:
        """The health message (runtime.device.health)."""
        return health(self)

    def models_health(self) -> dict[str, Any]:
        """health's `models`: each model the sources use, its ladder position and target,
        and with several models the box's rung (runtime/choice/joint.py)."""
        streams = self._streams()
        out = []
        for ld, (key, name, rungs, cur, reason) in zip(self._loads(), (
                ("", self.manifest.name, self.rungs, self.current, self.choice_reason),
                *((k, sm.measured.manifest.name, sm.rungs, sm.current, sm.reason)
                  for k, sm in self.source_models.items())), strict=True):
            a = self.pipeline.target_of(key) if self.pipeline else None
            r = rungs[min(cur, len(rungs) - 1)]
            # a bare .onnx's accuracy is unknown (its rung takes it as 1.0): null, not 1.0
            prof = self._by_live.get(live_id(key, r.variant_id))
            acc = r.accuracy if prof is None or prof.accuracy is not None else None
            # a long path as key: its end (the schema allows 256 characters)
            out.append({"key": key[-256:], "model": name, "choice": a.variant_id if a else "",
                        "rung": cur + 1, "rungs": len(rungs), "accuracy": acc,
                        "rung_energy_mj": round(r.energy_j * 1e3, 4),
                        "target_ms": round(self._target(key)[0], 4),
                        "infer_hz": round(ld.infer_hz, 3), "power_w": round(
                            r.power_w(ld.infer_hz), 4),
                        "sources": [st.name for st in streams if st.model == key],
                        "reason": reason})
        box = {"rung": self.joint_current + 1, "rungs": len(self.joint)} if self.joint else {}
        return {"models": share_reasons(out), **({"box": box} if box else {})}

    # -- control ------------------------------------------------------------------------------

    def control_tick(self) -> None:
        """Read sensors, run the one control step, apply its rung and rate cap."""
        r = self.sensors.read()
        self.reading = r
        if bool(r.problems) != bool(self._last_problems):
            now = time.monotonic()
            if r.problems:
                self._sensor_bad += 1
                if now - self._sensor_said >= 60:  # a flaky file: once a minute, with a count
                    self._sensor_said = now
                    log.warning("sensor problem: %s (the last valid value is held for %g s, "
                                "then the governor fails safe; %d bad reads so far)",
                                "; ".join(r.problems), self.cfg.governor.hold_invalid_s,
                                self._sensor_bad)
                    self.event("sensor_invalid", "warning", problems=list(r.problems),
                               bad_reads=self._sensor_bad)
            self._last_problems = r.problems
        self._update_live_energy()
        self.box.sample(time.monotonic(), *self.pipeline.take_stage_cpu(),
                        lambda: named_threads_cpu_s("mqtt"))
        assert self.ccfg is not None
        self._check_tiles()
        self.cstate, out = control.step(self.cstate, r, self._control_rungs(), self.ccfg,
                                        self._control_current(), self.operator_rate_hz)
        self.control_out = out
        for e in out.events:
            (log.critical if e.severity == "critical" else log.warning)("%s: %s", e.type,
                                                                         e.detail)
            self.event(e.type, e.severity, detail=e.detail)
        self.pipeline.rate_cap_hz = out.rate_cap_hz
        if out.rung != self._control_current() or self._off_chain:
            self._apply_control_rung(out.rung, r.t, out.reason or "budget")
        if self._control_current() != out.rung:  # the switch failed: keep what runs
            self.cstate = replace(self.cstate, hold=replace(self.cstate.hold,
                                                            rung=self._control_current()))
        self._persist()
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
        native = native_threads_cpu_s()
        d_native, self._native_cpu = max(native - self._native_cpu, 0.0), native
        if self._reprofiling.locked():
            self.pipeline.take_infer_cpu()
            return
        running = self._running_id()
        if not _has_native_pool(self.by_id.get(running)):
            # its inference all ran in the timed thread: the process's native threads (OpenCV,
            # BLAS, ...) did other work, 2-9 ms a control tick in the first seconds after a
            # start, which billed to it made a 0.3 ms model read 2-4x its cost (docs/ota.md)
            d_native = 0.0
        for vid, (n, cpu) in self.pipeline.take_infer_cpu().items():
            n0, c0 = self._live_acc.get(vid, (0, 0.0))
            self._live_acc[vid] = (n0 + n, c0 + cpu + (d_native if vid == running else 0.0))
        for vid, (n, cpu) in list(self._live_acc.items()):
            if n < LIVE_MIN_INFERENCES or vid not in self._by_live:
                continue
            del self._live_acc[vid]
            p = self._by_live[vid]
            j_per_cpu = (p.energy_mj / p.cpu_ms) if p.cpu_ms and p.energy_mj > 0 else \
                self.device.power.active_w_per_core
            joules = cpu / n * j_per_cpu
            old = self._live_energy.get(vid)
            self._live_energy[vid] = joules if old is None else (
                LIVE_ALPHA * joules + (1 - LIVE_ALPHA) * old)
        self.rungs = self._live_rungs()
        for sm in self.source_models.values():
            sm.rungs = self._live_rungs(sm.host_rungs, sm.key)
        if self.source_models:
            self._build_joint()

    def _running_id(self) -> str:
        a = self.pipeline.active
        return a.variant_id if a else ""

    def _persist(self) -> None:
        """Save the harvest forecast when an hour slot closes (and caps when they change)."""
        e = self.cstate.energy
        slot = e.slot_index if e is not None else None
        if slot != self._saved_slot:
            self._saved_slot = slot
            control_store.save(self._control_file, e, self.operator_rate_hz)

    def _move(self, rung: int, t: float, why: str) -> None:
        """Load and warm the rung's session and hand it to the pipeline (an event)."""
        n = len(self.rungs)
        a = self.pipeline.target
        if a is not None and a.variant_id == self.rungs[rung].variant_id and (
                a.manifest is None or a.manifest.root == self.manifest.root):
            self.current = rung  # same variant, new index (the ladder was rebuilt)
            return
        old = a.variant_id if a else self.rungs[self.current].variant_id
        wanted = rung
        got = self._load_first("", self.manifest.root, [r.variant_id for r in self.rungs],
                               wanted, self.current, old, self._session)
        if got is None:
            return  # nothing loaded: stay where we are (each retried with its backoff)
        rung, active = got
        if rung != wanted:
            why += f"; rung {rung_label(wanted, n)} ({self.rungs[wanted].variant_id}) will not load"
        self.pipeline.switch(active)
        log.info("rung %s -> %s: %s -> %s (%s)", rung_label(self.current, n),
                 rung_label(rung, n), old, active.variant_id, why)
        self.event("rung_changed", "info", **{"from": old, "to": active.variant_id,
                                              "rung": rung + 1, "rungs": n, "reason": why})
        self.current = rung
        self.notify.status(self.status_line())
        if self.publisher:
            self.publisher.request_rebirth()

    def _load_first(self, key: str, root: Any, vids: list[str], wanted: int, current: int,
                    running: str, session: Callable[[int], Active]) -> tuple[int, Active] | None:
        """Load the session of rung `wanted` of model `key` (in directory `root`; `vids`: its
        ladder's variant ids); when that is a step down and it will not load, of the next
        cheaper rung that does (runtime.device.switch_retry.candidates: a hot box must not stay on
        the hotter rung). Rungs in backoff are skipped; None when nothing loaded (or the
        running variant is reached first: nothing to switch)."""
        # Backoff per model directory too: two versions of the [model] share variant ids, and
        # the failed file of one (a new version's) must not hold back the other's (the
        # rollback's switch back was skipped: the failed version's session kept running)
        rkey = f"{key}\x00{root}"
        for r in candidates(wanted, current):
            vid = vids[r]
            if r != wanted and vid == running:
                return None  # the fallback reached what runs
            if not self._retries.due(rkey, vid, time.monotonic()):
                continue  # it failed to load: retried when its backoff is over
            try:
                active = session(r)
            except Exception as e:  # a variant that will not load is reported
                self._switch_failed(key, vid, e, running, rkey)
                continue
            self._switch_worked(key, active.variant_id, rkey)
            if r != wanted:
                log.warning("%s%s will not load; stepped down to rung %s (%s) instead, cheaper "
                            "than the one asked for", f"model {key}: " if key else "",
                            vids[wanted], rung_label(r, len(vids)), vid)
            return r, active
        return None

    def _switch_failed(self, key: str, vid: str, e: Exception, running: str,
                       rkey: str | None = None) -> None:
        """A variant that would not load: stay on what runs and retry it with backoff
        (runtime/device/switch_retry.py), saying so at the first failure and when the interval
        reaches its longest, not at every tick (`rkey`: its backoff's key, default `key`)."""
        b, say = self._retries.failed(key if rkey is None else rkey, vid, time.monotonic())
        model = f"model {key} " if key else ""
        extra = {"model": key[-256:]} if key else {}
        if say == "failing":
            log.error("cannot switch %sto %s: %s; staying on %s and retrying in %g s, then at "
                      "doubling intervals up to %g s (a reprofile, deploy or choose_model "
                      "command or a config reload retries at once)", model, vid, e, running,
                      b.delay_s, self._retries.cap_s)
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

    def _switch_worked(self, key: str, vid: str, rkey: str | None = None) -> None:
        """A switch that loaded: any backoff of this model ends (said once)."""
        old, say = self._retries.succeeded(key if rkey is None else rkey, vid)
        if say == "recovered":
            log.info("%sswitch to %s loaded%s after %d failed attempt(s); the retries stop",
                     f"model {key}: " if key else "", vid,
                     "" if old.target == vid else f" (it had been to {old.target})",
                     old.attempts)

    def _check_conditions(self, temp: float | None) -> None:
        """Re-profile when the temperature moved far from the profiling one, or inference
        became slower than profiled (throttling); at most once per 10 minutes. Never for a
        simulated device: its temperature is not this host's."""
        if self.sim or time.monotonic() - self._last_reprofile < 600:
            return
        if self._reprofiling.locked():  # the start-up refinement: asked again when it ends
            return
        why = None
        if temp is not None and self.profile_temp is not None and abs(
                temp - self.profile_temp) > self.cfg.daemon.reprofile_temp_delta_c:
            why = f"temperature {temp:.1f} °C, profiled at {self.profile_temp:.1f} °C"
        a = self.pipeline.active
        # the [model]'s own inferences (not another camera's model's, nor a tiled frame's
        # whole time), over the last 30 s: what its profile's per-inference p95 measured
        mine = self.pipeline.models.tally(model_id("", self.manifest), time.time() - 30)
        p95 = float(np.percentile(mine.latencies_ms, 95)) if mine.latencies_ms else None
        prof = self.by_id.get(a.variant_id) if a else None
        # Both a ratio and an absolute margin: sub-millisecond models run a little slower
        # paced (cold caches) than profiled back to back, and that is not throttling.
        if prof and p95 and mine.results >= 50 and (
                p95 > self.cfg.daemon.slow_factor * prof.latency(95)
                and p95 - prof.latency(95) > 1.0):
            why = (f"p95 {p95:.2f} ms vs {prof.latency(95):.2f} ms profiled: the device is "
                   "slower than when profiled (throttling?)")
            self.event("slow_inference", "warning", variant=a.variant_id, p95_ms=p95)
        if why:
            self.reprofile(why)

    def reprofile(self, why: str) -> None:
        """Measure every variant again in the background and rebuild the ladder."""
        self._load_in_background(self.manifest.root, True, why)

    # -- commands and reload ------------------------------------------------------------------

    def handle(self, cmd: Command) -> None:
        """Apply a verified command (the publisher already replied 'accepted')."""
        log.info("command %s %s", cmd.name, loggable(cmd.args))
        if cmd.name in RETRY_COMMANDS:  # a failing switch is tried again at once
            self._retries.reset()
        c = self.cfg.constraints
        if cmd.name == "set_latency_target":
            self._set_constraints(replace(c, latency_ms=cmd.args["ms"]))
        elif cmd.name == "set_accuracy_floor":
            self._set_constraints(replace(c, accuracy_floor=cmd.args["value"]))
        elif cmd.name == "set_rate":  # 0 = no operator cap; kept across restarts
            self.operator_rate_hz = cmd.args["fps"] or math.inf
            control_store.save(self._control_file, self.cstate.energy, self.operator_rate_hz)
        elif cmd.name == "reprofile":
            self._last_reprofile = -math.inf
            self.reprofile("operator command")
        elif cmd.name in ("deploy", "choose_model") and self.cfg.sources and all(
                self._model_key(s) for s in self.cfg.sources):
            raise ValueError(f"{cmd.name} swaps the [model] section's model, and no source uses "
                             "it: every [[sources]] entry names its own model, which cannot be "
                             "swapped over the air yet (change the config and restart)")
        elif cmd.name == "deploy":
            self.ota.deploy(cmd)
        elif cmd.name == "choose_model" and self.ota.choose(cmd):
            pass  # a version in the model store: profiled, swapped, on probation
        elif cmd.name == "choose_model":
            target = (self.ota.configured or self.manifest.root).parent / cmd.args["name"]
            if not (target / "manifest.json").is_file():
                self.event("command_failed", "warning", command=cmd.name,
                           error=f"{target}: no model directory with a manifest")
                return
            self._load_in_background(target, False, f"model {cmd.args['name']} chosen",
                                     wait=True)
        if cmd.name in operator_settings.COMMANDS:  # applied: kept across restarts/reloads
            self.settings = operator_settings.record(self.settings, cmd.name, cmd.args)
            operator_settings.save(self.state_dir, self.settings)
        self.event("command_applied", "info", command=cmd.name,
                   args=loggable(cmd.args), id=cmd.id)

    def _set_constraints(self, c, why: str = "new constraints", governor=None) -> None:
        """Rebuild the ladder for new constraints (and governor settings) and go to its top
        (or stay down, see _after_rebuild); on NoVariantError everything stays as it was."""
        old = self.cfg
        held = self._held_down()
        self.cfg = replace(self.cfg, constraints=c, governor=governor or self.cfg.governor)
        try:
            self._build_ladder()
        except NoVariantError as e:
            self.cfg = old
            self._build_ladder()
            raise ValueError(str(e)) from e
        self.pipeline.latency_target_ms = c.latency_ms
        self._after_rebuild(why, held)

    def reload(self) -> None:
        """SIGHUP: re-read the config and apply constraints and governor. Any failure, of any
        kind, is logged and reported (`config_reload_failed`) and the old config stays."""
        if self.config_path is None:
            log.warning("SIGHUP without --config: nothing to reload")
            return
        old = self.cfg
        self._retries.reset()  # a new config: a failing switch is tried again at once
        try:
            new = load(self.config_path)
            new = replace(new, constraints=operator_settings.apply(new.constraints,
                                                                   self.settings))
            if self.print_results:  # `serve --print` outlives reloads, as settings do
                new = replace(new, results=replace(new.results, print=True))
            restart = [k for k in ("device", "model", "source", "sources", "telemetry",
                                   "simulator", "daemon", "backends", "profiler", "results",
                                   "local_api", "homeassistant", "sleep", "models")
                       if getattr(new, k) != getattr(old, k)]
            self._set_constraints(new.constraints, "config reloaded", new.governor)
        except Exception as e:  # ConfigError, NoVariantError (as ValueError), or anything else
            if self.cfg is not old:  # failed half-way through applying: back to the old one
                self.cfg = old
                try:
                    self._build_ladder()
                    self.pipeline.latency_target_ms = old.constraints.latency_ms
                except Exception:
                    log.exception("could not rebuild the ladder of the previous config")
            expected = isinstance(e, ConfigError | ValueError)
            why = str(e) if expected else f"{type(e).__name__}: {e}"
            log.error("config reload refused, still running with the previous config: %s", why,
                      exc_info=not expected)  # an unexpected one is a bug: keep its traceback
            self.event("config_reload_failed", "warning", path=str(self.config_path),
                       error=why[:500])
            return
        log.info("config reloaded (constraints and governor applied)%s",
                 f"; changes to {', '.join(restart)} need a restart" if restart else "")
        self.event("config_reloaded", "info", needs_restart=restart)

    # -- main loop ----------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop, SIGHUP reloads; installed before start-up so a signal during
        a long cold-start profiling is honoured, not fatal."""
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGHUP, self._on_reload_signal)

    def run(self) -> int:
        """Run until SIGTERM/SIGINT; returns the exit code."""
        self.install_signal_handlers()
        # tick_s is device time: with an accelerated simulator the step runs that much more
        # often in wall time, so the trend keeps its resolution (ticks shorter than horizon).
        speed = self.cfg.simulator.speed if self.sim else 1.0
        tick = max(self.cfg.governor.tick_s / speed, 0.01)
        nap = min(0.05, tick)
        next_tick = next_health = last_beat = 0.0
        status = ""
        while not self._stop_requested:
            time.sleep(nap)
            now = time.monotonic()
            if self._reload_requested:
                self._reload_requested = False
                self.reload()
            self._drain_commands()
            self._apply_installs()
            if now >= next_tick:
                next_tick = now + tick
                try:
                    self.control_tick()
                except Exception as e:  # the control loop must survive its own bugs
                    log.exception("control tick failed")
                    self.event("control_failed", "critical", error=str(e)[:300])
            if now >= next_health:
                next_health = now + self.cfg.telemetry.health_interval_s
                h = self.health()
                self.outbox.put("health", h)
                self.history.append(h, self.trips)
            wd = self.notify.watchdog_s
            if wd and now - last_beat >= wd / 4 and self.pipeline.alive(wd / 2):
                self.notify.watchdog()  # only while the infer loop is alive
                last_beat = now
            if (line := self.status_line()) != status:
                status = line
                self.notify.status(line)
        self.stop()
        return 0

    def _on_stop_signal(self, *_: Any) -> None:
        self._stop_requested = True  # only a flag: no locks, no I/O in a signal handler

    def _on_reload_signal(self, *_: Any) -> None:
        self._reload_requested = True

    def _drain_commands(self) -> None:
        if self.publisher is None:
            return
        while True:
            try:
                cmd = self.publisher.commands.get_nowait()
            except queue.Empty:
                return
            try:
                self.handle(cmd)
            except Exception as e:  # a command must never take the daemon down
                log.error("command %s failed: %s", cmd.name, e)
                self.event("command_failed", "warning", command=cmd.name, error=str(e)[:300])

    def close_partial(self) -> None:
        """After start-up was abandoned while profiling (nothing had started threads yet):
        close the outbox, which keeps its data."""
        if self.outbox is not None:
            self.outbox.close()

    def stop(self) -> None:
        """Drain in-flight frames (their results are stored), say offline, close."""
        self.notify.stopping()
        log.info("stopping: draining in-flight frames")
        steps: list[tuple[str, Callable[[], Any]]] = [("the pipeline", self.pipeline.stop)]
        if self.local:
            steps.append(("local results", self.local.stop))  # what the drained frames made
        if self.local_api:
            steps.append(("the local API", self.local_api.stop))
        if self._reprofile_thread is not None:
            # It stops at its next variant (progress raises Stopping); an engine call that is
            # still running when the interpreter exits aborts the process.
            steps.append(("re-profiling", lambda: self._reprofile_thread.join(60)))
        if self.ota is not None and self.ota.thread is not None:
            # a model install stops at its next variant, too
            steps.append(("a model install", lambda: self.ota.thread.join(60)))
        if self.sim:
            steps.append(("the simulator", self.sim.stop))
        if self.publisher:
            # last: the offline state and a clean DISCONNECT (else the broker publishes the
            # will, "connection lost"), whatever failed before it
            steps.append(("MQTT", self.publisher.stop))
        for what, stop in steps:
            try:
                stop()
            except Exception:
                log.exception("stopping %s failed; going on with the rest of the stop", what)
        stats = self.outbox.stats()
        self.outbox.close()
        log.info("stopped; %d results not yet acked stay in the outbox for the next start",
                 stats["results_held"])


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


def _bundled_model() -> Path:
    from models import bundled

    return bundled()


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
        daemon._reload_requested = True  # as its handler would have done
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


__all__ = ["Daemon", "ladder_for", "serve", "versions"]


def _has_native_pool(profile: Profile | None) -> bool:
    """Whether a variant's engine may run inference on native threads of its own (then their
    CPU is its cost): not ONNX Runtime with one intra-op thread (its backend sets one inter-op
    thread too), which runs every node in the calling thread. Unknown: assumed it may."""
    return not (profile is not None and profile.engine == "onnxruntime"
                and profile.threads == 1)
