"""edgerun's configuration: one TOML file, validated once into typed sections.

Each component is handed only its own section (`cfg.profiler`, `cfg.backends`, ...).
Defaults are chosen so that `edgerun profile MODEL` works with no file at all.

A leaf package: its modules import the standard library and each other, nothing else of the
project (tests/test_layering.py), so any module can import its section without pulling in
the component that uses it. A module per section that has a component of its own
(`source`, `backends`, `telemetry`, `coordinator`, `models`, `results`, `local_api`,
`homeassistant`, `sparkplug`, `opcua`); the small daemon-wide sections are here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from runtime.config import paths
from runtime.config.backends import (
    ENGINES,
    BackendsConfig,
    OnnxRuntimeConfig,
    OpenCvConfig,
    OpenVinoConfig,
)
from runtime.config.constraints import Constraints
from runtime.config.coordinator import CoordinatorConfig
from runtime.config.homeassistant import HomeAssistantConfig
from runtime.config.local_api import LocalApiConfig
from runtime.config.modbus import ModbusConfig
from runtime.config.models import ModelsConfig
from runtime.config.opcua import OpcUaConfig
from runtime.config.results import ResultsConfig
from runtime.config.schema import ConfigError, build, load_toml
from runtime.config.source import SourceConfig, check_sources
from runtime.config.sparkplug import SparkplugConfig
from runtime.config.storage import StorageConfig
from runtime.config.telemetry import TelemetryConfig


@dataclass(frozen=True)
class DeviceConfig:
    """Which device profile describes this box, and where its sysfs lives."""

    profile: str = "generic-x86"  # a name under firmware_config/devices/ or a path to a .toml
    sysfs_root: str = "/"  # tests and the simulator point this at a fake tree


@dataclass(frozen=True)
class ModelConfig:
    """The model to run: an .onnx file or a directory with a variant manifest. `labels`,
    `preprocess` and `output` describe a bare .onnx (a manifest declares its own)."""

    path: str = ""
    input_shape: tuple[int, ...] = ()  # fixes dynamic dimensions, e.g. [1, 3, 224, 224]
    labels: str = ""  # a text file of class names, one per line; empty: class_0, class_1, ...
    preprocess: str = ""  # a JSON file (layout/colour/resize/scale/mean/std); empty: RGB,
    # layout from the input, bilinear resize, pixels / 255 (docs/manifest.md "A bare .onnx")
    output: Literal["scores", "probabilities", "logits"] = "scores"
    # Detectors (docs/detectors.md): task/format/thresholds describe a bare .onnx ("auto":
    # from the output's shape); tiling applies to any detector.
    task: Literal["auto", "classify", "detect"] = "auto"
    format: Literal["auto", "yolov8", "yolov5", "nms-inside"] = "auto"
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    tiling: bool = False
    tile_size: int = 0  # frame pixels per tile side; 0: the model input's size
    tile_overlap: float = 0.2

    def validate(self) -> tuple[str, str] | None:
        if any(d <= 0 for d in self.input_shape):
            return "input_shape", f"every dimension must be positive, got {list(self.input_shape)}"
        for key in ("score_threshold", "iou_threshold"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                return key, f"must be within 0..1, got {getattr(self, key)}"
        if not 0 <= self.tile_size <= 16384:
            return "tile_size", ("must be 0 (the model input's size) or up to 16384 pixels, "
                                 f"got {self.tile_size}")
        if not 0.0 <= self.tile_overlap <= 0.75:
            return "tile_overlap", f"must be within 0..0.75, got {self.tile_overlap}"
        return None


@dataclass(frozen=True)
class ProfilerConfig:
    """How long and how hard each variant is measured."""

    warmup_runs: int = 5
    min_runs: int = 30
    max_runs: int = 2000
    time_budget_s: float = 2.0  # per variant, after warm-up
    idle_baseline_s: float = 0.5
    # empty: the user's cache, $XDG_CACHE_HOME/edgerun/profiles (~/.cache/edgerun/profiles)
    cache_dir: str = ""
    # fast: a quick round over every variant, serve on its choice, refine the candidates in
    # the background (choice/refine.py); exhaustive: every variant at full length before serving
    schedule: Literal["fast", "exhaustive"] = "fast"
    # fast: serve once the quick round has run this long and its choice meets the
    # constraints; the rest of the quick round goes on in the background
    first_decision_s: float = 2.0

    def cache_path(self) -> Path:
        """The profile cache directory: `cache_dir` (`~` expanded), or the user's cache."""
        return paths.cache_dir(self.cache_dir, "profiles")

    def validate(self) -> tuple[str, str] | None:
        if self.min_runs < 1:
            return "min_runs", f"must be >= 1, got {self.min_runs}"
        if self.max_runs < self.min_runs:
            return "max_runs", f"must be >= min_runs ({self.min_runs}), got {self.max_runs}"
        if self.time_budget_s <= 0:
            return "time_budget_s", f"must be > 0, got {self.time_budget_s}"
        if not self.first_decision_s >= 0:
            return "first_decision_s", f"must be >= 0, got {self.first_decision_s}"
        return None


@dataclass(frozen=True)
class GovernorSection:
    """How the daemon trades precision for thermal headroom and energy."""

    policy: Literal["step_wise", "power_allocator", "off"] = "step_wise"
    tick_s: float = 1.0
    rate_hz: float = 10.0  # the rate frames are offered at; rung powers are computed at it
    # (0 = as fast as the top rung can run: a folder backlog, a free-running camera)
    energy: bool = True  # battery devices: also run the energy-neutral budget
    min_rate_hz: float = 0.2  # minimum duty when no rung fits the budget (0 = pause capture)
    hold_invalid_s: float = 30.0  # an invalid reading holds the last valid one this long
    # the core's dwell (power/timers.py): a rung upgrade and a thermal level's release wait
    # this long since the last change; doubled when undone (a limit cycle), up to max_dwell_s
    dwell_s: float = 60.0
    max_dwell_s: float = 900.0
    # step_wise steps on a measured rise this far under the passive trip (power/governor.py):
    # lower lets the die ride nearer the trip, for more inferences where it sits there
    band_c: float = 0.3

    def validate(self) -> tuple[str, str] | None:
        # a tick of nanoseconds (a typo) spun the main thread at 100 % of a core and starved
        # the profiler's refinement; the tests' fastest is 0.1 s
        if not self.tick_s >= 0.01:
            return "tick_s", f"must be >= 0.01 s, got {self.tick_s}"
        if self.rate_hz < 0:
            return "rate_hz", f"must be >= 0, got {self.rate_hz}"
        if self.min_rate_hz < 0 or (self.rate_hz and self.min_rate_hz > self.rate_hz):
            return "min_rate_hz", f"must be within 0..rate_hz, got {self.min_rate_hz}"
        if not self.hold_invalid_s >= 0:
            return "hold_invalid_s", f"must be >= 0, got {self.hold_invalid_s}"
        # a dwell over an hour (a cap over a day) would keep a cool device low all evening
        if not 0 <= self.dwell_s <= 3600:
            return "dwell_s", f"must be within 0..3600 s, got {self.dwell_s}"
        if not self.dwell_s <= self.max_dwell_s <= 86400:
            return "max_dwell_s", (f"must be within dwell_s ({self.dwell_s:g})..86400 s, got "
                                   f"{self.max_dwell_s}")
        if not 0 <= self.band_c <= 5:
            return "band_c", f"must be within 0..5 °C, got {self.band_c}"
        return None


@dataclass(frozen=True)
class SimulatorConfig:
    """Run the device simulator in-process: it writes the sysfs tree the sensors read."""

    enabled: bool = False
    scenario: Literal["cool", "warm", "hot", "sun", "cabinet"] = "sun"
    # simulated seconds per wall second, the pace kept when the host can: the plant moves in
    # lockstep with the control loop (exactly governor.tick_s a tick), so a busy host runs
    # slower with the same decisions (health.simulated.slowed; docs/power.md)
    speed: float = 1.0
    start_hour: float = 9.0  # simulated time of day at start
    hours: float = 0.0  # simulated hours after which the clock stops (0: never); the daemon
    # keeps serving with its control loop held, and health's tally covers exactly that long
    root: str = ""  # where to write the tree; empty: /dev/shm/edgerun-sim-<hash> (in memory,
    # as sysfs is: not counted as the daemon's disk writes), else <state_dir>/sim-sysfs
    profiles: str = ""  # recorded profiles (edgerun profile --json) replayed instead of
    # measured, so simulated runs repeat; empty = measure on this host
    # with [governor] rate_hz = 0: the simulated camera offers this share of what the top rung
    # can take on all cores (1: as fast as it runs; a line's camera has a fixed rate below it)
    offered_share: float = 1.0
    # the sun on a device profile's solar panel: the weather of power.plant.solar_trace with
    # this seed (days sunny, partly cloudy or overcast, from simulated hour 0, so a run started
    # again at a later hour meets the same sky); -1: no sun, the battery only drains
    weather_seed: int = -1
    battery_frac: float = 1.0  # the battery's charge at start, a share of its capacity

    def validate(self) -> tuple[str, str] | None:
        if self.weather_seed < -1:
            return "weather_seed", f"must be >= 0, or -1 for no sun, got {self.weather_seed}"
        if not 0 <= self.battery_frac <= 1:
            return "battery_frac", f"must be within 0..1, got {self.battery_frac}"
        if not 0 < self.offered_share <= 1:
            return "offered_share", f"must be in (0, 1], got {self.offered_share}"
        if not 0 < self.speed < math.inf:
            return "speed", f"must be > 0 and finite, got {self.speed}"
        if not 0 <= self.hours < math.inf:
            return "hours", f"must be >= 0 (0: no end), got {self.hours}"
        return None


@dataclass(frozen=True)
class DaemonConfig:
    """`edgerun serve` itself."""

    # folder state, simulator tree, keys, models, health history; not the outbox, which
    # is at [telemetry.outbox] path (its own default, whatever this says)
    state_dir: str = "~/.local/state/edgerun"
    queue_size: int = 4
    reprofile_temp_delta_c: float = 15.0  # re-profile when this far from the profiling temp
    slow_factor: float = 1.5  # p95 this many times the profile's: report throttling
    # at most one re-rank of a variant on its served energy this often (runtime/device/
    # serving_drift.py)
    rerank_every_s: float = 600.0

    def validate(self) -> tuple[str, str] | None:
        if self.queue_size < 1:
            return "queue_size", f"must be >= 1, got {self.queue_size}"
        if not 60.0 <= self.rerank_every_s < math.inf:
            # a window is at most 10 s: more often, a variant dearer than every profile says
            # would have the choice made again at every window
            return "rerank_every_s", (f"must be a number of seconds >= 60, got "
                                      f"{self.rerank_every_s}")
        return None


@dataclass(frozen=True)
class SleepConfig:
    """`[sleep]`: duty cycling on an inspection schedule (docs/sleep.md; runtime/device/sleep.py).
    Off unless enabled; the device profile must be able to suspend ([states])."""

    enabled: bool = False
    every_s: float = 0.0  # one burst every this many seconds (device time), or
    per_hour: float = 0.0  # at least this many inferences an hour
    burst: int = 1  # inferences per inspection
    deliver_s: float = 10.0  # planned time connected per wake (results out, commands in)
    flush_timeout_s: float = 20.0  # wall seconds at most spent waiting for acks before a sleep
    max_sleep_s: float = 3600.0  # the longest sleep (the check-in when energy is short)
    session_expiry_s: int = 86400  # the broker keeps the MQTT session (queued commands) so long
    rtc: str = "rtc0"  # <sysfs_root>/sys/class/rtc/<rtc>/wakealarm

    def validate(self) -> tuple[str, str] | None:
        if self.enabled and (self.every_s > 0) == (self.per_hour > 0):
            return "every_s", "give exactly one of every_s and per_hour (> 0)"
        # one key a check, named by itself: the key locates the line in the file
        for key in ("every_s", "per_hour", "deliver_s", "flush_timeout_s"):
            if getattr(self, key) < 0:
                return key, f"must be >= 0, got {getattr(self, key)}"
        if self.burst < 1:
            return "burst", f"must be >= 1, got {self.burst}"
        if self.max_sleep_s < 60:
            return "max_sleep_s", f"must be >= 60, got {self.max_sleep_s}"
        if self.max_sleep_s > 7 * 86400:  # coordinators believe a wake at most a week on
            return "max_sleep_s", "at most 604800 (a week): a coordinator reports a device " \
                "that announced a longer sleep as missed_wake after a week"
        if self.session_expiry_s < self.max_sleep_s:
            return "session_expiry_s", "must be at least max_sleep_s (queued commands)"
        return None


@dataclass(frozen=True)
class Config:
    """The whole file."""

    device: DeviceConfig = field(default_factory=DeviceConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    constraints: Constraints = field(default_factory=Constraints)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    backends: BackendsConfig = field(default_factory=BackendsConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    source: SourceConfig = field(default_factory=SourceConfig)
    # several cameras on one box: [[sources]] tables replace [source] (frames/multisource.py)
    sources: tuple[SourceConfig, ...] = ()
    governor: GovernorSection = field(default_factory=GovernorSection)
    simulator: SimulatorConfig = field(default_factory=SimulatorConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    results: ResultsConfig = field(default_factory=ResultsConfig)  # print, JSONL, snapshots
    local_api: LocalApiConfig = field(default_factory=LocalApiConfig)
    sleep: SleepConfig = field(default_factory=SleepConfig)  # duty cycling (docs/sleep.md)
    homeassistant: HomeAssistantConfig = field(default_factory=HomeAssistantConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)  # OTA: bundles, probation
    sparkplug: SparkplugConfig = field(default_factory=SparkplugConfig)  # docs/sparkplug.md
    opcua: OpcUaConfig = field(default_factory=OpcUaConfig)  # the PLC's server (docs/plc.md)
    modbus: ModbusConfig = field(default_factory=ModbusConfig)  # the PLC's, on Modbus TCP
    storage: StorageConfig = field(default_factory=StorageConfig)  # the card's endurance

    def validate(self) -> tuple[str, str] | None:
        if not self.opcua.enabled and any(s.trigger == "opcua"
                                          for s in (self.source, *self.sources)):
            return "opcua", ('a source with trigger = "opcua" needs [opcua] enabled = true '
                             "(the PLC's edges arrive through it)")
        on_modbus = sum(s.trigger == "modbus" for s in (self.source, *self.sources))
        if on_modbus and not self.modbus.enabled:
            return "modbus", ('a source with trigger = "modbus" needs [modbus] enabled = true '
                              "(the PLC's edges arrive through it)")
        if self.modbus.enabled and (problem := self.modbus.fits(on_modbus)):
            return f"modbus.{problem[0]}", problem[1]
        return check_sources(self.sources, self.source != SourceConfig())


def load(path: str | Path | None) -> Config:
    """Load and validate a config file; None gives the defaults."""
    if path is None:
        return Config()
    return load_toml(Path(path), Config)


def from_dict(data: dict, source: str = "<config>") -> Config:
    """Validate an already-parsed mapping (used by tests and command overrides)."""
    return build(Config, data, source=source)


__all__ = ["ENGINES", "BackendsConfig", "Config", "ConfigError", "Constraints", "CoordinatorConfig",
           "HomeAssistantConfig", "LocalApiConfig", "ModbusConfig", "ModelsConfig",
           "OnnxRuntimeConfig", "OpcUaConfig", "OpenCvConfig", "OpenVinoConfig", "ResultsConfig",
           "SourceConfig", "SparkplugConfig", "StorageConfig", "TelemetryConfig", "from_dict",
           "load"]
