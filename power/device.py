"""Device profiles: what a kind of box has (sensors, power model), from firmware_config/devices.

The typed data only: runtime/device/profiles.py reads a profile's TOML into these classes
(with the config schema), so power/ imports nothing of runtime/.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from power.accelerators import AcceleratorPower


@dataclass(frozen=True)
class PowerModel:
    """Coefficients of the estimated meter: P = idle_w + active_w_per_core * busy cores."""

    idle_w: float
    active_w_per_core: float
    cores: int = 4
    # Inference latency and CPU time on this device relative to the project's CI machine
    # (AMD EPYC core), used by the simulator to turn recorded profiles into this device's.
    perf_scale: float = 1.0
    basis: str = "assumed"  # measured | cited | assumed: where the numbers come from

    def validate(self) -> tuple[str, str] | None:
        if self.idle_w < 0 or self.active_w_per_core <= 0:
            return "active_w_per_core", "power coefficients must be positive"
        return None


@dataclass(frozen=True)
class SensorPaths:
    """sysfs paths relative to the sysfs root; empty means 'probe the usual places'."""

    rapl: tuple[str, ...] = ()  # e.g. "sys/class/powercap/intel-rapl/intel-rapl:0"
    hwmon_power: tuple[str, ...] = ()  # e.g. "sys/class/hwmon/hwmon2/power1_input"
    hwmon_energy: tuple[str, ...] = ()
    battery: str = ""  # e.g. "sys/class/power_supply/BAT0"
    # INA3221 channel label of the board's input rail (P = V*I); empty: probe "VDD_IN"
    # (Jetson Orin) then "POM_5V_IN" (Jetson Nano).
    ina3221_rail: str = ""
    # INA3221 rails reported one by one (power/ina3221.py), e.g. VDD_IN, VDD_CPU_GPU_CV,
    # VDD_SOC on Jetson Orin; empty: none
    ina3221_rails: tuple[str, ...] = ()
    # the GPU's devfreq directory (cur_freq/max_freq, Hz; power/accel_throttle.py), e.g.
    # "sys/class/devfreq/17000000.gpu"; empty: none
    gpu_devfreq: str = ""


@dataclass(frozen=True)
class TripPoint:
    """A thermal trip: passive = where edgerun holds the die, hot = where the kernel/firmware
    throttles (DVFS), critical = orderly power-off."""

    temp_c: float
    type: Literal["passive", "hot", "critical"]
    hyst_c: float = 3.0


@dataclass(frozen=True)
class ThermalModel:
    """Two-node RC: die -> case -> ambient. R in K/W, C in J/K."""

    r_die_case: float
    c_die: float
    r_case_amb: float
    c_case: float
    basis: str = "assumed"

    def validate(self) -> tuple[str, str] | None:
        for k in ("r_die_case", "c_die", "r_case_amb", "c_case"):
            if getattr(self, k) <= 0:
                return k, "must be > 0"
        return None


@dataclass(frozen=True)
class Thermal:
    """Thermal sensor selection, fallback trips and the simulator's model of this device.

    Which sensor the daemon reads is found by `power.thermal_source.discover_thermal`:
    `zone_type` or `hwmon_name` (+ `hwmon_label`) name it explicitly; otherwise the usual
    places are probed in a documented order and `zone` is the last resort (the simulator
    writes its tree there). `trips` are the fallback for trips the sysfs does not expose.
    """

    trips: tuple[TripPoint, ...]
    model: ThermalModel
    zone: str = "sys/class/thermal/thermal_zone0"
    zone_type: str = ""  # e.g. "cpu-thermal", "tj-thermal": the thermal zone whose type is this
    hwmon_name: str = ""  # e.g. "k10temp": the hwmon chip whose `name` is this
    hwmon_label: str = ""  # e.g. "Tctl": its tempN_label; empty: temp1
    throttle_latency_factor: float = 2.0  # latency multiplier while throttled (DVFS)
    throttle_energy_factor: float = 0.7  # energy per inference multiplier while throttled
    cooldown_s: float = 600.0  # off-time after a critical trip before the device boots again

    def trip(self, kind: str) -> TripPoint:
        """The trip of a kind (passive, hot, critical)."""
        return next(t for t in self.trips if t.type == kind)

    def validate(self) -> tuple[str, str] | None:
        kinds = [t.type for t in self.trips]
        for k in ("passive", "hot", "critical"):
            if kinds.count(k) != 1:
                return "trips", f"needs exactly one '{k}' trip, found {kinds.count(k)}"
        if not self.trip("passive").temp_c < self.trip("hot").temp_c \
                < self.trip("critical").temp_c:
            return "trips", "must rise: passive < hot < critical"
        if self.hwmon_label and not self.hwmon_name:
            return "hwmon_label", "needs hwmon_name (the chip whose label this is)"
        if self.zone_type and self.hwmon_name:
            return "zone_type", "name either a thermal zone type or an hwmon chip, not both"
        return None


@dataclass(frozen=True)
class Battery:
    """A battery behind a power_supply node."""

    capacity_wh: float
    reserve_frac: float = 0.2
    charge_efficiency: float = 0.85
    path: str = "sys/class/power_supply/BAT0"
    basis: str = "assumed"


@dataclass(frozen=True)
class Solar:
    """A solar panel whose input power is exposed by a power_supply node."""

    panel_w: float
    path: str = "sys/class/power_supply/solar"
    basis: str = "assumed"


@dataclass(frozen=True)
class PowerStates:
    """Sleep states of the board (power/duty_cycle.py plans with them; docs/sleep.md).

    Active power is the power model's (idle_w + cores x active_w_per_core at full load); idle
    is `power.idle_w`. A transition is counted whole: `resume_j` is everything the board
    draws from the RTC alarm until the daemon runs again (`resume_s`), `suspend_j` from the
    decision to sleep until the board is suspended (`suspend_s`); the camera is powered down
    while suspended and draws `camera_w` while on, the first `camera_warmup_s` of which give
    no usable frame. `basis` says where each number comes from (measured | cited | assumed,
    field by field where they differ; the profile's comments give the source)."""

    can_suspend: bool
    suspended_w: float = 0.0
    resume_s: float = 0.0
    resume_j: float = 0.0
    suspend_s: float = 0.0
    suspend_j: float = 0.0
    camera_w: float = 0.0
    camera_warmup_s: float = 0.0
    basis: str = "assumed"

    def validate(self) -> tuple[str, str] | None:
        for k in ("suspended_w", "resume_s", "resume_j", "suspend_s", "suspend_j", "camera_w",
                  "camera_warmup_s"):
            if getattr(self, k) < 0:
                return k, "must be >= 0"
        return None


@dataclass(frozen=True)
class DeviceProfile:
    """One kind of device."""

    name: str
    description: str
    power: PowerModel
    sensors: SensorPaths = field(default_factory=SensorPaths)
    thermal: Thermal | None = None
    battery: Battery | None = None
    solar: Solar | None = None
    backends: tuple[str, ...] = ("onnxruntime", "openvino", "opencv")
    states: PowerStates | None = None  # [states]: suspend and wake; None: never sleeps
    # [[accelerators]]: GPUs/NPUs and what they draw (power/accelerators.py); none: CPU only
    accelerators: tuple[AcceleratorPower, ...] = ()

    def validate(self) -> tuple[str, str] | None:
        st = self.states
        if st is not None and st.can_suspend and st.suspended_w >= self.power.idle_w:
            return "states.suspended_w", (f"{st.suspended_w} W suspended is not below the "
                                          f"{self.power.idle_w} W idle draw")
        return None

    @property
    def active_w(self) -> float:
        """Full-load power of the model: idle + every core busy."""
        return self.power.idle_w + self.power.cores * self.power.active_w_per_core
