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
[model]'s and each source's own alike), the box's ladder `model_ladder.py`, building the
ladders and the selector's constraints `ladders.py`, measuring and installing models
`installing.py`, the control tick `tick.py`, the sources' keys, tiles and targets
`source_plan.py`, switching rungs `rung_switch.py`, the commands and SIGHUP `commands.py`, the
operator's state `operator_state.py`, background profiling `profiling.py`, sensors
`sensing.py`, live energy `live_energy.py`, the stop's order `shutdown.py`. Each control tick
the main loop takes one frozen `DeviceState` (`state.py`); health, the STATUS= line, birth,
Home Assistant, the local API and OPC UA read only that. The parts reach the daemon through
the Protocols of `host.py`.
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
from power.box_energy import BoxEnergy
from power.device import DeviceProfile
from power.nvml import gpu_meters
from power.rungs import Rung
from power.sensors import Reading, SensorSet, detect_meter
from power.thermal_source import ThermalSource
from runtime.choice.ladders import ladder_for
from runtime.choice.measure import Measured
from runtime.config import Config, ConfigError, load
from runtime.device import commands, installing, ladders, live_energy
from runtime.device.health import health, share_reasons, versions
from runtime.device.host import Install, Stopping
from runtime.device.live_energy import LiveEnergy
from runtime.device.model_ladder import Box
from runtime.device.operator_state import OperatorState
from runtime.device.ota import DeviceOta
from runtime.device.profiles import load_profile
from runtime.device.profiling import (
    Profiler,
)
from runtime.device.rung_switch import RungSwitch, rung_label
from runtime.device.sensing import RefusalWatch, SensorWatch, open_sensors
from runtime.device.serving_drift import ServingDrift
from runtime.device.shutdown import stop_steps
from runtime.device.source_plan import SourcePlan
from runtime.device.state import DeviceState, snapshot, stopped
from runtime.device.status import birth, ha_info, status_line
from runtime.device.systemd import Notifier
from runtime.device.tick import control_tick, load_w, sim_load
from runtime.device.wakeup import Wakeup, WakingQueue
from runtime.device.wear import WriteRate
from runtime.frames.pipeline import Active, Pipeline
from runtime.frames.results_local import LocalResults
from runtime.telemetry.homeassistant import Discovery
from runtime.telemetry.outbox import Outbox
from runtime.telemetry.publisher import Publisher, device_id
from runtime.wire import clock as wire_clock
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
        self.writes = WriteRate()  # this process's disk writes a day (health `storage`)
        # Set by signal handlers, read by the main loop. Plain attributes on purpose: a handler
        # that takes a lock (Event.set) can deadlock against the main thread's own wait.
        self._stop_requested = False
        self._reload_requested = False
        self.wakeup = Wakeup()  # the main loop sleeps on it (runtime/device/wakeup.py)
        self.sim: Any = None  # runtime.device.simdevice.SimulatedDevice when simulating
        self.publisher: Publisher | None = None
        self.sparkplug: Any = None  # runtime.telemetry.sparkplug.node.SparkplugNode ([sparkplug])
        self.local_api: Any = None  # runtime.device.local_api.LocalApi ([local_api]: opt-in)
        self.plc: Any = None  # runtime.telemetry.plc.PlcServers ([opcua], [modbus]; docs/plc.md)
        self.sleeper: Any = None  # runtime.device.sleep.Sleeper when [sleep] is enabled
        self.ota: DeviceOta | None = None  # model versions, deploy, probation ([models])
        self.operator = OperatorState(self.state_dir)  # overrides and learnt state, kept
        # whether wall time can be believed; the stamp every result, health and event carries
        # (runtime/wire/clock.py); a fake sysfs root holds the fake timesyncd flag too
        root = cfg.device.sysfs_root or "/"
        self.clock = wire_clock.Clock(root, kernel=root == "/")
        # -- parts made by start(), in its order --
        self.device: DeviceProfile | None = None
        self.sensors: SensorSet | None = None
        self.meter: Any = None  # power.sensors.PowerMeter
        self.gpu_meters: list = []  # a GPU variant is billed its own meter (power/nvml.py)
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
        self.drift = ServingDrift()  # an accelerator variant's, on its meter; re-ranks
        # for `edgerun report` when offline; written a whole page (or history_flush_s) at a time
        self.history = HealthHistory(self.state_dir, flush_s=cfg.storage.history_flush_s)
        # the device at the last tick, frozen: what every reader reads (runtime/device/
        # state.py); replaced whole by the main loop, None until the pipeline runs
        self.state: DeviceState | None = None
        # -- background profiling --
        self.installs: queue.Queue[Install] = WakingQueue(self.wakeup.set)
        self.queue_install = self.installs.put  # an Install for the main loop (any thread)
        self.profiler = Profiler(lambda *a, **kw: self.event(*a, **kw), self.queue_install)
        self.print_results = False  # `serve --print` (serve() sets it; reload keeps it)
        self.model_gen = 0  # bumped when another model is installed: older jobs are stale

    # -- start-up --------------------------------------------------------------------------

    def start(self) -> None:
        """Bring every part up in order; raises with the failing step named."""
        self._restore_operator_state()
        self._open_device()
        self._open_outbox()
        self._open_links()
        rest = installing.install_models(self)
        self._start_pipeline()
        self.refresh_state(reports=True)  # birth, Home Assistant, OPC UA read it from now on
        self._start_services()
        self.refresh_state()
        self.notify.ready(self.status_line())
        log.info("ready in %.2f s: %s", time.monotonic() - self.started, self.status_line())
        if rest is not None:  # the fast schedule: serve on the first choice, refine meanwhile
            self.profiler.run(lambda: rest(self.pipeline.exclusive), "profiling refined",
                              self.model_gen)

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
                                       lambda: sim_load(self), cfg.constraints.latency_ms / 1e3,
                                       duration_s=cfg.simulator.hours * 3600 or math.inf)
            log.info("simulated %s, scenario %s at %gx, sysfs tree %s", self.device.name,
                     cfg.simulator.scenario, cfg.simulator.speed, root)
        # the control loop's time: never a step (runtime/wire/clock.py steady)
        clock = (lambda: self.sim.plant.s.t) if self.sim else wire_clock.steady()
        found = open_sensors(root, self.device, cfg.governor.policy, clock)
        self.sensors, self.thermal, self.trips = found.sensors, found.thermal, found.trips
        self.thermal_disabled = found.disabled
        self.meter = detect_meter(root, self.device)
        self.box_energy = BoxEnergy(self.meter, self.device.power.idle_w,
                                    self.device.power.active_w_per_core,
                                    lambda t, sev, f: self.event(t, sev, **f))
        self.gpu_meters = gpu_meters()

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
        if cfg.local_api.port:  # imported only then: prometheus_client costs ~8 MB resident
            from runtime.device.local_api import start_local_api

            self.local_api = start_local_api(  # up during profiling: 503 until the pipeline runs
                cfg.local_api, self.latest_health,
                lambda: self.pipeline.alive(cfg.local_api.stall_s), self.device_id)
        try:
            self.ota = DeviceOta(self, cfg.models, cfg.telemetry, self.state_dir,
                                 self.device_id)
            if cfg.opcua.enabled or cfg.modbus.enabled:  # certificates read now; PLC edges
                from runtime.telemetry.plc import open_plc

                self.plc = open_plc(cfg)
                self.plan.edges = self.plc.edges
            if any(s.kind == "pylon" for s in (cfg.sources or (cfg.source,))):
                from runtime.frames.pylon_source import pypylon

                pypylon()  # an extra: said now, not as a source retried for ever
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
                                       command_queue=WakingQueue(self.wakeup.set, 100),
                                       clock=self.clock)
        except ValueError as e:  # an unreadable trusted key or device key file
            raise ConfigError(str(e)) from e
        if cfg.sparkplug.enabled:  # imported only then: protobuf and the schema cost ~3 MB
            from runtime.telemetry.sparkplug.node import sparkplug_node

            self.sparkplug = sparkplug_node(
                cfg.sparkplug, cfg.telemetry, self.device_id, self.outbox, self.state_dir,
                self.event, [s.name or "main" for s in cfg.sources or (cfg.source,) if s.trigger])

    def _start_pipeline(self) -> None:
        """Local results, the pipeline, each model on its top rung."""
        cfg = self.cfg
        if cfg.results.enabled:
            self.local = LocalResults(cfg.results, self._event_of)
            self.local.start()
        lanes = self.plan.lanes(self.sim.clock if self.sim else None)
        sink = self.plc.tap(self._stamped) if self.plc else self._stamped
        self.pipeline = Pipeline(lanes, self.box.model.manifest, sink,
                                 self._event_of, cfg.daemon.queue_size,
                                 installing.new_preprocess_chooser(self), self.local)
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

    # -- what OTA asks of the daemon (runtime.device.host.OtaHost) ---------------------------

    def measure_model(self, path: Path) -> Any:
        """The whole profiling schedule of a [model] directory (runtime.device.installing)."""
        return installing.measure(self, path)

    def load_in_background(self, path: Path, fresh: bool, why: str,
                           wait: bool = False) -> None:
        """Profile `path` in the background, installed between ticks (installing)."""
        installing.load_in_background(self, path, fresh, why, wait)

    def stopping(self) -> bool:
        """Whether a stop was requested."""
        return self._stop_requested

    def install_model(self, measured: Measured, why: str) -> float:
        """Install a measured [model] now (runtime.device.installing); the ladder's seconds."""
        return installing.install_model(self, measured, why)

    def live_energy_j(self) -> float | None:
        """The running [model] variant's live energy per inference (None: none yet)."""
        return live_energy.running_j(self)

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

    # -- events, load and the tick's snapshot ---------------------------------------------

    def event(self, type_: str, severity: str = "info", **fields: Any) -> None:
        """Record an event for the operator (log + outbox)."""
        status, r = self.clock.now()
        ev = {"v": 1, "t": r.wall, "type": type_, "severity": severity, **fields,
              "clk": wire_clock.stamp(status, r)}
        try:
            self.outbox.put("event", ev)
        except Exception as e:  # the outbox itself failing is logged, never raised here
            log.error("could not queue event %s: %s", type_, e)

    def _stamped(self, results: list[dict]) -> list[int]:
        """Store results, each stamped with the clock's state at its capture
        (runtime/wire/clock.py: the coordinator places unsynced ones once the clock is)."""
        status, r = self.clock.now()
        wire_clock.stamp_each(results, wire_clock.stamp(status, r), r.wall)
        return self.outbox.append_many(results)

    def _event_of(self, ev: dict) -> None:
        """An event a part made whole (the outbox's, the pipeline's, local results')."""
        self.event(ev.pop("type"), ev.pop("severity", "warning"), **ev)

    def frame_rung(self) -> Rung | None:
        """The running rung per frame of any source (tiles and several models counted)."""
        return None if self.pipeline is None or not self.box.model.rungs else self.box.frame_rung()

    def load_w(self) -> float:
        """Dynamic power of the inference load (runtime.device.tick.load_w)."""
        return load_w(self)

    def refresh_state(self, reports: bool = False) -> DeviceState:
        """Take the device's snapshot now and swap it in (main loop only; one assignment of a
        frozen object, so a reader on another thread has the old one or the new one whole).
        `reports`: the pipeline's and backlog's figures too (else the last snapshot's)."""
        before = self.state
        self.state = s = snapshot(self, None if reports else before)
        for name in stopped(before, s):
            self.event("integration_stopped", "error", integration=name)
        return s

    def status_line(self) -> str:
        """One line for systemd STATUS= and the log, of the latest snapshot."""
        return status_line(self.state) if self.state is not None else "starting"

    def health(self) -> dict[str, Any]:
        """The health message now (main loop only: a whole fresh snapshot first)."""
        return health(self.refresh_state(reports=True))

    def latest_health(self) -> dict[str, Any] | None:
        """The health message of the latest snapshot, None before the first (any thread: it
        reads `state` once and nothing else of the daemon)."""
        s = self.state
        return None if s is None else health(s)

    # -- re-profiling ---------------------------------------------------------------------------

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

    def set_constraints(self, c: Any, why: str = "new constraints", governor: Any = None) -> None:
        """New constraints (and governor settings): runtime.device.ladders.set_constraints."""
        ladders.set_constraints(self, c, why, governor)

    def reload(self) -> None:
        """SIGHUP: re-read the config and apply constraints and governor; a failure of any
        kind is reported and the old config stays (runtime.device.commands.reload)."""
        if self.config_path is None:
            log.warning("SIGHUP without --config: nothing to reload")
            return
        commands.reload(self, self.config_path, self.print_results)

    def restore_config(self, old: Config) -> None:
        """Back to `old` after a reload failed half-way through applying it."""
        ladders.restore_config(self, old)

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
            installing.apply_installs(self)
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

    def control_tick(self) -> None:
        """One control step (runtime.device.tick)."""
        control_tick(self)

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
        self.history.close()
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

