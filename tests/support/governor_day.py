"""The ladders and the demo's camera the governor's day tests share (tests/power/ and
tests/tools/): the daemon's ladder from the bundled model's reference profiles, on a device."""

from __future__ import annotations

from models import bundled
from power.device import DeviceProfile
from power.rungs import Rung, on_device
from runtime.choice.ladders import ladder_for
from runtime.choice.measure import recorded_profiles
from runtime.choice.selector import Constraints
from runtime.tools.demo import OFFERED_SHARE as DEMO_SHARE

PROFILES = bundled() / "reference-profiles.json"

__all__ = ["DEMO_SHARE", "PROFILES", "ladder"]


def ladder(dev: DeviceProfile, floor: float | None = None) -> list[Rung]:
    """The daemon's ladder (latency target 20 ms, accuracy floor `floor`) on `dev`."""
    ps = recorded_profiles(PROFILES)
    rungs, _ = ladder_for(list(ps.values()), Constraints(20.0, accuracy_floor=floor))
    return on_device(rungs, [ps[r.variant_id].cpu_ms / 1e3 for r in rungs], dev.power)
