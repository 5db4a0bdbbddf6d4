"""What an accelerator costs: its power model, which variants run on it, and their bill. Pure.

Without a meter, a variant's energy is its host threads' CPU time x W per core. A variant that
runs on a GPU or NPU spends almost no host CPU, so billed that way it would look nearly free
and always be chosen, whatever the accelerator draws. So a variant whose session reports a
device that is not the host CPU is billed host CPU + accelerator busy time x the accelerator's
active power (from the device profile's `[[accelerators]]`), or, with a meter that covers the
accelerator (NVML), the meter's energy above its idle floor. A variant on an accelerator that
neither the profile nor a meter describes has no energy figure: it is left out of the choice
with a reason, never billed as free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class AcceleratorPower:
    """One accelerator a device profile describes (`[[accelerators]]`)."""

    match: str  # case-insensitive substring of the device a session reports, e.g. "NVIDIA"
    kind: Literal["GPU", "NPU", "ACCEL"] = "GPU"
    idle_w: float = 0.0  # drawn whether or not it computes (part of the box's idle floor)
    active_w: float = 0.0  # drawn while it computes (busy), idle included
    basis: str = "assumed"  # measured | cited | assumed: where the numbers come from

    def validate(self) -> tuple[str, str] | None:
        if not self.match.strip():
            return "match", "must name (part of) the device a session reports, e.g. \"NVIDIA\""
        if self.idle_w < 0 or self.active_w <= 0 or self.active_w < self.idle_w:
            return "active_w", (f"need 0 <= idle_w <= active_w and active_w > 0, got "
                                f"idle_w {self.idle_w}, active_w {self.active_w}")
        return None

    @property
    def dynamic_w(self) -> float:
        """What computing adds to the idle draw."""
        return self.active_w - self.idle_w


# Devices that are the host's own cores, as each engine names them (ORT's CPU provider,
# OpenVINO's CPU plugin, OpenCV's CPU target, an OpenCL CPU device such as pocl's).
_HOST = ("cpu",)


def on_host(actual_device: str) -> bool:
    """Whether a session's reported device is the host CPU (its energy is the host's CPU time).
    Anything else (CUDA, TensorRT, GPU.0, NPU, an OpenCL GPU...) is an accelerator."""
    return actual_device.strip().lower().startswith(_HOST)


def find(accelerators: Sequence[AcceleratorPower], actual_device: str) -> AcceleratorPower | None:
    """The first described accelerator whose `match` appears in the reported device."""
    dev = actual_device.lower()
    return next((a for a in accelerators if a.match.lower() in dev), None)


@dataclass(frozen=True)
class Bill:
    """One variant's energy per inference: the host's share, the accelerator's, and how each
    was obtained. `energy_mj` is None when it cannot be known, with `reason` saying why."""

    energy_mj: float | None
    source: str
    host_mj: float
    accel_mj: float | None
    reason: str = ""


def bill(n: int, host_mj_total: float, host_source: str, actual_device: str, busy_s: float,
         accelerators: Sequence[AcceleratorPower] = (), metered_j: float | None = None,
         meter_idle_w: float | None = None, wall_s: float = 0.0) -> Bill:
    """Energy per inference of `n` inferences whose host share was `host_mj_total` mJ.

    On the host CPU the host share is the whole bill. On an accelerator: with a meter that
    covers it (`metered_j` over `wall_s`, idle `meter_idle_w`), its energy above idle; else
    `busy_s` x the profile's dynamic power (active - idle), labelled estimated; else None."""
    host = host_mj_total / n
    if on_host(actual_device):
        return Bill(host, host_source, host, None)
    if metered_j is not None and meter_idle_w is not None:
        accel = max(metered_j - meter_idle_w * wall_s, 0.0) / n * 1e3
        return Bill(host + accel, f"{host_source}+nvml", host, accel)
    model = find(accelerators, actual_device)
    if model is None:
        return Bill(None, host_source, host, None,
                    f"runs on {actual_device!r}, which no meter covers and the device profile "
                    "does not describe ([[accelerators]] idle_w/active_w): its energy is unknown")
    accel = busy_s * model.dynamic_w / n * 1e3
    source = "estimated" if host_source == "estimated" else f"{host_source}+estimated"
    return Bill(host + accel, source, host, accel)
