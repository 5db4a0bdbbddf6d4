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
work lives in its parts (runtime/device/), each given the collaborators it needs, never the
daemon. What is served and why has one owner, `Serving` (`serving.py`): the constraints in
force, the control tick, the ladders (`model_ladder.py`, `served_model.py`), the sources'
plan, the rung switch, live energy and drift. Beside it: the models installed at start-up
`installing.py`, the commands and SIGHUP `commands.py`, model versions `ota.py`, MQTT,
Sparkplug and the PLC servers `links.py`, duty cycling `sleep.py`, the operator's state
`operator_state.py`, background profiling `profiling.py`, sensors `sensing.py`, the stop's
order `shutdown.py`. Each control tick the main loop takes one frozen `DeviceState`
(`state.py`); health, the STATUS= line, birth, Home Assistant, the local API and OPC UA read
only that.
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

from power.box_energy import BoxEnergy
from power.energy import EnergyState
from power.nvml import gpu_meters
from power.sensors import detect_meter
from runtime.config import Config, ConfigError
from runtime.device import commands, installing
from runtime.device.health import health
from runtime.device.links import Links
from runtime.device.operator_state import OperatorState
from runtime.device.ota import DeviceOta
from runtime.device.profiles import load_profile
from runtime.device.profiling import Install, Profiler
from runtime.device.sensing import open_sensors
from runtime.device.serving import Serving
from runtime.device.shutdown import stop_steps
from runtime.device.sleep import Uplink
from runtime.device.state import DeviceState, snapshot, stopped
from runtime.device.status import status_line
from runtime.device.systemd import Notifier
from runtime.device.wakeup import Wakeup, WakingQueue
from runtime.device.wear import WriteRate
from runtime.frames.pipeline import Pipeline
from runtime.wire import clock as wire_clock

log = logging.getLogger("edgerun.daemon")

# The main loop sleeps until its next duty; at most this long, so the status line and a
# watchdog beat held back by a stalled pipeline are looked at again soon.
MAX_SLEEP_S = 1.0


class Daemon:
    """One `edgerun serve` process (see module docstring). Wires the parts and loops; what is
    served lives in runtime.device.serving, the health message in runtime.device.health."""

    def __init__(self, cfg: Config, config_path: Path | None = None):
        self.cfg = cfg  # as started: the wiring's sections (in force: `serving.cfg`)
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
        self.sleeper: Any = None  # runtime.device.sleep.Sleeper when [sleep] is enabled
        self.ota: DeviceOta | None = None  # model versions, deploy, probation ([models])
        self.operator = OperatorState(self.state_dir)  # overrides and learnt state, kept
        # whether wall time can be believed; the stamp every result, health and event carries
        # (runtime/wire/clock.py); a fake sysfs root holds the fake timesyncd flag too
        root = cfg.device.sysfs_root or "/"
        self.clock = wire_clock.Clock(root, kernel=root == "/")
        # the outbox, MQTT, Sparkplug, the PLC servers, the local API (runtime/device/links.py)
        self.links = Links(cfg, self.state_dir, self.clock, lambda *a, **kw: self.event(*a, **kw))
        # -- parts made by start(), in its order --
        self.serving: Serving | None = None  # what is served and why (runtime/device/serving.py)
        self.pipeline: Pipeline | None = None
        # the device at the last tick, frozen: what every reader reads (runtime/device/
        # state.py); replaced whole by the main loop, None until the pipeline runs
        self.state: DeviceState | None = None
        # what the background threads measured, for the main loop (any thread puts)
        self.installs: queue.Queue[Install] = WakingQueue(self.wakeup.set)
        self.profiler = Profiler(lambda *a, **kw: self.event(*a, **kw), self.installs.put)
        self.print_results = False  # `serve --print` (serve() sets it; reload keeps it)

    # -- start-up --------------------------------------------------------------------------

    def start(self) -> None:
        """Bring every part up in order; raises with the failing step named."""
        kept = self._restore_operator_state()
        self._open_device(kept)
        self._open_outbox()
        self._open_links()
        rest = installing.install_models(self.serving, self.ota)
        self._start_pipeline()
        self.refresh_state(reports=True)  # birth, Home Assistant, OPC UA read it from now on
        self._start_services()
        self.refresh_state()
        self.notify.ready(self.status_line())
        log.info("ready in %.2f s: %s", time.monotonic() - self.started, self.status_line())
        if rest is not None:  # the fast schedule: serve on the first choice, refine meanwhile
            self.profiler.run(lambda: rest(self.pipeline.exclusive), "profiling refined",
                              self.serving.model_gen)

    def _restore_operator_state(self) -> EnergyState | None:
        """Commands sent earlier outlive restarts (and the config file's [constraints]); so
        do the harvest forecast learnt (returned) and the operator's rate cap."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        energy = self.operator.load()
        if self.operator.settings:
            self.cfg = replace(self.cfg, constraints=self.operator.constraints(
                self.cfg.constraints))
        return energy

    def _open_device(self, energy: EnergyState | None) -> None:
        """The device profile, the simulator (if enabled), the sensors and the power meter,
        and what is served on them (`energy`: the harvest forecast kept)."""
        cfg = self.cfg
        device = load_profile(cfg.device.profile)
        root = Path(cfg.device.sysfs_root)
        if cfg.simulator.enabled:
            from runtime.device.simdevice import simulate

            self.sim = simulate(cfg, device, self.state_dir, lambda: self.serving.sim_load())
            root = self.sim.root
        # the control loop's time: never a step (runtime/wire/clock.py steady)
        clock = (lambda: self.sim.plant.s.t) if self.sim else wire_clock.steady()
        sensing = open_sensors(root, device, cfg.governor.policy, clock)
        meter = detect_meter(root, device)
        box_energy = BoxEnergy(meter, device.power.idle_w, device.power.active_w_per_core,
                               lambda t, sev, f: self.event(t, sev, **f))
        self.serving = Serving(
            cfg, device=device, sensing=sensing, meter=meter, gpu_meters=gpu_meters(),
            box_energy=box_energy, profiler=self.profiler, operator=self.operator,
            state_dir=self.state_dir, installs=self.installs,
            event=lambda *a, **kw: self.event(*a, **kw), notify=self.notify,
            stopping=lambda: self._stop_requested, changed=self._changed, energy=energy,
            simulated=self.sim is not None)

    def _open_outbox(self) -> None:
        """The outbox, and the events that waited for it (its own start-up, the governor)."""
        self.links.open_outbox()
        if self.serving.thermal_disabled:
            self.event("governor_disabled", "critical", reason=self.serving.thermal_disabled)

    def _open_links(self) -> None:
        """The local API (503 until the pipeline runs), OTA, the PLC servers, MQTT and
        Sparkplug: made now so a bad key file fails before minutes of profiling."""
        cfg, links, plan = self.cfg, self.links, self.serving.plan
        links.open_local_api(self.latest_health,
                             lambda: self.pipeline.alive(cfg.local_api.stall_s))
        plan.device_id = links.device_id
        try:  # a key file, an [opcua] file or asyncua, pypylon
            self.ota = DeviceOta(self.serving, cfg.models, cfg.telemetry, self.state_dir,
                                 links.device_id)
            plan.edges = links.open_plc()
            if any(s.kind == "pylon" for s in (cfg.sources or (cfg.source,))):
                from runtime.frames.pylon_source import pypylon

                pypylon()  # an extra: said now, not as a source retried for ever
        except (ValueError, ImportError) as e:
            raise ConfigError(str(e)) from e
        links.open_mqtt(lambda: self.state, self.ota.precheck,
                        WakingQueue(self.wakeup.set, 100))

    def _start_pipeline(self) -> None:
        """Local results, the pipeline, each model on its top rung."""
        links, serving = self.links, self.serving
        links.open_results()
        lanes = serving.plan.lanes(self.sim.clock if self.sim else None)
        self.pipeline = Pipeline(lanes, serving.box.model.manifest, links.sink(),
                                 links.event_of, self.cfg.daemon.queue_size,
                                 serving.new_preprocess_chooser(), links.local)
        serving.start(self.pipeline)

    def _start_services(self) -> None:
        """OTA (a probation resumes), the simulator, duty cycling, the links."""
        self.ota.started()
        if self.sim:
            self.sim.start()
        from runtime.device import sleep as sleep_mod

        up = Uplink(self.links.outbox, self.links.publisher, self.health)
        self.sleeper = sleep_mod.create(self.cfg, self.serving, up, self.sim)
        self.links.start(self.latest_health)

    # -- events and the snapshot ----------------------------------------------------------

    def event(self, type_: str, severity: str = "info", **fields: Any) -> None:
        """Record an event for the operator (log + outbox): every part's sink."""
        self.links.record(type_, severity, **fields)

    def _changed(self) -> None:
        """The [model] or its rung changed (Serving, OTA): a new snapshot first (once there
        are any), so the MQTT thread sends the change in a new birth; systemd's status."""
        if self.state is not None:
            self.refresh_state()
        if self.links.publisher:
            self.links.publisher.request_rebirth()
        self.notify.status(self.status_line())

    def refresh_state(self, reports: bool = False) -> DeviceState:
        """Take the device's snapshot now and swap it in (main loop only; one assignment of a
        frozen object, so a reader on another thread has the old one or the new one whole).
        `reports`: the pipeline's and backlog's figures too (else the last snapshot's)."""
        before = self.state
        self.state = s = snapshot(self.serving, self, None if reports else before)
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

    # -- reload -------------------------------------------------------------------------------

    def reload(self) -> None:
        """SIGHUP: re-read the config and apply constraints and governor; a failure of any
        kind is reported and the old config stays (runtime.device.commands.reload)."""
        if self.config_path is None:
            log.warning("SIGHUP without --config: nothing to reload")
            return
        commands.reload(self.serving, self.config_path, self.print_results)

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
            if self.links.publisher is not None:
                commands.drain(self.serving, self.ota, self.links.publisher.commands)
            self.serving.apply_installs(self.ota.apply)
            # simulating, the ticks that are overdue run back to back (a batch: no nap)
            ticked = False
            for _ in range(self.sim.ticks_due(tick) if self.sim else int(now >= next_tick)):
                next_tick = now + tick
                self._safe(self.control_tick, "control tick failed")
                ticked = True
                if self.sim:
                    self.sim.advance(tick)  # the plant runs the decision just taken
            if ticked:  # simulating, once per batch of ticks
                self._safe(self.refresh_state, "taking the device's snapshot failed")
            if now >= next_health:
                next_health = now + self.cfg.telemetry.health_interval_s
                self.links.send_health(self.health(), self.serving.trips)
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
        """One control step of what is served, then probation and duty cycling their turn."""
        self.serving.tick(time.monotonic())
        self.ota.tick()  # probation of a new model version
        if self.sleeper:  # duty cycling: the schedule's cap, and the sleep between bursts
            self.sleeper.after_control()

    def _safe(self, step: Callable[[], Any], failed: str) -> None:
        """Run a step of the loop; the loop survives its own bugs (the readers keep the
        previous snapshot), saying so."""
        try:
            step()
        except Exception as e:
            log.exception("%s", failed)
            self.event("control_failed", "critical", error=str(e)[:300])

    def _on_stop_signal(self, *_: Any) -> None:
        self._stop_requested = True  # only a flag: no locks, no I/O in a signal handler

    def _on_reload_signal(self, *_: Any) -> None:
        self._reload_requested = True  # only a flag (the wake-up fd woke the loop)

    def request_reload(self) -> None:
        """Reload the config at the main loop's next turn (a flag, then a wake-up; any
        thread but a signal handler, which sets the flag alone)."""
        self._reload_requested = True
        self.wakeup.set()

    def close_partial(self) -> None:
        """After start-up was abandoned while profiling (nothing had started threads yet):
        close the outbox, which keeps its data."""
        if self.links.outbox is not None:
            self.links.outbox.close()
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
        stats = self.links.outbox.stats()
        self.links.outbox.close()
        self.wakeup.close()
        log.info("stopped; %d results not yet acked stay in the outbox for the next start",
                 stats["results_held"])
