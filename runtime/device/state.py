"""One frozen, typed view of the device per control tick: `DeviceState`.

The main loop builds it (`snapshot`) from what is served (runtime/device/serving.py) and the
daemon's links' reports, and swaps it in with one attribute assignment; every reader (health,
the STATUS= line, birth, Home Assistant, the local API's /metrics and /healthz, Sparkplug and
OPC UA through health) reads only that object. The readers on other threads (HTTP, MQTT,
OPC UA) therefore never see a half-made change: the snapshot they hold cannot change under
them, and a newer one replaces it whole (Home Assistant's coordinator and its typed
snapshot, the same idea).

Nested reports (the pipeline's figures, the backlog, each model's rung, ...) are frozen too
(`freeze`: read-only mappings and tuples); `thaw` gives the plain JSON-ready copy the wire
message is derived from (runtime/device/health.py). The two costly ones, the pipeline's
figures and the backlog, are taken with each health message (every
`telemetry.health_interval_s`, as before) and carried by the ticks' snapshots in between.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from power import ina3221
from runtime.device import wear
from runtime.wire import clock as wire_clock

if TYPE_CHECKING:
    from power import control
    from power.sensors import Reading
    from runtime.config import Config
    from runtime.device.serving import Serving
    from runtime.device.wear import WriteRate
    from runtime.frames.pipeline import Pipeline


class Parts(Protocol):
    """What the snapshot takes of the daemon beside what is served: its parts and their
    reports (main loop only: every other reader reads the snapshot, never these)."""

    cfg: Config  # as started: the sections a reload cannot change
    sim: Any  # runtime.device.simdevice.SimulatedDevice or None
    pipeline: Pipeline
    links: Any  # runtime.device.links.Links: the outbox, MQTT, Sparkplug, the PLC servers
    started: float  # monotonic time of the start
    ota: Any  # runtime.device.ota.DeviceOta or None
    sleeper: Any  # runtime.device.sleep.Sleeper or None
    writes: WriteRate  # the process's disk writes, sampled with each health (wear.py)
    card_writes: WriteRate  # its card's (the state directory's block device)


def freeze(x: Any) -> Any:
    """`x` with every dict a read-only mapping and every list a tuple (recursively): what a
    snapshot holds of a part's report, so no reader can change it for the others."""
    # concrete classes, not the Mapping ABC: its isinstance took a quarter of a snapshot's time
    if isinstance(x, (dict, MappingProxyType)):
        return MappingProxyType({k: freeze(v) for k, v in x.items()})
    if isinstance(x, (list, tuple)):
        return tuple([freeze(v) for v in x])
    return x


def thaw(x: Any) -> Any:
    """A plain (dict, list) copy of a frozen value: the caller may change it freely."""
    if isinstance(x, MappingProxyType):
        return {k: thaw(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return [thaw(v) for v in x]
    return x


@dataclass(frozen=True)
class DeviceState:
    """The device at one control tick (see the module docstring). Rung indices are 0-based
    here (`rung`); the wire and the status line show them 1-based."""

    t: float  # wall time it was taken (health's `t`)
    boot: str  # this boot's id (the outbox's)
    uptime_s: float
    reading: Reading | None  # the sensors' last reading (None before the first tick)
    trips: Mapping[str, float]  # thermal trip points by kind ("hot", "passive")
    out: control.Output | None  # the last control step's output (None before the first)
    bounded: bool  # the control state's physics bound in force
    policy: str  # [governor] policy
    thermal_disabled: str  # why the thermal governor is off ("": it is on)
    model: str  # the [model]'s model name
    labels: tuple[str, ...]  # its class labels
    model_version: str  # the model-store version served ("": the configured one)
    choice: str  # the variant running ("": none yet)
    choice_reason: str  # why the [model]'s ladder is what it is
    rung: int  # the [model]'s rung, index into its ladder
    rungs: int  # the [model]'s ladder's length
    accuracy: float  # of the [model]'s rung
    rung_energy_j: float  # the [model]'s rung's energy per inference (live)
    energy_mj: float | None  # the running variant's profiled energy per inference
    energy_source: str  # the power meter's source
    power_w: float  # idle + inference load
    rate_cap_hz: float  # the pipeline's rate cap (inf: none)
    operator_rate_hz: float  # `set_rate` (inf: none)
    joint_rung: int  # the box's rung over several models (index; 0 with one model)
    joint_rungs: int  # the box's ladder's length (0: one model)
    joint_models: int  # models in each box rung
    device_name: str  # the device profile's name
    battery: bool  # whether the device runs on a battery
    pipeline: Mapping[str, Any]  # Pipeline.stats(), `slo` included (as of the last health)
    backlog: Mapping[str, Any]  # Outbox.stats() (as of the last health)
    devices: tuple[Mapping[str, Any], ...]  # the engines' devices, fixed for the process
    preprocess: Mapping[str, Any]  # the [model]'s preprocessing report
    models: Mapping[str, Any]  # health's `models` (and `box`): Box.health
    box_energy: Mapping[str, Any] | None  # BoxEnergy.report()
    ota: Mapping[str, Any]  # DeviceOta.health() (empty without OTA)
    mqtt: Mapping[str, Any] | None  # Publisher.health() (None: no broker)
    simulated: Mapping[str, Any] | None  # the simulator's report (None: a real device)
    sleep: Mapping[str, Any] | None  # the sleeper's (None: [sleep] off)
    # a Jetson's INA3221 rails (power/ina3221.py; None: none named, or simulated: a
    # simulated device's rails are not this host's); read with the health message
    power_rails: Mapping[str, Any] | None
    # each enabled integration's thread alive, by name ("sparkplug", "opcua", "modbus"): one
    # that died shows here, the daemon runs on without it
    integrations: Mapping[str, bool]
    # bytes this process writes a day and the card's life at that rate (wear.report; as of
    # the last health)
    storage: Mapping[str, Any]
    # the clock when `t` was read (runtime/wire/clock.py): health's `clk` stamp and `clock`
    # section; None where the daemon has no clock (a test's stand-in)
    clk: Mapping[str, Any] | None = None
    clock: Mapping[str, Any] | None = None


def _rails(s: Serving, d: Parts) -> Mapping[str, Any] | None:
    """The INA3221 rails now (sysfs reads: taken with each health message, not each tick)."""
    if d.sim:
        return None
    rails = ina3221.report(Path(d.cfg.device.sysfs_root), s.device.sensors.ina3221_rails)
    return freeze(rails) if rails is not None else None


def _integrations(d: Parts) -> Mapping[str, bool]:
    """Whether each enabled integration's thread runs (a thread's is_alive: cheap)."""
    links = d.links
    alive = {"sparkplug": links.sparkplug.alive()} if links.sparkplug is not None else {}
    if links.plc is not None:
        alive.update(links.plc.alive())
    return MappingProxyType(alive)


def _storage(d: Parts) -> Mapping[str, Any]:
    """Sample the process's disk writes and its card's (a health is due) and report the
    rates."""
    now = time.monotonic()
    if (written := wear.read_write_bytes()) is not None:
        d.writes.add(now, written)
    state_dir = Path(d.cfg.daemon.state_dir).expanduser()
    if (card := wear.card_written(state_dir, Path(d.cfg.device.sysfs_root))) is not None:
        d.card_writes.add(now, card)
    return freeze(wear.report(d.writes, d.cfg.storage.rated_tbw, d.card_writes))


def stopped(before: DeviceState | None, now: DeviceState) -> list[str]:
    """The integrations alive at `before` and dead at `now` (each one said once)."""
    if before is None:
        return []
    return [k for k, ok in now.integrations.items() if not ok and before.integrations.get(k)]


def snapshot(s: Serving, d: Parts, prev: DeviceState | None = None) -> DeviceState:
    """What is served, `s`, and the daemon's parts, `d`, now, frozen (main loop only: it
    reads the live fields). With `prev`, the pipeline's and the backlog's figures are kept
    from it: they are taken when a health message is due (`prev` None), not every tick,
    because they cost what the other fields do not (the backlog's row count grows with the
    backlog, under the outbox's lock that every result takes; the pipeline's percentiles
    over its 30 s windows)."""
    a = d.pipeline.active
    m = s.box.model  # the [model] section's model, its ladder and rung
    rung = m.rungs[m.current]
    prof = m.by_id.get(a.variant_id) if a else None
    joint = s.box.joint
    clock = getattr(d, "clock", None)
    if clock is not None:  # the wall time and the stamp read together
        status, r = clock.now()
        t, clk, clock_health = r.wall, freeze(wire_clock.stamp(status, r)), freeze(clock.health())
    else:
        t, clk, clock_health = time.time(), None, None
    outbox, publisher = d.links.outbox, d.links.publisher
    return DeviceState(
        t=t, boot=outbox.boot, uptime_s=round(time.monotonic() - d.started, 1),
        reading=s.reading, trips=MappingProxyType(dict(s.trips)), out=s.out,
        bounded=s.cstate.bounded, policy=s.cfg.governor.policy,
        thermal_disabled=s.thermal_disabled, model=m.manifest.name,
        labels=tuple(m.manifest.labels or ()),
        model_version=(d.ota.version or "") if d.ota else "",
        choice=a.variant_id if a else "", choice_reason=m.reason,
        rung=m.current, rungs=len(m.rungs), accuracy=rung.accuracy,
        rung_energy_j=rung.energy_j, energy_mj=prof.energy_mj if prof else None,
        energy_source=s.meter.source, power_w=s.device.power.idle_w + s.load_w(),
        rate_cap_hz=d.pipeline.rate_cap_hz, operator_rate_hz=s.operator.rate_hz,
        joint_rung=s.box.joint_current if joint else 0, joint_rungs=len(joint),
        joint_models=len(joint[0].picks) if joint else 0, device_name=s.device.name,
        battery=bool(s.device.sensors.battery or s.device.battery),
        pipeline=prev.pipeline if prev else freeze(d.pipeline.stats()),
        backlog=prev.backlog if prev else freeze(outbox.stats()),
        devices=freeze(s.devices), preprocess=freeze(m.pre.report),
        models=freeze(s.box.health(d.pipeline)),
        box_energy=freeze(s.box_energy.report()) if s.box_energy is not None else None,
        ota=freeze(d.ota.health()) if d.ota is not None else MappingProxyType({}),
        mqtt=freeze(publisher.health()) if publisher else None,
        simulated=freeze(d.sim.report()) if d.sim else None,
        sleep=freeze(d.sleeper.health()) if d.sleeper else None,
        power_rails=prev.power_rails if prev else _rails(s, d),
        integrations=_integrations(d), clk=clk, clock=clock_health,
        storage=prev.storage if prev else _storage(d))
