"""Energy per inference at the served rate (runtime/choice/at_rate.py) and provisional quick
figures (runtime/choice/provisional.py) in the selector's decisions: pure, on tables."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from runtime.choice import at_rate
from runtime.choice.frame_cost import FrameCosts
from runtime.choice.ladders import ladder_for
from runtime.choice.selector import Constraints, Profile, select

GPU = Profile("m@gpu", "m", "fp32", "opencl", "GPU.0", 1, actual_device="GPU.0 (NVIDIA CUDA: L4)",
              p50_ms=4.0, p95_ms=4.0, p99_ms=4.0, energy_mj=370.0, energy_source="rapl+nvml",
              energy_ci=0.02, gap_w=40.0, gap_source="nvml: measured")
CPU = Profile("m@cpu", "m", "fp32", "onnxruntime", "CPU", 16, actual_device="CPU",
              p50_ms=5.0, p95_ms=5.0, p99_ms=5.0, energy_mj=410.0, energy_source="rapl",
              energy_ci=0.02)


@pytest.mark.parametrize("p, rate, mj", [
    (GPU, 0.0, 370.0),
    (GPU, 20.0, 370.0 + 40.0 * 46.0),   # 50 ms period - 4 ms kernel
    (GPU, 5.0, 370.0 + 40.0 * 196.0),
    (GPU, 1000.0, 370.0),               # no gap when the period is under the kernel
    (CPU, 20.0, 410.0),                 # the host's cores idle between frames
    (replace(GPU, p95_ms=10.0), 20.0, 370.0 + 40.0 * 46.0),  # the gap after a median kernel
])
def test_energy_at_a_rate(p, rate, mj):
    assert at_rate.per_inference_mj(p, rate) == pytest.approx(mj)


def test_served_is_idempotent_and_reversible():
    once = at_rate.served([GPU, CPU], 20.0)
    assert once[0].energy_mj == pytest.approx(2210.0) and once[0].back_to_back_mj == 370.0
    assert at_rate.served(once, 20.0) == once
    assert at_rate.served(once, 5.0)[0].energy_mj == pytest.approx(370.0 + 40.0 * 196.0)
    back = at_rate.served(once, 0.0)
    assert back[0].energy_mj == 370.0 and math.isnan(back[0].back_to_back_mj)
    assert "46.0 ms" in at_rate.label(once[0]) and "back to back" in at_rate.label(GPU)


@pytest.mark.parametrize("c, chosen", [
    (Constraints(latency_ms=6.0), "m@gpu"),                   # back to back: the GPU
    (Constraints(latency_ms=6.0, rate_hz=20.0), "m@cpu"),     # at 20 Hz: the CPU
    (Constraints(latency_ms=6.0, frame=FrameCosts(idle_w=81.0, rate_hz=20.0)), "m@cpu"),
    (Constraints(latency_ms=6.0, frame=FrameCosts(idle_w=81.0, rate_hz=0.0)), "m@gpu"),
])
def test_the_choice_is_the_lower_at_rate_energy(c, chosen):
    assert select([GPU, CPU], c).profile.variant_id == chosen
    rungs, _ = ladder_for([GPU, CPU], c)
    # as accurate and dearer at the served rate: the other is no rung below it (at 20 Hz
    # the GPU's back-to-back 370 mJ would look cheaper than the CPU's 410)
    assert [r.variant_id for r in rungs] == [chosen]


@pytest.mark.parametrize("gpu_ci, gpu_mj, stage, chosen", [
    (0.5, 300.0, "quick", "m@cpu"),   # provisional and overlapping: not against the CPU
    (0.02, 300.0, "quick", "m@gpu"),  # provisional but clearly cheaper
    (0.5, 300.0, "full", "m@gpu"),    # settled
    (math.nan, 300.0, "quick", "m@cpu"),  # unknown interval: overlaps
    (0.5, 300.0, "refined", "m@gpu"),  # refined: settled too
])
def test_a_quick_accelerator_figure_is_provisional(gpu_ci, gpu_mj, stage, chosen):
    g = Profile(**{**GPU.__dict__, "energy_mj": gpu_mj, "energy_ci": gpu_ci, "stage": stage,
                   "gap_w": math.nan})
    c = select([g, CPU], Constraints(latency_ms=6.0))
    assert c.profile.variant_id == chosen
    assert ("provisional" in c.reason) is (chosen == "m@cpu")


def test_a_provisional_figure_gives_way_to_the_cheapest_overlapping_cpu_variant():
    g = replace(GPU, energy_mj=300.0, energy_ci=0.5, stage="quick", gap_w=math.nan)
    cheaper = replace(CPU, variant_id="m@cpu-int8", energy_mj=350.0)
    c = select([g, CPU, cheaper], Constraints(latency_ms=6.0))
    assert c.profile.variant_id == "m@cpu-int8"


@pytest.mark.parametrize("profiled, live, err, re_rank", [
    (100.0, 104.0, 0.05, False), (100.0, 120.0, 0.05, True), (100.0, 120.0, 0.3, False),
    (100.0, 106.0, math.nan, True), (0.0, 50.0, 0.05, False), (100.0, math.nan, 0.05, False),
    (100.0, 104.0, 0.0, False),  # no error given (0): the 5 % floor, not every wobble
])
def test_drift_while_serving(profiled, live, err, re_rank):
    assert (at_rate.drift(profiled, live, err) is not None) is re_rank
