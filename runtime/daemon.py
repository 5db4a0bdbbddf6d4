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

import logging
import math
import queue
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from power import energy
from power import governor as gov
from power.closed_loop import governor_config
from power.device import DeviceProfile, load_profile
from power.sensors import SensorSet, detect_meter
from runtime import __version__
from runtime.backends import discover
from runtime.config import Config, ConfigError, load
from runtime.manifest import load_manifest, model_files
from runtime.pipeline import Active, Pipeline
from runtime.profiler import Profiler, default_threads, plan
from runtime.selector import Constraints, NoVariantError, Profile, Rung, ladder, select
from runtime.selector import select_for_budget as fit_budget
from runtime.sources import open_source
from runtime.systemd import Notifier
from runtime.telemetry.client import Publisher, device_id
from runtime.telemetry.commands import Command
from runtime.telemetry.outbox import Outbox

log = logging.getLogger("edgerun.daemon")


def versions() -> dict[str, str]:
    """Versions of edgerun and the engines, for birth and health."""
    out = {"edgerun": __version__}
    for mod, name in (("onnxruntime", "onnxruntime"), ("openvino", "openvino"),
                      ("cv2", "opencv")):
        try:
            out[name] = str(__import__(mod).__version__)
        except Exception:  # an engine that is not installed has no version to report
            continue
    return out


def ladder_for(profiles: list[Profile], c: Constraints) -> tuple[list[Rung], str]:
    """Rungs the governor may use (cheapest first) and the selector's reason.

    The top rung is the selector's choice (lowest energy meeting latency and accuracy floor);
    below it, the cheaper frontier variants that still meet the latency target: the governor
    trades accuracy below the operator's floor only to protect the device.
    """
    choice = select(profiles, c)
    meets = [p for p in profiles if p.ok and p.latency(c.percentile) <= c.latency_ms]
    rungs = [r for r in ladder(meets, c.percentile) if r.energy_j <= choice.profile.energy_mj / 1e3]
    top = ladder([choice.profile], c.percentile)[0]
    rungs = [r for r in rungs if r.variant_id != top.variant_id] + [top]
    return rungs, choice.reason


class Daemon:
    """One `edgerun serve` process (see module docstring)."""

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
        self.sim = None
        self.publisher: Publisher | None = None
        self.current = 0
        self.hold = gov.RungHold()
        self.gstate = gov.GovernorState()
        self.decision = gov.Decision(math.inf, reason="start")
        self.estate: energy.EnergyState | None = None
        self.operator_rate_hz = math.inf  # `set_rate`; governor caps come on top
        self.reading = None
        self._last_problems: tuple[str, ...] = ()
        self._reprofiling = threading.Lock()
        self._installs: queue.Queue = queue.Queue()
        self._last_reprofile = -math.inf

    # -- start-up --------------------------------------------------------------------------

    def start(self) -> None:
        """Bring every part up in order; raises with the failing step named."""
        cfg = self.cfg
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.device: DeviceProfile = load_profile(cfg.device.profile)
        root = Path(cfg.device.sysfs_root)
        if cfg.simulator.enabled:
            from runtime.simdevice import SimulatedDevice

            root = Path(cfg.simulator.root or self.state_dir / "sim-sysfs")
            self.sim = SimulatedDevice(self.device, root, cfg.simulator.scenario,
                                       cfg.simulator.speed, cfg.simulator.start_hour,
                                       self._load_w)
            log.info("simulated %s, scenario %s at %gx, sysfs tree %s", self.device.name,
                     cfg.simulator.scenario, cfg.simulator.speed, root)
        th = self.device.thermal
        clock = (lambda: self.sim.plant.s.t) if self.sim else time.monotonic
        self.sensors = SensorSet(root, th.zone if th else "",
                                 self.device.sensors.battery or (
                                     self.device.battery.path if self.device.battery else ""),
                                 self.device.solar.path if self.device.solar else "", clock)
        self.meter = detect_meter(root, self.device)
        self.outbox = Outbox(cfg.telemetry.outbox, on_event=self._outbox_event)
        if (ev := self.outbox.take_startup_event()) is not None:
            self.event(ev.pop("type"), "critical", **ev)
        self.device_id = device_id(cfg.telemetry)
        if cfg.telemetry.broker.host:  # made now so a bad key file fails before profiling
            try:
                self.publisher = Publisher(cfg.telemetry, self.outbox, self._birth,
                                           state_dir=self.state_dir)
            except ValueError as e:  # an unreadable trusted key or device key file
                raise ConfigError(str(e)) from e
        model_path = Path(cfg.model.path) if cfg.model.path else _bundled_model()
        # Engines are discovered once per process: re-creating them (a second ov.Core while the
        # first is torn down) was seen to leave the process crashing on its next signal.
        self.backends = discover(cfg.backends)
        self.devices = [{"backend": b.name, "id": d.id, "name": d.name, **d.details}
                        for b in self.backends for d in b.devices()]  # fixed for the process
        self._install(self._measure_model(model_path))
        self.pipeline = Pipeline(lambda: open_source(cfg.source, self.state_dir,
                                                     cfg.telemetry.broker, self.device_id),
                                 self.manifest, self.outbox.append_many, self._pipeline_event,
                                 cfg.daemon.queue_size, self._preprocess_chooser())
        self.pipeline.latency_target_ms = cfg.constraints.latency_ms
        self.pipeline.start(self._session(len(self.rungs) - 1))
        self.current = len(self.rungs) - 1
        if self.sim:
            self.sim.start()
        if self.publisher:
            self.publisher.start()
        else:
            log.info("no telemetry.broker.host: results are kept in the outbox only")
        self.notify.ready(self.status_line())
        log.info("ready in %.2f s: %s", time.monotonic() - self.started, self.status_line())

    def _measure_model(self, path: Path, fresh: bool = False) -> dict[str, Any]:
        """Manifest, verified forms and their profiles (cached unless `fresh`). Changes no
        daemon state, so it can run on a background thread; `_install` applies the result."""
        cfg = self.cfg
        manifest = load_manifest(path)

        def refused(v, e) -> None:
            log.error("variant %s refused: %s; running on the others", v.name, e)
            self.event("variant_refused", "critical", variant=v.name, error=str(e))

        forms = model_files(manifest, refused)
        threads = cfg.backends.threads or default_threads()
        work = plan(self.backends, forms, threads, cfg.backends)
        profiler = Profiler(cfg.profiler, self.meter, self.device.name)
        idle_w = profiler.idle_w()
        t0 = time.monotonic()
        profiles = []
        for i, (b, d, v) in enumerate(work, start=1):
            # A cold first start profiles every variant (minutes): keep systemd's start
            # timeout moving and say how far it got.
            self.notify.send("EXTEND_TIMEOUT_USEC=120000000",
                             f"STATUS=profiling {manifest.name}: variant {i}/{len(work)}")
            profiles.append(profiler.profile(b, d, v, fresh=fresh))
        log.info("%d variants of %s profiled in %.1f s (%d failed)", len(profiles),
                 manifest.name, time.monotonic() - t0, sum(1 for p in profiles if not p.ok))
        ladder_for(profiles, self._constraints())  # raises NoVariantError before any change
        return {"manifest": manifest, "profiles": profiles, "idle_w": idle_w,
                "loaders": {v.id: (b, v) for b, _, v in work},
                "temp": self.sensors.read().temp_c}

    def _install(self, m: dict[str, Any]) -> None:
        """Make measured profiles current (main thread only) and rebuild the ladder."""
        old = getattr(self, "manifest", None)
        self.manifest, self.profiles, self.idle_w = m["manifest"], m["profiles"], m["idle_w"]
        self._loaders, self.profile_temp = m["loaders"], m["temp"]
        self._build_ladder()
        if hasattr(self, "pipeline"):  # a new model brings its own preprocessing to measure
            self.pipeline.set_manifest(self.manifest, self.preprocess if (
                old is not None and old.root == self.manifest.root) else self._preprocess_chooser())

    def _load_in_background(self, path: Path, fresh: bool, why: str) -> None:
        """Profile in a thread (minutes on a cold cache must not stall the main loop and its
        watchdog beats); the main loop installs the result between ticks."""
        if not self._reprofiling.acquire(blocking=False):
            self.event("reprofile_skipped", "info", reason=f"{why}: already profiling")
            return
        self._last_reprofile = time.monotonic()
        log.info("profiling in the background: %s", why)
        self.event("reprofile", "info", reason=why)

        def work() -> None:
            try:
                self._installs.put((self._measure_model(path, fresh), why))
            except Exception as e:
                log.exception("profiling %s failed; keeping the current model and profiles", path)
                self.event("reprofile_failed", "warning", reason=why, error=str(e)[:300])
            finally:
                self._reprofiling.release()

        threading.Thread(target=work, name="reprofile", daemon=True).start()

    def _apply_installs(self) -> None:
        while True:
            try:
                measured, why = self._installs.get_nowait()
            except queue.Empty:
                return
            self._install(measured)
            self._to_top(why)

    def _to_top(self, why: str) -> None:
        """After the ladder was rebuilt: run its top rung, with a fresh upgrade hold."""
        self.current = min(self.current, len(self.rungs) - 1)
        self._move(len(self.rungs) - 1, self.reading.t if self.reading else 0.0, why)
        self.hold = gov.RungHold(self.current)

    def _preprocess_chooser(self):
        """CPU or OpenCL preprocessing, measured per frame size (see runtime/preprocessing)."""
        from runtime.preprocessing import PreprocessChooser

        ocl = next((b for b in self.backends if b.name == "opencl" and b.devices()), None)
        factory, name = None, "opencl"
        pre = self.manifest.preprocess
        if ocl is not None and pre.layout == "NCHW" and pre.resize in ("bilinear", "nearest"):
            from runtime.backends.opencl import OpenClPreprocessor

            dev = ocl.devices()[0].id
            name = f"opencl:{dev}"
            cache: dict = {}

            def factory(shape, ocl=ocl, dev=dev, cache=cache):
                if shape not in cache:
                    cache[shape] = OpenClPreprocessor(ocl, dev, pre, shape)
                return cache[shape]

        self.preprocess = PreprocessChooser(pre, self.meter, self.idle_w, factory, name)
        return self.preprocess

    def _constraints(self) -> Constraints:
        c = self.cfg.constraints
        return Constraints(latency_ms=c.latency_ms, percentile=c.percentile,
                           accuracy_floor=c.accuracy_floor)

    def _build_ladder(self) -> None:
        self.rungs, self.choice_reason = ladder_for(self.profiles, self._constraints())
        self.by_id = {p.variant_id: p for p in self.profiles}
        log.info("choice: %s; ladder (cheapest first): %s", self.choice_reason,
                 ", ".join(f"{r.variant_id} acc {r.accuracy:.3f} {r.energy_j * 1e3:.2f} mJ"
                           for r in self.rungs))
        th = self.device.thermal
        self.gcfg = None
        if th is not None and self.cfg.governor.policy != "off":
            self.gcfg = governor_config(self.device, self.rungs, self.cfg.governor.rate_hz,
                                        self.cfg.governor.policy)
        self.ecfg = None
        if self.device.battery is not None and self.cfg.governor.energy:
            b = self.device.battery
            self.ecfg = energy.EnergyConfig(b.capacity_wh, self.device.power.idle_w,
                                            self.rungs[-1].power_w(self.cfg.governor.rate_hz),
                                            b.reserve_frac, b.charge_efficiency)
            # The harvest forecast is days of learning: a rebuilt ladder must not reset it.
            if getattr(self, "estate", None) is None:
                self.estate = energy.initial_state(self.ecfg)

    def _session(self, rung: int) -> Active:
        """Load and warm the session of a rung (the caller swaps it in)."""
        vid = self.rungs[rung].variant_id
        backend, variant = self._loaders[vid]
        session = backend.load(variant)
        pre, shape = self.manifest.preprocess, variant.model.input_shape
        warm = pre.apply(np.full((*pre.hw(shape), 3), 128, np.uint8), shape)  # mid-grey
        for _ in range(3):
            session.infer(warm)
        return Active(rung, vid, session, variant.model.input_shape)

    # -- events and health -------------------------------------------------------------------

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

    def _load_w(self) -> float:
        """Dynamic power of the inference load now: rung energy x measured rate."""
        a = self.pipeline.active if hasattr(self, "pipeline") else None
        if a is None:
            return 0.0
        return self.rungs[min(a.rung, len(self.rungs) - 1)].energy_j * self.pipeline.rate_hz()

    def _birth(self) -> dict[str, Any]:
        a = self.pipeline.active
        return {"versions": versions(), "model": self.manifest.name,
                "choice": a.variant_id if a else ""}

    def status_line(self) -> str:
        """One line for systemd STATUS= and the log."""
        a = self.pipeline.active
        temp = self.reading.temp_c if self.reading else None
        return (f"{a.variant_id if a else '-'} rung {self.current + 1}/{len(self.rungs)}"
                + (f", {temp:.1f} °C" if temp is not None else "")
                + (f", {self.decision.reason}" if self.decision.reason else ""))

    def health(self) -> dict[str, Any]:
        """Everything an operator needs to judge this device at a glance."""
        r = self.reading
        th = self.device.thermal
        a = self.pipeline.active
        prof = self.by_id.get(a.variant_id) if a else None
        h = {
            "v": 1, "t": time.time(), "boot": self.outbox.boot,
            "uptime_s": round(time.monotonic() - self.started, 1),
            "temp_c": r.temp_c if r else None,
            "passive_trip_c": th.trip("passive").temp_c if th else None,
            "throttled": bool(r and r.temp_c is not None and th
                              and r.temp_c >= th.trip("hot").temp_c),
            "battery_frac": r.battery_frac if r else None,
            "sensor_problems": list(r.problems) if r else [],
            "model": self.manifest.name, "choice": a.variant_id if a else "",
            "choice_reason": self.choice_reason,
            "rung": self.current, "rungs": len(self.rungs),
            "accuracy": self.rungs[self.current].accuracy,
            "energy_mj": prof.energy_mj if prof else None, "energy_source": self.meter.source,
            "power_w": round(self.device.power.idle_w + self._load_w(), 3),  # idle + inference
            "governor": {"policy": self.cfg.governor.policy, "level": self.decision.level,
                         "budget_w": None if math.isinf(self.decision.budget_w)
                         else round(self.decision.budget_w, 4),
                         "reason": self.decision.reason},
            "rate_cap_hz": self.pipeline.rate_cap_hz or None,
            "pipeline": self.pipeline.stats(), "backlog": self.outbox.stats(),
            "devices": self.devices,
            "preprocess": self.preprocess.report,
        }
        h["slo"] = h["pipeline"].pop("slo")
        if self.publisher:
            s = self.publisher.stats
            h["mqtt"] = {"connected": s.connected, "acked_seq": s.acked_seq,
                         "resends": s.resends, "commands_refused": s.commands_refused}
        if self.sim:
            h["simulated"] = {"t": self.sim.plant.s.t, "ambient_c": round(
                self.sim.plant.ambient_c(self.sim.plant.s.t), 2)}
        return h

    # -- control ------------------------------------------------------------------------------

    def control_tick(self) -> None:
        """Read sensors, step the governor (+ energy budget), move along the ladder."""
        r = self.sensors.read()
        self.reading = r
        if r.problems != self._last_problems:
            if r.problems:
                log.warning("sensor problem (the governor fails safe): %s", "; ".join(r.problems))
                self.event("sensor_invalid", "warning", problems=list(r.problems))
            else:
                self.event("sensor_recovered", "info")
            self._last_problems = r.problems
        decision = gov.Decision(math.inf, reason="")
        if self.gcfg is not None:
            self.gstate, decision = gov.step(self.gstate, r, self.gcfg)
        if self.ecfg is not None and self.estate is not None:
            self.estate, edec = energy.step(self.estate, r, self.ecfg)
            decision = gov.combine(decision, edec)
        for e in decision.events:
            self.event("governor", "warning", detail=e)
        self.decision = decision
        rate = self.cfg.governor.rate_hz
        proposed, fit_rate = fit_budget(self.rungs, decision.budget_w, rate, self.current)
        dwell, max_dwell = (self.gcfg.dwell_s, self.gcfg.max_dwell_s) if self.gcfg else (0, 0)
        hold = gov.hold(replace(self.hold, rung=self.current), proposed, r.t, dwell, max_dwell)
        cap = min(decision.rate_cap_hz, fit_rate if fit_rate < rate else math.inf,
                  self.operator_rate_hz)
        self.pipeline.rate_cap_hz = cap if math.isfinite(cap) else 0.0
        if hold.rung != self.current:
            self._move(hold.rung, r.t, decision.reason or "budget")
        if self.current == hold.rung:  # a failed switch keeps the old rung and its timing
            self.hold = hold
        self._check_conditions(r.temp_c)

    def _move(self, rung: int, t: float, why: str) -> None:
        """Load and warm the rung's session and hand it to the pipeline (an event)."""
        a = self.pipeline.target
        if a is not None and a.variant_id == self.rungs[rung].variant_id:
            self.current = rung  # same variant, new index (the ladder was rebuilt)
            return
        old = a.variant_id if a else self.rungs[self.current].variant_id
        try:
            active = self._session(rung)
        except Exception as e:  # a variant that will not load is reported; stay where we are
            log.error("cannot switch to %s: %s; staying on %s", self.rungs[rung].variant_id, e,
                      old)
            self.event("switch_failed", "warning", variant=self.rungs[rung].variant_id,
                       error=str(e)[:300])
            return
        self.pipeline.switch(active)
        log.info("rung %d -> %d: %s -> %s (%s)", self.current, rung, old, active.variant_id, why)
        self.event("rung_changed", "info", **{"from": old, "to": active.variant_id,
                                              "rung": rung, "reason": why})
        self.current = rung
        self.notify.status(self.status_line())
        if self.publisher:
            self.publisher.request_rebirth()

    def _check_conditions(self, temp: float | None) -> None:
        """Re-profile when the temperature moved far from the profiling one, or inference
        became slower than profiled (throttling); at most once per 10 minutes."""
        if time.monotonic() - self._last_reprofile < 600:
            return
        why = None
        if temp is not None and self.profile_temp is not None and abs(
                temp - self.profile_temp) > self.cfg.daemon.reprofile_temp_delta_c:
            why = f"temperature {temp:.1f} °C, profiled at {self.profile_temp:.1f} °C"
        a = self.pipeline.active
        p95 = self.pipeline.stats()["latency_ms"]["p95"]
        prof = self.by_id.get(a.variant_id) if a else None
        # Both a ratio and an absolute margin: sub-millisecond models run a little slower
        # paced (cold caches) than profiled back to back, and that is not throttling.
        if prof and p95 and len(self.pipeline.latencies) >= 50 and (
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
        log.info("command %s %s", cmd.name, cmd.args)
        c = self.cfg.constraints
        if cmd.name == "set_latency_target":
            self._set_constraints(replace(c, latency_ms=cmd.args["ms"]))
        elif cmd.name == "set_accuracy_floor":
            self._set_constraints(replace(c, accuracy_floor=cmd.args["value"]))
        elif cmd.name == "set_rate":  # 0 = no operator cap
            self.operator_rate_hz = cmd.args["fps"] or math.inf
        elif cmd.name == "reprofile":
            self._last_reprofile = -math.inf
            self.reprofile("operator command")
        elif cmd.name == "choose_model":
            target = self.manifest.root.parent / cmd.args["name"]
            if not (target / "manifest.json").is_file():
                self.event("command_failed", "warning", command=cmd.name,
                           error=f"{target}: no model directory with a manifest")
                return
            self._load_in_background(target, False, f"model {cmd.args['name']} chosen")
        self.event("command_applied", "info", command=cmd.name, args=cmd.args, id=cmd.id)

    def _set_constraints(self, c, why: str = "new constraints", governor=None) -> None:
        """Rebuild the ladder for new constraints (and governor settings) and go to its top;
        on NoVariantError everything stays as it was."""
        old = self.cfg
        self.cfg = replace(self.cfg, constraints=c, governor=governor or self.cfg.governor)
        try:
            self._build_ladder()
        except NoVariantError as e:
            self.cfg = old
            self._build_ladder()
            raise ValueError(str(e)) from e
        self.pipeline.latency_target_ms = c.latency_ms
        self._to_top(why)

    def reload(self) -> None:
        """SIGHUP: re-read the config; keep the old one (and say why) if it is invalid."""
        if self.config_path is None:
            log.warning("SIGHUP without --config: nothing to reload")
            return
        try:
            new = load(self.config_path)
        except ConfigError as e:
            log.error("config reload refused, still running with the previous config: %s", e)
            self.event("config_reload_failed", "warning", error=str(e))
            return
        restart = [k for k in ("device", "model", "source", "telemetry", "simulator", "daemon",
                               "backends", "profiler") if getattr(new, k) != getattr(self.cfg, k)]
        try:
            self._set_constraints(new.constraints, "config reloaded", new.governor)
        except ValueError as e:
            log.error("config reload refused, still running with the previous config: %s", e)
            self.event("config_reload_failed", "warning", error=str(e))
            return
        log.info("config reloaded (constraints and governor applied)%s",
                 f"; changes to {', '.join(restart)} need a restart" if restart else "")
        self.event("config_reloaded", "info", needs_restart=restart)

    # -- main loop ----------------------------------------------------------------------------

    def run(self) -> int:
        """Run until SIGTERM/SIGINT; returns the exit code."""
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGHUP, self._on_reload_signal)
        tick = self.cfg.governor.tick_s
        next_tick = next_health = last_beat = 0.0
        status = ""
        while not self._stop_requested:
            time.sleep(0.05)
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
                self.outbox.put("health", self.health())
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

    def stop(self) -> None:
        """Drain in-flight frames (their results are stored), say offline, close."""
        self.notify.stopping()
        log.info("stopping: draining in-flight frames")
        self.pipeline.stop()
        if self.sim:
            self.sim.stop()
        if self.publisher:
            self.publisher.stop()
        stats = self.outbox.stats()
        self.outbox.close()
        log.info("stopped; %d results not yet acked stay in the outbox for the next start",
                 stats["results_held"])


def _bundled_model() -> Path:
    from models import bundled

    return bundled()


def serve(config_path: Path | None) -> int:
    """Entry point of `edgerun serve`."""
    cfg = load(config_path)
    daemon = Daemon(cfg, config_path)
    try:
        daemon.start()
    except Exception:
        Notifier().status("start-up failed; see the journal")
        raise
    return daemon.run()


__all__ = ["Daemon", "ladder_for", "serve", "versions"]
