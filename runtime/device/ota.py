"""The daemon's side of model updates: deploy, swap between frames, probation, rollback.

- At start (`model_path`): count a start made in probation (a crash loop rolls back, see
  runtime/ota/model_store.py) and serve the version the pointer names, else the configured model.
- `precheck` answers a `choose_model`/`deploy` command before it is accepted: a name or
  version that is not on the device (or was rolled back here) is `rejected` with the reason.
- `deploy`: download, verify and profile on a background thread (cached profiles reused);
  the main loop then `apply`s it: the pointer is switched (atomic), the new session is loaded
  and warmed and handed to the pipeline, which swaps it in between two frames.
- Probation (runtime/ota/probation.py): every control tick the new model's live KPIs since the
  swap are judged against the old model's at the swap, with every Nth frame also run on the old
  model for top-1 agreement: on the session that ran at the swap (kept loaded), and on the old
  version's session of the other forms the governor moves the new one to (up to 3, loaded
  then, runtime/device/shadow_loads.py), like with like. Failed: back to the old model (kept
  in memory, so again between frames) and an event saying why; passed: an event, and the old
  model's session is closed.
- The KPIs are the swapped model's own, not the box's: on a box where other sources run their
  own models (choice/joint.py), frames, errors and p95 count only the [model] section's model
  (runtime/frames/model_counts.py: by pipeline key and model directory, so the old version's frames
  are not the new one's either), p95 is per inference and is compared with that model's own
  per-inference target (`Serving.target_ms`: `[constraints] latency_ms` on a one-source box).

What is served is reached through runtime.device.serving.Serving: the [model] it serves, its
measuring and installing, and `changed` (a new snapshot and birth).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from runtime.device.profiling import Install, Stopping
from runtime.device.shadow_loads import ShadowLoads
from runtime.durable import crash_point
from runtime.frames.model_counts import ModelId, Tally, model_id
from runtime.frames.shadow import form
from runtime.ota.model_store import ModelStore
from runtime.ota.probation import (
    MIN_SHADOW,
    Kpis,
    Limits,
    judge,
    judged_shadow,
    shadow_failed,
    shadow_wait_frames,
)
from runtime.wire.events import EventType

if TYPE_CHECKING:
    from runtime.device.serving import Serving
    from runtime.frames.pipeline import Active
    from runtime.wire.commands import Command

log = logging.getLogger("edgerun.ota")


@dataclass
class _Run:
    """A probation in progress."""

    version: str | None
    baseline: Kpis | None
    since: float  # monotonic time of the swap (model_counts tallies by it)
    results0: int  # the new model's own counts at the swap (runtime/frames/model_counts.py)
    errors0: int
    prev: Any = None  # runtime.choice.measure.Measured of the old model (None after a restart)
    state: str = "pending"
    reasons: tuple[str, ...] = ()
    kpis: dict[str, Any] = field(default_factory=dict)
    mixed_said: bool = False  # the log said the agreement is judged on every form
    no_shadow: bool = False  # the old session kept failing: judged without agreement


class DeviceOta:
    """See module docstring. One per daemon; `apply`, `tick` and `rollback` run on the main
    thread, `precheck` on the MQTT thread, the download/verify/profile on its own thread."""

    def __init__(self, serving: Serving, cfg: Any, telemetry: Any, state_dir: Path,
                 device_id: str):
        """`cfg`: the [models] section; `telemetry`: the [telemetry] section (the broker a
        bundle may come through); `device_id`: this device's telemetry id."""
        from runtime.ota.install import trusted_keys

        self.serving = serving
        self.cfg = cfg
        self.telemetry, self.device_id = telemetry, device_id
        self.store = ModelStore(state_dir)
        self.trusted = trusted_keys(self.cfg)  # ValueError naming a bad key file
        self.version: str | None = None  # store version served; None: the configured model
        self.configured: Path | None = None
        self.probation: _Run | None = None
        self.last: dict[str, Any] = {}  # the last verdict, for health
        self._busy = threading.Lock()  # one install at a time
        self.thread: threading.Thread | None = None  # the install running (joined at stop)
        self._step = ""  # download | verify | profile: where a failed install stopped
        self._loads = ShadowLoads()  # the old version's sessions of other forms

    # -- start --------------------------------------------------------------------------------

    def model_path(self, configured: Path) -> Path:
        """The directory to serve at start (see module docstring)."""
        self.configured = configured
        why = self.store.boot(self.cfg.crash_boots)
        if why:
            log.critical("model rolled back: %s", why)
            self.serving.event(EventType.MODEL_ROLLED_BACK, "critical", reason=why,
                               to=self.store.read().get("current") or "configured")
        vid, path = self.store.serving()
        self.version = vid
        if path is not None:
            log.info("serving model version %s from %s", vid, path)
        crash_point("serving")  # tests: a daemon that dies at every start (a crash loop)
        return path or configured

    def first_model(self, path: Path, measure: Any) -> Any:
        """`measure(path)` for start-up; when the store's version cannot be loaded (a file
        corrupted on disk since it was verified, every variant refused) it is rolled back
        and the previous version (or the configured model) is measured instead: the device
        comes back serving a model, never none."""
        from runtime.choice.selector import NoVariantError
        from runtime.engine.onnx_model import ModelError

        while True:
            try:
                return measure(path)
            except (ModelError, NoVariantError) as e:
                if self.version is None:
                    raise  # the configured model itself: nothing to fall back to
                failed = self.version
                why = f"cannot load {failed} at start: {e}"
                self.store.rollback(why[:500])
                self.version, served = self.store.serving()
                path = served or self.configured
                log.critical("model %s rolled back: %s; serving %s", failed, why,
                             self.version or "the configured model")
                self.serving.event(EventType.MODEL_ROLLED_BACK, "critical", version=failed,
                                   to=self.version or "configured", reason=why[:1000])

    def started(self) -> None:
        """After the pipeline started: a restart during probation resumes it (no old model in
        memory: agreement is not sampled, the baseline comes from the pointer)."""
        doc = self.store.read()
        pro = doc.get("probation")
        if pro and doc.get("current") == self.version:
            log.warning("resuming the probation of %s after a restart (start %d of at most %d)",
                        self.version, pro.get("boots", 0) + 1, self.cfg.crash_boots)
            self._begin(Kpis.from_dict(pro.get("baseline")), None, None)

    # -- commands -----------------------------------------------------------------------------

    def precheck(self, cmd: Command) -> str | None:
        """A reason to reject `cmd` now, or None (MQTT thread; file checks only)."""
        if cmd.name == "choose_model":
            name = cmd.args["name"]
            if why := self.store.rejected(name):
                return f"model {name} was rolled back on this device: {why}"
            if self.store.has(name) or self._sibling(name) is not None:
                return None
            have = self.store.ids() + self._siblings()
            return (f"no model {name!r} on this device (have: {', '.join(have) or 'none'}); "
                    "send a bundle with `edgerun fleet deploy`")
        if cmd.name == "deploy":
            from runtime.ota.bundle import BundleError, model_id

            try:  # the rule the bundle itself and the coordinator's shelf are held to
                vid = model_id(cmd.args["name"], cmd.args["version"])
            except BundleError as e:
                return str(e)
            if not self.trusted:
                return ("this device trusts no publisher keys ([models] publisher_keys): it "
                        "cannot verify any bundle")
            if why := self.store.rejected(vid):
                return f"model {vid} was rolled back on this device: {why}"
            if cmd.args["size"] > self.cfg.max_bundle_mb * 1024 * 1024:
                return (f"bundle of {cmd.args['size']} bytes is over [models] max_bundle_mb "
                        f"= {self.cfg.max_bundle_mb:g}")
            if self._busy.locked():
                return "busy: another model install is running"
        return None

    def _sibling(self, name: str) -> Path | None:
        """A model directory next to the configured one (the original `choose_model`)."""
        root = (self.configured if self.configured is not None
                else self.serving.box.model.manifest.root)
        p = Path(root).parent / name
        return p if (p / "manifest.json").is_file() else None

    def _siblings(self) -> list[str]:
        root = (self.configured if self.configured is not None
                else self.serving.box.model.manifest.root)
        try:
            return sorted(p.name for p in Path(root).parent.iterdir()
                          if (p / "manifest.json").is_file())
        except OSError:
            return []

    def choose(self, cmd: Command) -> bool:
        """`choose_model` of a store version: profile it, then swap (with probation). False
        when `name` is not a store version (the daemon's own handling applies)."""
        name = cmd.args["name"]
        if not self.store.has(name):
            return False
        if name == self.version:
            self.serving.event(EventType.MODEL_DEPLOYED, "info", version=name,
                               detail="already serving it")
            return True
        path = self.store.path(name)
        assert path is not None
        self._start(lambda: (path, name), f"model {name} chosen", name)
        return True

    def deploy(self, cmd: Command) -> None:
        """Download, verify, profile in the background; the main loop applies it."""
        a = cmd.args
        vid = f"{a['name']}@{a['version']}"
        if vid == self.version:
            self.serving.event(EventType.MODEL_DEPLOYED, "info", version=vid,
                               detail="already serving it")
            return

        def fetch() -> tuple[Path, str]:
            from runtime.ota.install import obtain, verify_step

            self._step = "download"
            bundle = self._download(a, obtain)
            self._step = "verify"
            try:
                info = verify_step(self.store, self.cfg, bundle)
            finally:  # unpacked into versions/ or refused: the downloaded file is done with
                bundle.unlink(missing_ok=True)
            if info.id != vid:
                from runtime.ota.bundle import BundleError

                raise BundleError(f"the bundle is {info.id}, the command deploys {vid}")
            path = self.store.path(vid)
            assert path is not None
            return path, vid

        self._start(fetch, f"model {vid} deployed", vid)

    def _download(self, a: dict[str, Any], obtain: Any) -> Path:
        """The `deploy`'s bundle, by the route `[models] fetch` says: over HTTP from the
        coordinator's API, in chunks over MQTT through the broker, or "auto": HTTP, and MQTT
        when the API cannot be connected to at all (an HTTP error answered by the API is not a
        reason to switch). Both write the same part file: either resumes the other's."""
        from runtime.ota.download import DownloadError

        mode, tel = self.cfg.fetch, self.telemetry
        if mode != "mqtt":
            try:
                return obtain(self.store, self.cfg, a["url"], a["size"], a["sha256"],
                              a["token"])
            except DownloadError as e:
                if mode == "http" or not e.unreachable or not tel.broker.host:
                    raise
                log.warning("%s; fetching the bundle through the broker instead ([models] "
                            "fetch = \"auto\")", e)
        if not tel.broker.host:
            raise DownloadError('[models] fetch = "mqtt" needs a broker ([telemetry.broker] '
                                "host)")
        from runtime.ota.bundle_mqtt import fetch_over_mqtt

        def check_stop() -> None:
            if self.serving.stopping():
                raise Stopping("stop requested during the bundle download (the part is kept)")

        c = self.cfg
        # the file name runtime.ota.install.obtain gives it: one part file for both routes
        dest = self.store.downloads / f"{a['sha256'][:24]}.edgerun"
        return fetch_over_mqtt(dest, tel.broker, tel.fleet, self.device_id,
                               f"{a['name']}@{a['version']}", a["size"], a["sha256"],
                               a["token"], int(c.max_bundle_mb * 1024 * 1024),
                               int(c.min_free_mb * 1024 * 1024), c.mqtt_chunk_kb * 1024,
                               c.mqtt_window, c.mqtt_timeout_s, check_stop)

    def _start(self, obtain: Any, why: str, version: str) -> None:
        """Obtain `version` (name@version) with `obtain` and profile it on a thread of its
        own; a second install while one runs is refused (`busy` in its event)."""
        if not self._busy.acquire(blocking=False):
            self.serving.event(EventType.MODEL_DEPLOY_FAILED, "warning", reason=why,
                               version=version, busy=True,
                               error="another model install is running")
            return
        log.info("%s: download, verify and profile in the background", why)

        def work() -> None:
            self._step = "download"
            # Below the inference threads: live frames first, the new model's profile second
            # (a cold profile at normal priority delayed frames around the swap).
            with contextlib.suppress(OSError, AttributeError):
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
            try:
                path, vid = obtain()
                self._step = "profile"
                measured = self.serving.measure(path)
                self.serving.installs.put(Install(measured, why, version=vid))
            except Stopping:
                return
            except Exception as e:
                # `why` says what was asked ("model X deployed"), not that it happened
                log.error("%s, but installing it failed at step %s: %s; still serving %s",
                          why, self._step, e, self.version or "the configured model")
                self.serving.event(EventType.MODEL_DEPLOY_FAILED, "warning", reason=why,
                                   version=version, step=self._step, error=str(e)[:500])
            finally:
                self._busy.release()

        self.thread = threading.Thread(target=work, name="model-install", daemon=True)
        self.thread.start()

    # -- swap (main thread) -------------------------------------------------------------------

    def apply(self, measured: Any, why: str, vid: str) -> None:
        """Switch the pointer to `vid` and the pipeline to its session between two frames;
        probation starts, against the model that was running."""
        d = self.serving
        baseline = self.kpis_now()
        # The running session becomes the shadow: the pipeline keeps it open after the swap
        # (no second session to load, which would hold the GIL while frames wait).
        shadow = d.pipeline.target
        if shadow is not None and shadow.manifest is None:
            shadow = self._second_session()  # a session without its model: load one
        # the new model's forms (every variant that runs, not only its ladder's: a form off
        # the ladder now may be on it after a rebuild), given with the shadow before the
        # swap reaches the pipeline, so no frame is sampled against the last probation's form
        forms = frozenset(form(pr.variant_id) for pr in measured.profiles if pr.ok)
        d.pipeline.begin_shadow(shadow, self.cfg.shadow_every, forms)
        prev = d.box.model.measured()
        old = self.version
        t0 = time.perf_counter()
        self.store.switch(vid, baseline.to_dict())  # atomic: a restart now serves `vid`
        t1 = time.perf_counter()
        t2 = t1 + d.install_model(measured, why)  # the ladder; the rest, the session
        t3 = time.perf_counter()
        self.version = vid
        log.info("swap to %s prepared on the main loop in %.1f ms (pointer %.1f, ladder %.1f, "
                 "session load and warm-up %.1f); the pipeline takes it at its next frame",
                 vid, (t3 - t0) * 1e3, (t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3)
        target = d.pipeline.target
        if target is None or target.manifest is not d.box.model.manifest:
            self.probation = _Run(vid, baseline, time.monotonic(), 0, 0, prev)
            self.rollback("the new model's session did not load")
            return
        log.info("model %s -> %s (%s); probation: %d frames, agreement floor %.0f%%",
                 old or "configured", vid, why, self.cfg.probation_frames,
                 self.cfg.agreement_floor * 100)
        d.event(EventType.MODEL_SWAPPED, "info", **{"from": old or "configured", "to": vid,
                                                     "reason": why})
        self._begin(baseline, shadow, prev, forms)
        d.changed()

    def _begin(self, baseline: Kpis | None, shadow: Active | None, prev: Any,
               forms: frozenset[str] = frozenset()) -> None:
        p = self.serving.pipeline
        t = p.models.tally(self._swapped())  # a version chosen again has counts already
        self.probation = _Run(self.version, baseline, time.monotonic(), t.results, t.errors,
                              prev)
        p.begin_shadow(shadow, self.cfg.shadow_every, forms)
        self._loads.reset()

    def _second_session(self) -> Active | None:
        """A second session of the running variant, for the shadow sample (None when it will
        not load: probation then goes without agreement)."""
        try:
            return self.serving.second_session()
        except Exception as e:
            a = self.serving.pipeline.active
            log.warning("cannot load a second session of %s for the shadow sample: %s",
                        a.variant_id if a else "-", e)
            return None

    def _swapped(self) -> ModelId:
        """The model OTA swaps and judges: the [model] section's, as the pipeline counts it."""
        return model_id("", self.serving.box.model.manifest)

    def kpis_now(self, since: float = 0.0, results0: int = 0, errors0: int = 0) -> Kpis:
        """The [model] section's running model's own KPIs (not the other sources' models'):
        frames and errors since the counts given, p95 per inference of its inferences stored
        since `since` (monotonic time), live energy per inference."""
        # Live energy only (CPU time per inference on this traffic, runtime.device.live_energy): the
        # profiles of two models are measured at different times and loads, so comparing a
        # live figure with a profiled one blamed a copy of the same model for 8x the energy.
        # None until the running variant has its first live figure (or when simulating).
        # Per model already: the [model]'s variants are keyed by their id alone, the
        # sources' own models by key and id (pipeline.live_id).
        live = self.serving.live_energy_j()
        return model_kpis(self.serving.pipeline.models.tally(self._swapped(), since), results0,
                          errors0, live)

    # -- probation (main thread, every control tick) ------------------------------------------

    def tick(self) -> None:
        """Judge the running probation; pass or roll back."""
        run = self.probation
        p = self.serving.pipeline
        self._loads.tick(p, run.prev if run is not None else None, run is not None)
        if run is None:
            return
        new = self.kpis_now(run.since, run.results0, run.errors0)
        if p.shadow.old is not None and shadow_failed(p.shadow.mixed[0], p.shadow.failed):
            log.warning("probation of %s: the old model's session failed %d shadow "
                        "inferences (last: %s); judged without agreement from now on, as "
                        "when no old session loads", run.version, p.shadow.failed,
                        p.shadow.last_error)
            run.no_shadow = True
            self._drop_shadow()
        (compared, agreed), like = judged_shadow(
            (p.shadow.counts[0], p.shadow.counts[1]), (p.shadow.mixed[0], p.shadow.mixed[1]),
            new.frames,
            shadow_wait_frames(self.cfg.probation_frames, self.cfg.shadow_every),
            self.cfg.agreement_floor, run.no_shadow)
        if not like and p.shadow.only is not None and not run.mixed_said:  # said once
            run.mixed_said = True
            log.warning("probation of %s: the agreement is judged on every form now: %d of %d "
                        "frames ran on the old model's form %s (the governor held the new "
                        "model on other rungs), too few for the like-with-like sample",
                        run.version, new.frames - p.shadow.other_form, new.frames,
                        p.shadow.only)
        # the swapped model's own per-inference target (runtime/choice/joint.py): with other
        # sources on their own models the box's frame target is not this model's
        target = self.serving.target_ms()
        lim = Limits(target, self.cfg.probation_frames,
                     self.cfg.agreement_floor, self.cfg.max_error_rate_increase,
                     self.cfg.energy_factor,
                     min_shadow=MIN_SHADOW if p.shadow.old is not None else 0)
        v = judge(run.baseline, new, compared, agreed, lim)
        run.kpis = {"frames": new.frames, "errors": new.errors, "p95_ms": new.p95_ms,
                    "target_ms": target, "energy_mj": new.energy_mj,
                    "shadow_compared": compared, "agreement": v.agreement}
        self.last = {"version": run.version, "state": v.state, "reasons": list(v.reasons),
                     **run.kpis}
        if v.state == "passed":
            self.probation = None
            self._drop_shadow()
            self.store.passed()
            log.info("model %s passed probation: %s; kept", run.version,
                     probation_summary(run.kpis))
            self.serving.event(EventType.MODEL_PROBATION_PASSED, "info",
                               version=run.version or "", **_clean(run.kpis))
        elif v.state == "failed":
            self.rollback("; ".join(v.reasons))

    def _drop_shadow(self) -> None:
        self.serving.pipeline.begin_shadow(None)

    def stop_loads(self) -> None:
        """The daemon stops: old sessions still loading are waited for and closed."""
        self._loads.close()

    def rollback(self, reason: str) -> None:
        """Back to the previous version (pointer, then pipeline between two frames)."""
        run, self.probation = self.probation, None
        self._drop_shadow()
        failed = self.version
        now = self.store.rollback(reason)
        self.version = now
        log.critical("model %s rolled back to %s: %s", failed, now or "the configured model",
                     reason)
        self.serving.event(EventType.MODEL_ROLLED_BACK, "critical", version=failed or "",
                           to=now or "configured", reason=reason[:1000],
                           **_clean(run.kpis if run else {}))
        self.last = {"version": failed, "state": "rolled_back", "reasons": [reason[:1000]]}
        d = self.serving
        if run is not None and run.prev is not None:
            d.install_model(run.prev, f"rollback of {failed}")
        else:
            path = self.store.path(now) or self.configured
            # after a profiling under way (the cold start's refinement), never skipped
            d.load_in_background(path, False, f"rollback of {failed}", wait=True)
        d.changed()

    def health(self) -> dict[str, Any]:
        """`model_version` and `probation` for the health message."""
        return {"model_version": self.version or "",
                "probation": _clean({**self.last, "reasons": self.last.get("reasons", [])})
                if self.last else None}


def model_kpis(t: Tally, results0: int = 0, errors0: int = 0,
               energy_j: float | None = None) -> Kpis:
    """Probation's KPIs from one model's tally (runtime/frames/model_counts.py): frames attempted
    and errors since the counts `results0`/`errors0`, the p95 of the inference latencies in
    the tally, and the live energy per inference (J, shown in mJ)."""
    results, errors = t.results - results0, t.errors - errors0
    p95 = float(np.percentile(t.latencies_ms, 95)) if t.latencies_ms else None
    return Kpis(results + errors, errors, p95, energy_j * 1e3 if energy_j is not None else None)


def probation_summary(k: dict[str, Any]) -> str:
    """A probation's figures (`run.kpis`) as one line for the log."""
    agreement = k.get("agreement")
    shadow = (f"agreement {agreement:.0%} on {k.get('shadow_compared', 0)} shadow frames"
              if agreement is not None and k.get("shadow_compared") else
              "no shadow comparison")
    energy, p95 = k.get("energy_mj"), k.get("p95_ms")
    p95_s = f"p95 {p95:.2f} ms" if isinstance(p95, int | float) else "p95 unknown"
    return (f"{k.get('frames')} frames, {k.get('errors')} errors, {p95_s} (target "
            f"{k.get('target_ms', 0):g} ms), {shadow}, "
            + (f"energy {energy:.3f} mJ an inference" if energy is not None
               else "energy not measured"))


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    """Rounded numbers, no None (events and health stay small and schema-valid)."""
    out = {}
    for k, v in d.items():
        if v is None:
            continue
        out[k] = round(v, 4) if isinstance(v, float) else v
    return out


__all__ = ["DeviceOta", "crash_point", "model_kpis"]
