"""Live energy per inference of the running variants, learnt from the traffic they serve.

Every control tick the pipeline reports, per variant (by pipeline.live_id), the inferences it
ran and the CPU seconds of the threads that ran them (power.cputime); once a variant has
LIVE_MIN_INFERENCES of them they become one figure, converted at the joules per CPU-second its
profile measured, folded into an EWMA (`fold`; runtime/device/serving.py each control tick). It
bills the process's other native threads to the running variant only when its engine may run
inference on threads of its own (`has_native_pool`). A variant on an accelerator is not learnt
from CPU time (its work is not the host's: converted at its profile's joules per CPU-second, a
GPU's figure read its back-to-back energy whatever it drew between frames); its live figure is
its own meter's while serving (runtime/device/serving_drift.py). `served` counts every
variant's inferences and CPU seconds since the start, for that meter's windows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from power.accelerators import on_host
from power.cputime import native_threads_cpu_s
from runtime.choice.selector import Profile

LIVE_MIN_INFERENCES = 50  # inferences per live energy update of the running rung
LIVE_ALPHA = 0.3  # EWMA weight of each live update


def fold(acc: dict[str, tuple[int, float]], live: dict[str, float],
         taken: Mapping[str, tuple[int, float]], profiles: Mapping[str, Any], running: str,
         d_native: float, default_j_per_cpu: Callable[[], float]) -> None:
    """Add `taken` ((inferences, CPU s) per live id; `d_native`: other native threads' CPU,
    billed to `running`) to `acc`, and turn each variant's that reached LIVE_MIN_INFERENCES
    into its next live figure in `live` (J per inference). `profiles`: by live id (a variant
    without one is not learnt); `default_j_per_cpu`: for a profile without CPU time."""
    for vid, (n, cpu) in taken.items():
        n0, c0 = acc.get(vid, (0, 0.0))
        acc[vid] = (n0 + n, c0 + cpu + (d_native if vid == running else 0.0))
    for vid, (n, cpu) in list(acc.items()):
        if n < LIVE_MIN_INFERENCES or vid not in profiles:
            continue
        del acc[vid]
        p = profiles[vid]
        if not on_host(p.actual_device or p.device):  # metered while serving instead
            continue
        # a profile without CPU time or energy (NaN, the unmeasured value, compares False;
        # it is truthy, and a NaN figure reached the ladder): the device's J per CPU-second
        j_per_cpu = (p.energy_mj / p.cpu_ms) if p.cpu_ms > 0 and p.energy_mj > 0 else \
            default_j_per_cpu()
        joules = cpu / n * j_per_cpu
        old = live.get(vid)
        live[vid] = joules if old is None else LIVE_ALPHA * joules + (1 - LIVE_ALPHA) * old


def has_native_pool(profile: Profile | None) -> bool:
    """Whether a variant's engine may run inference on native threads of its own (then their
    CPU is its cost): not ONNX Runtime with one intra-op thread (its backend sets one inter-op
    thread too), which runs every node in the calling thread. Unknown: assumed it may."""
    return not (profile is not None and profile.engine == "onnxruntime"
                and profile.threads == 1)


class LiveEnergy:
    """The live figures (J per inference by pipeline.live_id) and what accumulates towards
    the next ones; `Serving` calls `update` every control tick."""

    def __init__(self) -> None:
        self.live: dict[str, float] = {}  # live id -> J per inference, live
        self.acc: dict[str, tuple[int, float]] = {}  # live id -> (inferences, CPU s) so far
        self.native_cpu = 0.0  # the process's native threads' CPU s at the last update
        self.served: dict[str, tuple[int, float]] = {}  # live id -> (inferences, CPU s), all

    def update(self, take_infer_cpu: Callable[[], Mapping[str, tuple[int, float]]],
               running: str, profile: Profile | None, profiles: Mapping[str, Any],
               profiling: bool, default_j_per_cpu: Callable[[], float]) -> bool:
        """Fold what the pipeline ran since the last call (`take_infer_cpu`, read after the
        native threads' CPU) into the figures; the native threads' CPU is billed to `running`
        (its `profile`) when its engine may use them (`has_native_pool`). `profiling`: the
        profiler's work would be billed to it, so nothing is learnt. Returns whether the
        figures were updated."""
        native = native_threads_cpu_s()
        d_native, self.native_cpu = max(native - self.native_cpu, 0.0), native
        if profiling:
            take_infer_cpu()
            return False
        if not has_native_pool(profile):
            # its inference all ran in the timed thread: the process's native threads (OpenCV,
            # BLAS, ...) did other work, 2-9 ms a control tick in the first seconds after a
            # start, which billed to it made a 0.3 ms model read 2-4x its cost (docs/ota.md)
            d_native = 0.0
        taken = take_infer_cpu()
        for vid, (n, cpu) in taken.items():
            n0, c0 = self.served.get(vid, (0, 0.0))
            self.served[vid] = (n0 + n, c0 + cpu)
        fold(self.acc, self.live, taken, profiles, running, d_native, default_j_per_cpu)
        return True

    def forget_model(self) -> None:
        """The [model]'s figures start afresh (another measurement of it was installed); the
        sources' own models' (live ids with a key) are kept. What was accumulating goes too:
        two versions of one model share variant ids, so the old version's last inferences
        would be billed to the new version's first figure (the one probation judges)."""
        self.live = {k: v for k, v in self.live.items() if "\x00" in k}
        self.acc = {k: v for k, v in self.acc.items() if "\x00" in k}
