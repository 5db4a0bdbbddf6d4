"""Measures each variant: latency percentiles, energy per inference, the device that ran it.

Results are cached on disk (`[profiler] cache_dir`, by default the user's cache:
$XDG_CACHE_HOME/edgerun/profiles), keyed by the model file's content (sha256), never its path,
+ variant + device profile + library versions (each engine's version is in its device's
details) + input shape + profiler settings, so a restart does not re-profile and two copies
of a model share their entries. Failures are cached too (a failure record): a variant that
could not be loaded or run is skipped on later starts, with one log line per kind of failure,
until the engine version or the model file changes (both are in the key) or `--fresh`.

Two schedules: `profile_all` measures every variant at full length (`edgerun profile`, the
reference); `quick_pass` + `refine` is the fast cold start (runtime.choice.refine decides which
variants are worth measuring longer). Each profile says how far it was measured (`stage`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import platform
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager as ContextManager
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from power import accelerators as accel_mod
from power.cputime import inference_cpu_s
from power.nvml import NvmlMeter, meter_for
from power.sensors import PowerMeter, SensorError
from runtime import __version__
from runtime.choice.accel_window import MAX_WINDOW_S, AccelWindow
from runtime.choice.refine import (
    NOISE_FLOOR,
    RoundSettings,
    combine,
    finalists,
    keep,
    mean_ci,
    observed_floor,
    percentile_ci,
    rounds,
)
from runtime.choice.report import failure_kinds
from runtime.choice.selector import Constraints, Profile, profile_from_dict
from runtime.config import ModelConfig, ProfilerConfig
from runtime.durable import write_atomic
from runtime.engine.backends import (
    Backend,
    BackendError,
    Device,
    DeviceRefused,
    ModelFile,
    Variant,
)
from runtime.engine.onnx_model import file_sha256

log = logging.getLogger(__name__)

# Cache directories a write failed in, said once per process: a read-only mount logged a
# warning per variant stored, every round (29 lines in the first 4 s of `serve`). A write
# that works again takes its directory out, so a later failure is news again.
_UNWRITABLE: set[Path] = set()


def _cache_unwritable(cache: Path, e: OSError, costs: str) -> None:
    """Say once that `cache` refused a write (`costs`: what that costs), then only at debug."""
    level = logging.DEBUG if cache in _UNWRITABLE else logging.WARNING
    _UNWRITABLE.add(cache)
    log.log(level, "cannot write profile cache %s (%s); %s", cache, e, costs)

# 3: energy and cpu_ms from inference CPU time (ns), never process-wide
# 4: stage, energy_ci and latency_ci; failures are recorded
# 5: a failure's error names the model file as MODEL_PATH (an entry is keyed by the
#    file's content, so a cache shared by two checkouts reported the other one's path); a
#    schema 4 entry has another key, so it is a miss, measured again
# 6: accelerator windows sized to the meter's resolution; gap_w, energy_q
CACHE_SCHEMA = 6
MODEL_PATH = "{model file}"  # stands for the model file's path in a cached failure's error
KNOWN_FAILURE = "known-failure"  # the stage of a failure read back from the cache
STAGES = ("quick", "refined", "full")  # by round of runtime.choice.refine.rounds
CHUNK_S = 0.02  # with a pause gate: longest a serving frame waits for one measuring chunk
GAP_S = 0.002  # between chunks: time for a waiting frame to take the pipeline


def model_files(cfg: ModelConfig) -> list[ModelFile]:
    """The precision forms of the configured model: every variant of a manifest directory
    (sha256-verified), or a bare .onnx file as one fp32 form of unknown accuracy."""
    from runtime.engine import manifest

    return manifest.model_files(manifest.configured_model(cfg.path, cfg))


def default_threads() -> tuple[int, ...]:
    """1 and every core: the two ends of the thread axis."""
    return tuple(sorted({1, os.cpu_count() or 1}))


def _failed(v: Variant, error: str, status: str = "failed") -> Profile:
    return Profile(v.id, v.model.name, v.precision, v.engine, v.device, v.threads,
                   status=status, error=error, accuracy=v.model.accuracy,
                   options=dict(v.options))


def full_settings(c: ProfilerConfig) -> RoundSettings:
    """The profiler's full length (what `edgerun profile` measures every variant for)."""
    return RoundSettings(c.warmup_runs, c.min_runs, c.max_runs, c.time_budget_s, True)


class Profiler:
    """Profiles variants with one power meter; one instance per profiling run."""

    def __init__(self, cfg: ProfilerConfig, meter: PowerMeter, device_profile: str,
                 progress: Callable[[str], None] | None = None,
                 active_w_per_core: float = 1.0,
                 accelerators: Sequence[accel_mod.AcceleratorPower] = (),
                 gpu_meters: Sequence[NvmlMeter] = (),
                 on_event: Callable[[str, str, dict], None] | None = None):
        self._cfg, self._meter = cfg, meter
        # a variant on an accelerator is billed host CPU + the accelerator (power/accelerators.py)
        self._accelerators = tuple(accelerators)
        self._gpu_meters = list(gpu_meters)
        self._gpu_idle_w: dict[int, float] = {}
        # per GPU: W above idle in the gap after a kernel, and how it was obtained
        self._gpu_gap: dict[int, tuple[float | None, str]] = {}
        self._event = on_event or (lambda kind, level, data: log.warning("%s: %s", kind, data))
        # W per CPU-second for the estimate (and a real meter's fallback): the estimated
        # meter's own coefficient when that is the meter
        self._active_w = getattr(meter, "active_w_per_core", active_w_per_core)
        self._device_profile = device_profile
        self._progress = progress or (lambda _msg: None)
        self._idle_w: float | None = None
        self._hashes: dict[Path, str] = {}
        self._cache = cfg.cache_path()
        self._poll = meter.source in ("hwmon", "battery")  # integrating meters need samples

    @property
    def cfg(self) -> ProfilerConfig:
        """The profiler settings (the full length)."""
        return self._cfg

    # -- cache ---------------------------------------------------------------------------
    def cache_key(self, v: Variant, device: Device) -> str:
        """Everything that can change a measurement (or a failure): the model file's hash, the
        variant, the device and its engine's version, the profiler settings."""
        if v.model.path not in self._hashes:
            self._hashes[v.model.path] = file_sha256(v.model.path)
        c = self._cfg
        parts = [
            f"schema={CACHE_SCHEMA}", f"edgerun={__version__}", self._hashes[v.model.path],
            v.id, list(v.model.input_shape), self._device_profile, self._meter.source,
            device.name, sorted(device.details.items()), platform.machine(),
            [c.warmup_runs, c.min_runs, c.max_runs, c.time_budget_s],
        ]
        return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]

    def _cached(self, key: str, variant_id: str) -> Profile | None:
        f = self._cache / f"{key}.json"
        try:
            hit = profile_from_dict(json.loads(f.read_text()))
            if hit.variant_id != variant_id:  # the ladder finds variants by this id
                raise ValueError(f"variant_id is {hit.variant_id!r}, not {variant_id!r}")
            return hit
        except (FileNotFoundError, NotADirectoryError):  # no entry; or no cache directory
            # (a file in its place: the write side says so, once, not each lookup)
            return None
        except (OSError, ValueError, TypeError) as e:
            log.warning("profile cache entry %s is unreadable (%s); measuring again", f, e)
            return None

    def _store(self, key: str, p: Profile) -> None:
        try:
            self._cache.mkdir(parents=True, exist_ok=True)
            write_atomic(self._cache / f"{key}.json", json.dumps(asdict(p)))
            _UNWRITABLE.discard(self._cache)
        except OSError as e:
            _cache_unwritable(self._cache, e, "profiles will be measured again next start")

    def lookup(self, v: Variant, device: Device) -> Profile | None:
        """The cached profile of a variant (any stage; a failure as `known-failure`), with the
        manifest's accuracy now, or None."""
        hit = self._cached(self.cache_key(v, device), v.id)
        if hit is None:
            return None
        if hit.error:  # the failure as this copy of the model would say it
            hit = replace(hit, error=hit.error.replace(MODEL_PATH, str(v.model.path)))
        # Accuracy belongs to the manifest, not to the measurement: the same file profiled
        # bare (unknown) and then from a prepared manifest, or re-prepared on other images,
        # must not carry the cached run's accuracy.
        hit = replace(hit, accuracy=v.model.accuracy)
        return hit if hit.ok else replace(hit, stage=KNOWN_FAILURE)

    def record(self, v: Variant, device: Device, p: Profile) -> None:
        """Cache a profile or a failure record (its error naming the model file as
        MODEL_PATH: the entry stands for the file's content wherever a copy of it lies)."""
        if p.error:
            p = replace(p, error=p.error.replace(str(v.model.path), MODEL_PATH))
        self._store(self.cache_key(v, device), p)

    def refined_key(self, work: Work, constraints: Constraints) -> str:
        """The key of a finished refinement: every variant's cache key (so any change to a
        model file, engine or profiler setting invalidates it) and the constraints it was
        refined against (another target keeps other candidates)."""
        target = [constraints.latency_ms, constraints.percentile, constraints.accuracy_floor]
        if constraints.end_to_end_ms is not None:  # only then: earlier keys stay valid
            target.append(constraints.end_to_end_ms)
        parts = [sorted(self.cache_key(v, d) for _b, d, v in work), target]
        return "refined-" + hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]

    def refined(self, key: str) -> bool:
        """Whether the refinement with this key finished (`mark_refined`) on an earlier run:
        its results are all in the cache, so measuring again would only repeat it."""
        return (self._cache / f"{key}.done").is_file()

    def mark_refined(self, key: str) -> None:
        """Record that a refinement finished (after its profiles were cached). A cache that
        cannot be written only costs a refinement on the next start."""
        try:
            self._cache.mkdir(parents=True, exist_ok=True)
            (self._cache / f"{key}.done").write_text(json.dumps({"t": time.time()}))
        except OSError as e:
            _cache_unwritable(self._cache, e, "the refinement runs again next start")

    # -- measuring -----------------------------------------------------------------------
    def idle_w(self) -> float:
        """Idle power of the device, measured once per run (sampled every 50 ms), with every
        GPU meter's idle power over the same window, before any variant ran (a GPU keeps its
        active-idle power for seconds after a kernel: measured after one, its "idle" was the
        active-idle power). The window is long enough for each GPU meter's resolution
        (power/meter_resolution.py; measured here first)."""
        if self._idle_w is None:
            span = self._cfg.idle_baseline_s
            for m in self._gpu_meters:
                span = max(span, min(m.resolution().min_window_s(), MAX_WINDOW_S))
            t0, e0 = time.perf_counter(), self._meter.energy_j()
            g0 = [m.energy_j() for m in self._gpu_meters]
            end = t0 + span
            while time.perf_counter() < end:
                time.sleep(0.05)
                if self._poll:
                    self._meter.energy_j()
                for m in self._gpu_meters:
                    if m.needs_samples:
                        m.energy_j()
            t1 = time.perf_counter()
            self._idle_w = (self._meter.energy_j() - e0) / (t1 - t0)
            for m, e in zip(self._gpu_meters, g0, strict=True):
                self._gpu_idle_w[id(m)] = (m.energy_j() - e) / (t1 - t0)
        return self._idle_w

    def gpu_idle_w(self) -> dict[str, float]:
        """Each GPU meter's idle floor (W) by its `where`, as `idle_w` measured it."""
        self.idle_w()
        return {m.where: self._gpu_idle_w[id(m)] for m in self._gpu_meters
                if id(m) in self._gpu_idle_w}

    def _gpu_meter(self, actual_device: str) -> NvmlMeter | None:
        """The meter covering the accelerator a session runs on (None: on the host, or no
        meter covers it), with that GPU's idle power measured once per run."""
        if accel_mod.on_host(actual_device) or not self._gpu_meters:
            return None
        m = meter_for(self._gpu_meters, actual_device)
        if m is not None and id(m) not in self._gpu_idle_w:
            self._idle_w = None
            self.idle_w()  # a meter added after the baseline: measured again, all together
        return m

    def profile(self, backend: Backend, device: Device, v: Variant,
                fresh: bool = False, retry_failed: bool = True) -> Profile:
        """Measure one variant at full length (or return its cached full profile; a cached
        failure is returned as `known-failure` without trying again unless `fresh` and
        `retry_failed`: a re-profile for heat measures again, it does not retry failures)."""
        if not fresh or not retry_failed:
            hit = self.lookup(v, device)
            if hit is not None and (hit.stage == KNOWN_FAILURE
                                    or (hit.stage == "full" and not fresh)):
                self._progress(f"{v.id}: cached")
                return hit
        self._progress(f"{v.id}: measuring")
        p = self.measure(backend, v, full_settings(self._cfg))
        self.record(v, device, p)
        return p

    def measure(self, backend: Backend, v: Variant, s: RoundSettings,
                pause: Callable[[], ContextManager] | None = None) -> Profile:
        """Load, warm and measure one variant for one round's length; never cached here. With
        `pause`, every inference runs inside it, in chunks of at most CHUNK_S (the daemon
        passes the pipeline's per-frame lock: measuring waits between frames and serving waits
        at most one chunk, so the two never share the CPU)."""
        idle_w = self.idle_w()
        try:
            session = backend.load(v)
        except DeviceRefused as e:  # the device's, not the model's: recorded as refused
            log.debug("%s: %s", v.id, e)
            return _failed(v, str(e), status="refused")
        except BackendError as e:
            log.debug("%s: %s", v.id, e)
            return _failed(v, str(e))
        try:
            return self._run(session, v, idle_w, s, pause)
        except Exception as e:  # an engine failing at run time fails this variant only
            log.debug("%s: failed while running: %s", v.id, e)
            return _failed(v, f"{v.engine} failed while running {v.model.path}: {e}")
        finally:
            session.close()

    def _run(self, session, v: Variant, idle_w: float, s: RoundSettings,
             pause: Callable[[], ContextManager] | None) -> Profile:
        gate = pause or contextlib.nullcontext
        chunk_s = CHUNK_S if pause is not None else math.inf
        x = np.random.default_rng(0).standard_normal(v.model.input_shape).astype(np.float32)
        for _ in range(s.warmup_runs):
            with gate():
                out = session.infer(x)
        if not np.all(np.isfinite(out)):
            raise BackendError(v.engine, v.model.path, "output has NaN or Inf values")
        lat_ns: list[int] = []
        wall = cpu = energy = 0.0
        gpu = self._gpu_meter(session.actual_device)
        # the GPU's window spans every chunk, sized to its meter and aligned to its ticks
        win = AccelWindow(gpu) if gpu is not None else None
        done = False
        try:
            if win is not None:
                win.start()
        except SensorError as e:
            raise BackendError(v.engine, v.model.path, f"power meter failed: {e}") from e
        while not done:
            with gate():
                try:
                    e0 = self._meter.energy_j()
                except SensorError as e:
                    raise BackendError(v.engine, v.model.path,
                                       f"power meter failed: {e}") from e
                t0, c0 = time.perf_counter(), inference_cpu_s()
                while True:
                    t = time.perf_counter_ns()
                    session.infer(x)
                    lat_ns.append(time.perf_counter_ns() - t)
                    if self._poll:
                        self._meter.energy_j()
                    long_enough = win is None or win.enough()
                    n, now = len(lat_ns), time.perf_counter()
                    elapsed = wall + now - t0  # measuring time only, not the gaps
                    if long_enough and (
                            n >= s.max_runs or (n >= s.min_runs and elapsed >= s.time_budget_s)
                            or (elapsed >= 4 * s.time_budget_s and n >= 3)):
                        done = True
                        break
                    if now - t0 >= chunk_s:
                        break
                wall += time.perf_counter() - t0
                cpu += max(inference_cpu_s() - c0, 0.0)
                energy += self._meter.energy_j() - e0
            if not done:
                time.sleep(GAP_S)
        n = len(lat_ns)
        ms = np.asarray(lat_ns) / 1e6
        samples = ms.tolist()
        p50, p95, p99 = (float(np.percentile(ms, q)) for q in (50, 95, 99))
        source = self._meter.source
        if source == "estimated":
            # No meter: the estimate *is* inference CPU time x W per core. Going through the
            # meter and an idle baseline would add the noise of whatever else the process's
            # native threads did during the baseline, for nothing.
            per_inf_mj = cpu / n * self._active_w * 1e3
        else:
            per_inf_mj = (energy - idle_w * wall) / n * 1e3
        if per_inf_mj <= 0:
            # A real meter's delta drowned in other load (or idle drifted): work that ran is
            # never free. Fall back to the CPU-time estimate, labelled as such.
            per_inf_mj = cpu / n * self._active_w * 1e3
            source = f"{source}+estimated"
        metered = self._metered(win, v) if win is not None else None
        gpu_j, gpu_wall = metered if metered is not None else (None, wall)
        b = accel_mod.bill(n, per_inf_mj * n, source, session.actual_device, busy_s=wall,
                           accelerators=self._accelerators, metered_j=gpu_j,
                           meter_idle_w=self._gpu_idle_w.get(id(gpu)), wall_s=gpu_wall)
        if b.energy_mj is None:  # never billed as free: left out of the choice, saying why
            raise BackendError(v.engine, v.model.path, b.reason)
        per_inf_mj, source = b.energy_mj, b.source
        stage = "full" if s.final else "quick"
        gap_w, gap_source = self._gap(win, gpu) if metered is not None else (math.nan, "")
        q = win.error() if metered is not None else math.nan
        ci = mean_ci(samples)
        return Profile(
            v.id, v.model.name, v.precision, v.engine, v.device, v.threads,
            actual_device=session.actual_device, p50_ms=p50, p95_ms=p95, p99_ms=p99, runs=n,
            energy_mj=per_inf_mj, energy_source=source, cpu_ms=cpu / n * 1e3,
            accuracy=v.model.accuracy, options=dict(v.options), stage=stage,
            energy_ci=ci + q if q == q else ci, latency_ci=percentile_ci(samples, 95),
            gap_w=gap_w, gap_source=gap_source, energy_q=q,
        )

    def _metered(self, win: AccelWindow, v: Variant) -> tuple[float, float] | None:
        """(J, s) over the accelerator's window, or None when its readings cannot be
        trusted (power/meter_trust.py): then the bill falls back to the labelled estimate,
        with one event."""
        try:
            got = win.finish()
            why = win.problem()
        except SensorError as e:
            got, why = None, str(e)
        if why is None:
            return got
        self._event("accelerator_meter_distrusted", "warning",
                    {"meter": win.meter.where, "variant": v.id, "error": why[:300],
                     "detail": "billed the estimate ([[accelerators]]) instead"})
        return None

    def _gap(self, win: AccelWindow, gpu: NvmlMeter | None) -> tuple[float, str]:
        """The GPU's power above idle in the gap after a kernel, measured once per GPU
        right after its first trusted window (NaN with a label when it could not be)."""
        key = id(gpu)
        if key not in self._gpu_gap:
            try:
                w = win.gap_w(self._gpu_idle_w[key])
            except SensorError as e:
                w = None
                log.info("gap power of %s not measured: %s", win.meter.where, e)
            how = (f"nvml: measured over {win.need_s:.1f} s after a kernel"
                   if w is not None else "unknown: the meter did not move after a kernel")
            self._gpu_gap[key] = (w, how)
        w, how = self._gpu_gap[key]
        return (w if w is not None else math.nan), how


Work = list[tuple[Backend, Device, Variant]]


def plan(backends: list[Backend], models: list[ModelFile], threads: tuple[int, ...],
         backends_cfg) -> Work:
    """Every (backend, device, variant) to profile for these model forms."""
    work: Work = []
    for b in backends:
        devices = {d.id: d for d in b.devices()}
        for m in models:
            for v in b.variants(m, backends_cfg, threads):
                work.append((b, devices[v.device], v))
    return work


def log_failures(profiles: Sequence[Profile]) -> None:
    """One log line per kind of failure (engine and cause): new failures as a WARNING, failures
    known from the cache (skipped, not tried again) as INFO. Never a line per variant."""
    new = [p for p in profiles if not p.ok and p.stage != KNOWN_FAILURE]
    known = [p for p in profiles if not p.ok and p.stage == KNOWN_FAILURE]
    for engine, cause, ids in failure_kinds(new):
        log.warning("%s: %d variant%s failed (%s%s): %s; recorded, skipped on later starts "
                    "until the engine or the model changes (`edgerun profile --fresh` tries "
                    "again)", engine, len(ids), "s" if len(ids) > 1 else "", ids[0],
                    ", ..." if len(ids) > 1 else "", cause)
    for engine, cause, ids in failure_kinds(known):
        log.info("%s: %d variant%s skipped, known to fail (%s%s): %s", engine, len(ids),
                 "s" if len(ids) > 1 else "", ids[0], ", ..." if len(ids) > 1 else "", cause)


def profile_all(backends: list[Backend], models: list[ModelFile], threads: tuple[int, ...],
                backends_cfg, profiler: Profiler, fresh: bool = False,
                progress: Callable[[int, int, str], None] | None = None,
                screen: Callable[[Work], Work] | None = None) -> list[Profile]:
    """Profile every variant of every model form on every backend at full length; failures
    are profiles too (summarised in the log, one line per kind). `screen` filters the plan
    first (runtime/choice/hint_accuracy.py: an engine's own lower precision measured, or
    left out)."""
    work = plan(backends, models, threads, backends_cfg)
    if screen is not None:
        work = screen(work)
    out = []
    for i, (b, d, v) in enumerate(work, start=1):
        if progress:
            progress(i, len(work), v.id)
        out.append(profiler.profile(b, d, v, fresh=fresh))
    log_failures(out)
    return out


def _level(p: Profile) -> int:
    return STAGES.index(p.stage) if p.stage in STAGES else len(STAGES)


ENGINE_ORDER = ("onnxruntime", "openvino", "opencv", "opencl")


def quick_order(work: Work) -> Work:
    """The quick round's order: engines whose sessions load fastest first (ONNX Runtime
    builds a session in milliseconds, OpenVINO compiles for ~0.1 s, OpenCL builds kernels),
    and within an engine one variant of every model form before a second of any, so the
    first decision has seen every form (its accuracy floor needs the most accurate one)."""
    def key(item: tuple[int, tuple[Backend, Device, Variant]]) -> tuple:
        i, (_b, _d, v) = item
        rank = ENGINE_ORDER.index(v.engine) if v.engine in ENGINE_ORDER else len(ENGINE_ORDER)
        return rank, seen[i], i

    seen: list[int] = []
    count: dict[tuple[str, str], int] = {}
    for _b, _d, v in work:
        k = (v.engine, v.model.name)
        seen.append(count.get(k, 0))
        count[k] = seen[-1] + 1
    return [w for _, w in sorted(enumerate(work), key=key)]


def quick_pass(work: Work, profiler: Profiler, fresh: bool = False,
               progress: Callable[[int, int, str], None] | None = None,
               pause: Callable[[], ContextManager] | None = None,
               enough: Callable[[list[Profile]], bool] | None = None
               ) -> tuple[list[Profile], int, Work]:
    """The fast schedule's first round: each variant measured briefly (runtime.choice.refine's first
    round), or taken from the cache at whatever stage it reached (a known failure is skipped,
    even when `fresh`); results are cached as they come, so an interrupted start resumes.
    Cache hits are taken first (they cost a file read); after each variant measured,
    `enough(profiles so far)` may stop the round. Returns the profiles, how many came from
    the cache and the work not done yet (in `work` order)."""
    s = rounds(*_knobs(profiler.cfg))[0]
    out: list[Profile] = []
    todo: Work = []
    for b, d, v in work:
        hit = profiler.lookup(v, d)
        if fresh and hit is not None and hit.stage != KNOWN_FAILURE:
            hit = None  # measured again; a failure record stands (only --fresh retries it)
        if hit is not None:
            out.append(hit)
        else:
            todo.append((b, d, v))
    hits = len(out)
    for i, (b, d, v) in enumerate(todo, start=1):
        if progress:
            progress(hits + i, len(work), v.id)
        p = profiler.measure(b, v, s, pause)
        profiler.record(v, d, p)
        out.append(p)
        if enough is not None and i < len(todo) and enough(out):
            log_failures(out)
            return out, hits, todo[i:]
    log_failures(out)
    return out, hits, []


def _knobs(c: ProfilerConfig) -> tuple[int, int, int, float]:
    return c.warmup_runs, c.min_runs, c.max_runs, c.time_budget_s


def to_refine(profiles: Sequence[Profile], constraints: Constraints) -> int:
    """How many variants the next refinement round would measure (0: the choice is final)."""
    return sum(1 for p in profiles
               if p.variant_id in keep(profiles, constraints) and _level(p) < len(STAGES) - 1)


def refine(work: Work, profiles: Sequence[Profile], profiler: Profiler,
           constraints: Constraints,
           progress: Callable[[int, int, str], None] | None = None,
           pause: Callable[[], ContextManager] | None = None,
           max_extra: int = 2, repeats: int = 1) -> list[Profile]:
    """The fast schedule's later rounds: each measures, longer, only the variants
    runtime.choice.refine.keep still keeps; the last round is the full length. Then, while the kept
    set still holds variants not measured at full length (a full measurement moved the
    picture), those are measured at full length too (at most `max_extra` times). Last, the
    near-ties for the choice (runtime.choice.refine.finalists) are measured again at full length,
    interleaved, `repeats` times, and each is judged on its combined measurements
    (runtime.choice.refine.combine): one measurement each would pick among them by noise. Every
    result is cached. Returns the profiles in `work` order."""
    by_id = {p.variant_id: p for p in profiles}
    where = {v.id: (b, d, v) for b, d, v in work}
    schedule = rounds(*_knobs(profiler.cfg))
    passes = [(r, s) for r, s in enumerate(schedule) if r > 0]
    passes += [(len(schedule) - 1, schedule[-1])] * max_extra
    failed: list[Profile] = []
    floor = NOISE_FLOOR
    for r, s in passes:
        kept = keep(list(by_id.values()), constraints, floor)
        # in `work` order, as an exhaustive run measures them: what ran just before a variant
        # (an engine's worker threads still spinning down) then biases both alike
        todo = [v.id for _, _, v in work
                if v.id in kept and v.id in by_id and _level(by_id[v.id]) < r]
        if not todo:
            if r == len(schedule) - 1:
                break
            continue
        pairs = []
        for i, vid in enumerate(todo, start=1):
            if progress:
                progress(i, len(todo), f"{vid} ({STAGES[r]})")
            b, d, v = where[vid]
            p = profiler.measure(b, v, s, pause)
            if p.ok:
                p = replace(p, stage=STAGES[r])
            profiler.record(v, d, p)
            pairs.append((by_id[vid], p))
            by_id[vid] = p
            if not p.ok:  # it ran in the quick round: rare, and worth its own line
                failed.append(p)
        # how far shorter measurements were off here, beyond their own spread, widens the
        # next comparisons (a busy machine prunes less)
        wider = observed_floor(pairs)
        if wider > floor:
            log.info("measurements moved by up to %.0f %% between rounds (beyond their spread): "
                     "comparing with that margin from now on", wider * 100)
            floor = wider
    for _ in range(repeats):
        ids = set(finalists(list(by_id.values()), constraints, floor))
        todo = [v.id for _, _, v in work if v.id in ids]  # work order, as above
        for i, vid in enumerate(todo, start=1):
            if progress:
                progress(i, len(todo), f"{vid} (again: a near-tie)")
            b, d, v = where[vid]
            p = profiler.measure(b, v, schedule[-1], pause)
            if not p.ok:  # it ran twice before: not recorded as a failure
                log.info("%s failed when measured again (%s); its first full-length "
                         "measurement stands", vid, p.error)
            by_id[vid] = combine(by_id[vid], p)
            profiler.record(v, d, by_id[vid])
    log_failures(failed)
    return [by_id[v.id] for _, _, v in work if v.id in by_id]
