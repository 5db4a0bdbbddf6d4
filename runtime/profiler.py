"""Measures each variant: latency percentiles, energy per inference, the device that ran it.

Results are cached on disk, keyed by model hash + variant + device profile + library
versions + input shape + profiler settings, so a restart does not re-profile.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from power.cputime import inference_cpu_s
from power.sensors import PowerMeter, SensorError
from runtime import __version__
from runtime.backends import Backend, BackendError, Device, ModelFile, Variant
from runtime.config import ModelConfig, ProfilerConfig
from runtime.onnx_model import file_sha256
from runtime.selector import Profile

log = logging.getLogger(__name__)

CACHE_SCHEMA = 3  # 3: energy and cpu_ms from inference CPU time (ns), never process-wide


def model_files(cfg: ModelConfig) -> list[ModelFile]:
    """The precision forms of the configured model: every variant of a manifest directory
    (sha256-verified), or a bare .onnx file as one fp32 form of unknown accuracy."""
    from runtime import manifest

    return manifest.model_files(manifest.configured_model(cfg.path, cfg))


def default_threads() -> tuple[int, ...]:
    """1 and every core: the two ends of the thread axis."""
    return tuple(sorted({1, os.cpu_count() or 1}))


def _failed(v: Variant, error: str) -> Profile:
    return Profile(v.id, v.model.name, v.precision, v.engine, v.device, v.threads,
                   status="failed", error=error, accuracy=v.model.accuracy,
                   options=dict(v.options))


class Profiler:
    """Profiles variants with one power meter; one instance per profiling run."""

    def __init__(self, cfg: ProfilerConfig, meter: PowerMeter, device_profile: str,
                 progress: Callable[[str], None] | None = None,
                 active_w_per_core: float = 1.0):
        self._cfg, self._meter = cfg, meter
        # W per CPU-second for the estimate (and a real meter's fallback): the estimated
        # meter's own coefficient when that is the meter
        self._active_w = getattr(meter, "active_w_per_core", active_w_per_core)
        self._device_profile = device_profile
        self._progress = progress or (lambda _msg: None)
        self._idle_w: float | None = None
        self._hashes: dict[Path, str] = {}
        self._cache = Path(os.path.expanduser(cfg.cache_dir))
        self._poll = meter.source in ("hwmon", "battery")  # integrating meters need samples

    # -- cache ---------------------------------------------------------------------------
    def cache_key(self, v: Variant, device: Device) -> str:
        """Everything that can change a measurement."""
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

    def _cached(self, key: str) -> Profile | None:
        f = self._cache / f"{key}.json"
        try:
            data = json.loads(f.read_text())
            return Profile(**data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as e:
            log.warning("profile cache entry %s is unreadable (%s); measuring again", f, e)
            return None

    def _store(self, key: str, p: Profile) -> None:
        try:
            self._cache.mkdir(parents=True, exist_ok=True)
            tmp = self._cache / f".{key}.tmp"
            tmp.write_text(json.dumps(asdict(p)))
            tmp.replace(self._cache / f"{key}.json")  # atomic: a crash leaves old or new
        except OSError as e:
            log.warning("cannot write profile cache %s (%s); profiles will be measured "
                        "again next start", self._cache, e)

    # -- measuring -----------------------------------------------------------------------
    def idle_w(self) -> float:
        """Idle power of the device, measured once per run (sampled every 50 ms)."""
        if self._idle_w is None:
            t0, e0 = time.perf_counter(), self._meter.energy_j()
            end = t0 + self._cfg.idle_baseline_s
            while time.perf_counter() < end:
                time.sleep(0.05)
                if self._poll:
                    self._meter.energy_j()
            self._idle_w = (self._meter.energy_j() - e0) / (time.perf_counter() - t0)
        return self._idle_w

    def profile(self, backend: Backend, device: Device, v: Variant,
                fresh: bool = False) -> Profile:
        """Measure one variant (or return its cached profile)."""
        key = self.cache_key(v, device)
        if not fresh:
            hit = self._cached(key)
            if hit is not None:
                self._progress(f"{v.id}: cached")
                # Accuracy belongs to the manifest, not to the measurement: the same file
                # profiled bare (unknown) and then from a prepared manifest, or re-prepared on
                # other images, must not carry the cached run's accuracy.
                return replace(hit, accuracy=v.model.accuracy)
        self._progress(f"{v.id}: measuring")
        p = self._measure(backend, v)
        if p.ok:  # failures are not cached: a fixed library or file should be retried
            self._store(key, p)
        return p

    def _measure(self, backend: Backend, v: Variant) -> Profile:
        idle_w = self.idle_w()
        try:
            session = backend.load(v)
        except BackendError as e:
            log.warning("%s: %s", v.id, e)
            return _failed(v, str(e))
        try:
            return self._run(session, v, idle_w)
        except Exception as e:  # an engine failing at run time fails this variant only
            log.warning("%s: failed while running: %s", v.id, e)
            return _failed(v, f"{v.engine} failed while running {v.model.path}: {e}")
        finally:
            session.close()

    def _run(self, session, v: Variant, idle_w: float) -> Profile:
        c = self._cfg
        x = np.random.default_rng(0).standard_normal(v.model.input_shape).astype(np.float32)
        for _ in range(c.warmup_runs):
            out = session.infer(x)
        if not np.all(np.isfinite(out)):
            raise BackendError(v.engine, v.model.path, "output has NaN or Inf values")
        lat_ns: list[int] = []
        try:
            e0 = self._meter.energy_j()
        except SensorError as e:
            raise BackendError(v.engine, v.model.path, f"power meter failed: {e}") from e
        t0, c0 = time.perf_counter(), inference_cpu_s()
        while True:
            s = time.perf_counter_ns()
            session.infer(x)
            lat_ns.append(time.perf_counter_ns() - s)
            if self._poll:
                self._meter.energy_j()
            n, elapsed = len(lat_ns), time.perf_counter() - t0
            if n >= c.max_runs or (n >= c.min_runs and elapsed >= c.time_budget_s) \
                    or (elapsed >= 4 * c.time_budget_s and n >= 3):
                break
        wall = time.perf_counter() - t0
        cpu = max(inference_cpu_s() - c0, 0.0)
        energy = self._meter.energy_j() - e0
        n = len(lat_ns)
        ms = np.asarray(lat_ns) / 1e6
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
        return Profile(
            v.id, v.model.name, v.precision, v.engine, v.device, v.threads,
            actual_device=session.actual_device, p50_ms=p50, p95_ms=p95, p99_ms=p99, runs=n,
            energy_mj=per_inf_mj, energy_source=source, cpu_ms=cpu / n * 1e3,
            accuracy=v.model.accuracy, options=dict(v.options),
        )


def plan(backends: list[Backend], models: list[ModelFile], threads: tuple[int, ...],
         backends_cfg) -> list[tuple[Backend, Device, Variant]]:
    """Every (backend, device, variant) to profile for these model forms."""
    work: list[tuple[Backend, Device, Variant]] = []
    for b in backends:
        devices = {d.id: d for d in b.devices()}
        for m in models:
            for v in b.variants(m, backends_cfg, threads):
                work.append((b, devices[v.device], v))
    return work


def profile_all(backends: list[Backend], models: list[ModelFile], threads: tuple[int, ...],
                backends_cfg, profiler: Profiler, fresh: bool = False,
                progress: Callable[[int, int, str], None] | None = None) -> list[Profile]:
    """Profile every variant of every model form on every backend; failures are profiles too."""
    work = plan(backends, models, threads, backends_cfg)
    out = []
    for i, (b, d, v) in enumerate(work, start=1):
        if progress:
            progress(i, len(work), v.id)
        out.append(profiler.profile(b, d, v, fresh=fresh))
    return out
