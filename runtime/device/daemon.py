"""`edgerun serve`: the long-running appliance process, and its composition root `Daemon`.

Start-up (`start()`, each step logs; a failure says which step and why): config -> device
profile -> simulator (if enabled) -> sensors -> outbox -> model manifest and profiles (cached)
-> selector and ladder -> first session loaded and warmed -> pipeline -> MQTT -> READY=1.

The main loop (`run()`) then gives every duty its turn: commands and installs as they come,
the control step every `governor.tick_s`, health every `telemetry.health_interval_s`,
WATCHDOG=1 only while the infer loop's heartbeat is fresh; SIGTERM drains in-flight frames
and stops, SIGHUP reloads the config (an invalid file is reported and the old config kept).

The work lives in the parts, each given the collaborators it needs, never the daemon: what is
served in `serving.py`, the links in `links.py`, model versions `ota.py`, duty cycling
`sleep.py`, commands `commands.py` (docs/architecture.md: the rest). Each tick the loop takes
one frozen `DeviceState` (`state.py`), all that health, status, birth and the APIs read.
"""

from __future__ import annotations

import logging
import math
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from power.box_energy import BoxEnergy
from power.energy import EnergyState
from power.nvml import gpu_meters
from power.sensors import detect_meter
from runtime.config import Config, ConfigError
from runtime.device import commands, installing, instance
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
from runtime.device.wakeup import Signals, Wakeup, WakingQueue
from runtime.device.wear import WriteRate
from runtime.durable import make_dir
from runtime.frames.pipeline import Pipeline
from runtime.wire import clock as wire_clock

log = logging.getLogger("edgerun.daemon")

# the main loop's longest sleep: a status line or a beat a stalled pipeline held back is seen
MAX_SLEEP_S = 1.0


def health_due(now: float, next_health: float, board_t: float | None,
               board_next: float) -> bool:
    """Whether the main loop sends health now: by the wall (`now` past `next_health`), or,
    while a simulated board runs (`board_t`, its clock; None: not simulating, or its run is
    over), by the board's clock alone (`board_next`: health_interval_s times the speed after
    the last). The wall's cadence on the board's clock was as uneven as the host's pace: 20 s
    on a loaded host, 214 s in the catch-up after a stall, which `edgerun report` drew as a
    gap, its energy not counted: 24 % of the awake energy of a loaded run (2026-12-08)."""
    if board_t is None:
        return now >= next_health
    return board_t >= board_next


class Daemon:
    """One `edgerun serve` process: wires its parts, runs the main loop, snapshots, stops."""

    def __init__(self, cfg: Config, config_path: Path | None = None):
        self.cfg, self.config_path = cfg, config_path  # as started (in force: `serving.cfg`)
        self.notify = Notifier()
        self.state_dir = Path(cfg.daemon.state_dir).expanduser()
        self.started = time.monotonic()
        self.writes = WriteRate()  # this process's disk writes a day (health `storage`)
        self.card_writes = WriteRate()  # and its card's
        self.wakeup = Wakeup()  # the main loop sleeps on it (runtime/device/wakeup.py)
        self.signals = Signals(self.wakeup)  # a stop or a reload asked, read by the loop
        self.sim: Any = None  # runtime.device.simdevice.SimulatedDevice when simulating
        self.sleeper: Any = None  # runtime.device.sleep.Sleeper when [sleep] is enabled
        self.ota: DeviceOta | None = None  # model versions, deploy, probation ([models])
        self.operator = OperatorState(self.state_dir)  # overrides and learnt state, kept
        # can wall time be believed: every stamp's (wire/clock.py; a fake sysfs holds its flag)
        root = cfg.device.sysfs_root or "/"
        self.clock = wire_clock.Clock(root, kernel=root == "/")
        # the outbox, MQTT, Sparkplug, the PLC servers, the local API (runtime/device/links.py)
        self.links = Links(cfg, self.state_dir, self.clock, lambda *a, **kw: self.event(*a, **kw))
        # -- parts made by start(), in its order --
        self.serving: Serving | None = None  # what is served and why (runtime/device/serving.py)
        self.pipeline: Pipeline | None = None
        # the device at the last tick, frozen: all any reader reads (state.py); None at first
        self.state: DeviceState | None = None
        self.installs: queue.Queue[Install] = WakingQueue(self.wakeup.set)  # measured, to install
        self.profiler = Profiler(lambda *a, **kw: self.event(*a, **kw), self.installs.put)
        self.print_results = False  # `serve --print` (serve() sets it; reload keeps it)
        self._instance: int | None = None  # the outbox's lock, held while the process lives
        self._said_last_end = False  # the unclean_stop event queued

    # -- start-up --------------------------------------------------------------------------

    def start(self) -> None:
        """Bring every part up in order; raises with the failing step named."""
        if why := make_dir(self.state_dir):  # a file in its place, a read-only parent
            raise ConfigError(f"daemon.state_dir {self.state_dir} {why}")
        self._instance = instance.claim_outbox(Path(self.cfg.telemetry.outbox.path).expanduser())
        boot = wire_clock.read(kernel=False).boot_id
        last_end = None if self._instance is None else instance.take_over(self._instance, boot)
        try:
            self._bring_up(last_end)
        except BaseException:
            # a start-up that failed says why in its log and exits: not an unclean stop; but
            # how the run before ended, not said yet, is left for the next start to say
            if last_end and not self._said_last_end:
                instance.put_back(self._instance, last_end, boot)
            else:
                instance.mark_stopped(self._instance)
            raise

    def _bring_up(self, last_end: str | None) -> None:
        """start()'s steps once the outbox is this process's (`last_end`: how the run before
        it ended, when not cleanly)."""
        # commands sent earlier outlive restarts (and the config file's [constraints]); so do
        # the harvest forecast learnt (`kept`) and the operator's rate cap
        self.cfg, kept = self.operator.restore(self.cfg)
        self._open_device(kept)
        self._open_links()
        if last_end:
            log.warning("%s", instance.SAID[last_end])
            self.event("unclean_stop", "warning", how=last_end)
            self._said_last_end = True
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
            stopping=lambda: self.signals.stop, changed=self._changed, energy=energy,
            simulated=self.sim is not None)

    def _open_links(self) -> None:
        """The outbox and the events that waited for it; the local API (503 until the
        pipeline runs), OTA, the PLC servers, MQTT and Sparkplug: made now so a bad key file
        fails before minutes of profiling."""
        cfg, links, plan = self.cfg, self.links, self.serving.plan
        links.open_outbox()
        if self.serving.thermal_disabled:
            self.event("governor_disabled", "critical", reason=self.serving.thermal_disabled)
        links.open_local_api(self.latest_health,
                             lambda: self.pipeline.alive(cfg.local_api.stall_s))
        plan.device_id = links.device_id
        try:  # a key file, an [opcua] file or asyncua, pypylon
            self.ota = DeviceOta(self.serving, cfg.models, cfg.telemetry, self.state_dir,
                                 links.device_id)
            plan.edges = links.open_plc()
            plan.check_extras()
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
                                 serving.new_preprocess_chooser(), links.local,
                                 durable=links.outbox.last_seq)
        serving.start(self.pipeline)

    def _start_services(self) -> None:
        """OTA (a probation resumes), the simulator, duty cycling, the links."""
        self.ota.started()
        if self.sim:
            self.sim.start()
        from runtime.device import sleep as sleep_mod

        up = Uplink(self.links.outbox, self.links.publisher, self.health,
                    lambda h: self.links.send_health(h, self.serving.trips))
        self.sleeper = sleep_mod.create(self.cfg, self.serving, up, self.sim)
        # sleeping for real: its plan spends the battery, not the control step's budget
        self.serving.set_duty_cycled(bool(self.sleeper and not self.sleeper.disabled))
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

    # -- main loop ----------------------------------------------------------------------------

    def run(self) -> int:
        """Run until SIGTERM/SIGINT; returns the exit code."""
        self.signals.install()
        # tick_s is device time. Simulating, the loop is the simulated board's clock
        # (lockstep, runtime/device/simdevice.py): each tick moves the plant by exactly
        # tick_s, paced to [simulator] speed when the host keeps up, slower when it cannot.
        tick = self.cfg.governor.tick_s
        nap = min(0.05, tick)
        next_tick = next_health = last_beat = 0.0
        sim_health = 0.0  # simulating: the board's time the next health is due (health_due)
        status = ""
        while not self.signals.stop:
            if self.sim:
                self.wakeup.wait(min(nap, self.sim.due_in(tick)))
            else:  # until the next duty; signals, commands and installs wake it earlier
                now, wd = time.monotonic(), self.notify.watchdog_s
                beat = last_beat + wd / 4 if wd else math.inf
                due = min(next_tick, next_health, beat if beat > now else math.inf)
                self.wakeup.wait(min(MAX_SLEEP_S, due - now))
            now = time.monotonic()
            if self.signals.take_reload():  # the old config stays if the new one is refused
                commands.reload(self.serving, self.config_path, self.print_results)
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
                    if not self.sim.finished:  # (a sleep in this tick may have ended it)
                        self.sim.advance(tick)  # the plant runs the decision just taken
                    if self.sim.finished:
                        # The batch was counted before its ticks ran: one of them may have
                        # slept past the end (a sleep moves the clock by minutes), and the
                        # rest ran the plant on past `hours`, a log line each. The board
                        # stops here, capture with it: frames the simulated camera had
                        # already released went on being inferred (a burst the control
                        # loop no longer ended), results made in no simulated time
                        # (2026-12-08).
                        self.pipeline.rate_cap_hz = 0.0
                        next_health = 0.0  # the end's tally at once
                        break
                    if self.sim.clock.now() >= sim_health:
                        break  # health comes between ticks, not after a catch-up's batch
            if ticked:  # simulating, once per batch of ticks
                self._safe(self.refresh_state, "taking the device's snapshot failed")
            running = self.sim is not None and not self.sim.finished
            board_t = self.sim.clock.now() if self.sim is not None else 0.0
            if health_due(now, next_health, board_t if running else None, sim_health):
                interval = self.cfg.telemetry.health_interval_s
                next_health = now + interval
                if self.sim is not None:
                    sim_health = board_t + interval * self.sim.pace.speed
                self.links.send_health(self.health(), self.serving.trips)
                # (the health's put retried a full disk: files whose results it flushed)
                self._safe(self.pipeline.release_durable, "marking files done failed")
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
        """Run a step of the loop, which survives its own bugs (the snapshot stays), saying so."""
        try:
            step()
        except Exception as e:
            log.exception("%s", failed)
            self.event("control_failed", "critical", error=str(e)[:300])

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
        self.links.history.close()  # first: the outbox's close may raise
        lost = self.links.outbox.close()  # results held in memory the disk refused to the end
        self.wakeup.close()
        instance.mark_stopped(self._instance)
        log.info("stopped; %d results not yet acked stay in the outbox for the next start%s",
                 stats["results_held"] - lost,
                 f" ({lost} held in memory were lost: the disk refused them)" if lost else "")
