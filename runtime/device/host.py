"""What the daemon's parts may ask of it, typed: the install record its queue carries, the
exception a long step raises when a stop is requested, and one Protocol per part (OTA, sleep,
the tick's snapshot) naming the few calls and public fields that part uses.

The parts import this module, never runtime/device/daemon.py (no import cycle, not even a
function-level one), and never read the daemon's private attributes; the daemon satisfies each
Protocol structurally, and a test may hand a part a small fake that does too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from power import control
    from power.device import DeviceProfile
    from power.rungs import Rung
    from power.sensors import Reading, SensorSet
    from runtime.choice.measure import Measured
    from runtime.config import Config
    from runtime.device.model_ladder import Box
    from runtime.device.operator_state import OperatorState
    from runtime.device.systemd import Notifier
    from runtime.device.wear import WriteRate
    from runtime.frames.pipeline import Active, Pipeline
    from runtime.telemetry.outbox import Outbox
    from runtime.telemetry.publisher import Publisher


class Stopping(Exception):
    """A stop was requested while a long step (profiling, a bundle download) was running."""


@dataclass(frozen=True)
class Install:
    """A measured model waiting on the install queue for the main loop (background threads
    put, the main loop takes between ticks).

    `version`: a model-store version (an OTA deploy or choose_model): the pointer is switched
    and probation starts. Otherwise a re-measurement of a model directory made while the model
    generation was `gen`: dropped when another model was installed since it began."""

    measured: Measured
    why: str
    version: str | None = None
    gen: int | None = None


class OtaHost(Protocol):
    """What runtime/device/ota.py needs of the daemon."""

    pipeline: Pipeline
    box: Box  # its `model`: the [model] section's, now served (`measured()`: as installed)

    def event(self, type_: str, severity: str = "info", **fields: Any) -> None:
        """Record an event for the operator."""

    def stopping(self) -> bool:
        """Whether a stop was requested (long steps then raise Stopping)."""
        ...

    def measure_model(self, path: Path) -> Measured:
        """Profile a model directory (a background thread; raises Stopping on a stop)."""
        ...

    def queue_install(self, install: Install) -> None:
        """Hand a measured model to the main loop (any thread)."""

    def install_model(self, measured: Measured, why: str) -> float:
        """Make `measured` the [model]'s model now and rebuild its ladder (main thread); the
        seconds the ladder took."""
        ...

    def load_in_background(self, path: Path, fresh: bool, why: str,
                           wait: bool = False) -> None:
        """Profile `path` on the reprofile thread and install it when done."""

    def live_energy_j(self) -> float | None:
        """The running [model] variant's live energy per inference (None: none yet)."""
        ...

    def target_ms(self) -> float:
        """The [model]'s per-inference latency target."""
        ...

    def second_session(self) -> Active | None:
        """Another session of the running [model] variant (None: it will not load)."""
        ...

    def rebirth(self) -> None:
        """Ask the publisher to send a new birth message (the model or its rung changed)."""


class SleepHost(Protocol):
    """What runtime/device/sleep.py needs of the daemon (its fields are read each tick)."""

    cfg: Config
    device: DeviceProfile
    sim: Any  # runtime.device.simdevice.SimulatedDevice or None
    reading: Reading | None
    ccfg: control.ControlConfig | None
    cstate: control.ControlState
    pipeline: Pipeline
    publisher: Publisher | None
    outbox: Outbox
    notify: Notifier
    sensors: SensorSet

    def frame_rung(self) -> Rung | None:
        """The running rung per frame of any source."""
        ...

    def health(self) -> dict[str, Any]:
        """The health message now."""
        ...

    def event(self, type_: str, severity: str = "info", **fields: Any) -> None:
        """Record an event for the operator."""


class StateSource(Protocol):
    """What runtime/device/state.py takes the tick's snapshot from (main loop only: every
    other reader reads the snapshot, never these)."""

    cfg: Config
    device: DeviceProfile
    sim: Any
    reading: Reading | None
    control_out: control.Output | None
    cstate: control.ControlState
    pipeline: Pipeline
    publisher: Publisher | None
    outbox: Outbox
    sparkplug: Any  # runtime.telemetry.sparkplug.node.SparkplugNode or None
    plc: Any  # runtime.telemetry.plc.PlcServers or None
    started: float  # monotonic time of the start
    trips: dict[str, float]
    thermal_disabled: str
    meter: Any  # power.sensors.PowerMeter
    box_energy: Any  # power.box_energy.BoxEnergy (None before start): energy per frame
    devices: list[dict]
    ota: Any  # runtime.device.ota.DeviceOta or None
    sleeper: Any  # runtime.device.sleep.Sleeper or None
    box: Box  # every served model (its `model`: the [model] section's) and the box's ladder
    operator: OperatorState  # the operator's rate cap
    writes: WriteRate  # the process's disk writes, sampled with each health (wear.py)

    def load_w(self) -> float:
        """Dynamic power of the inference load."""
        ...


class PartsHost(Protocol):
    """What the daemon's steps moved out of it read and set (runtime/device/ladders.py,
    installing.py, tick.py, live_energy.update_running): the parts it wired, the control
    state, and the few calls back (main loop, but `installing.measure` on the reprofile
    thread too)."""

    cfg: Config
    device: DeviceProfile
    sim: Any  # runtime.device.simdevice.SimulatedDevice or None
    sensors: SensorSet
    meter: Any  # power.sensors.PowerMeter
    gpu_meters: Any  # power.nvml's meters: a GPU variant is billed its own
    box_energy: Any  # power.box_energy.BoxEnergy (None before start)
    backends: list  # the engines, discovered once
    devices: list[dict]
    pipeline: Pipeline
    box: Box  # every served model and the box's ladder
    plan: Any  # runtime.device.source_plan.SourcePlan
    switch: Any  # runtime.device.rung_switch.RungSwitch
    energy: Any  # runtime.device.live_energy.LiveEnergy
    drift: Any  # runtime.device.serving_drift.ServingDrift: an accelerator's served energy
    profiler: Any  # runtime.device.profiling.Profiler
    operator: OperatorState
    ota: Any  # runtime.device.ota.DeviceOta
    notify: Notifier
    thermal: Any  # power.thermal_source.ThermalSource or None
    thermal_disabled: str
    ccfg: control.ControlConfig | None
    cstate: control.ControlState
    control_out: control.Output | None
    reading: Reading | None
    sensor_watch: Any  # runtime.device.sensing.SensorWatch
    refusals: Any  # runtime.device.sensing.RefusalWatch
    sleeper: Any  # runtime.device.sleep.Sleeper or None
    installs: Any  # queue.Queue[Install]: what the background threads measured
    model_gen: int  # bumped when another model is installed: older jobs are stale

    def event(self, type_: str, severity: str = "info", **fields: Any) -> None:
        """Record an event for the operator."""

    def stopping(self) -> bool:
        """Whether a stop was requested."""
        ...

    def status_line(self) -> str:
        """The STATUS= line of the latest snapshot."""
        ...

    def rebirth(self) -> None:
        """A new snapshot and birth message (the [model] or its rung changed)."""

    def reprofile(self, why: str) -> None:
        """Measure the [model] again in the background."""

    def install_model(self, measured: Measured, why: str) -> float:
        """Install a measured [model] now; the seconds the ladder took."""
        ...

    def frame_rung(self) -> Rung | None:
        """The running rung per frame of any source (None: nothing runs yet)."""
        ...


class StopHost(Protocol):
    """What runtime/device/shutdown.py stops, in its order."""

    pipeline: Pipeline
    local: Any  # runtime.frames.results_local.LocalResults or None
    local_api: Any  # runtime.device.local_api.LocalApi or None
    profiler: Any  # runtime.device.profiling.Profiler (its `thread`)
    ota: Any  # runtime.device.ota.DeviceOta or None (its `thread`)
    sim: Any  # runtime.device.simdevice.SimulatedDevice or None
    publisher: Publisher | None
    sparkplug: Any  # runtime.telemetry.sparkplug.node.SparkplugNode or None
    outbox: Outbox
