"""Re-ranking while serving (runtime/device/serving_drift.py): the running accelerator
variant's energy on its own meter, and the choice made again when it exceeds the profile's.

The GPU and NVML are faked at the hardware boundary (tests/support/fake_gpu.py); the engine
(ONNX Runtime), the profiler, the selector, the daemon and its pipeline are the real ones.
"""

from __future__ import annotations

import time

import pytest
from support.daemon_harness import write_config
from support.fake_gpu import FakeGpu, FakeNvml, gpu_backend
from support.modelgen import tiny_cnn

from runtime.device.serving_drift import MIN_INFERENCES, ServedWindow


def _err(window_s: float) -> float:
    return 0.1 / window_s


@pytest.mark.parametrize("readings, want", [
    # (variant, t s, J, inferences, CPU s): 40 W above a 20 W idle, 20/s, no host CPU
    ([("g", 0.0, 0.0, 0, 0.0), ("g", 2.0, 120.0, 40, 0.0)], (20.0, 2000.0)),
    # host CPU billed at 6 W a core: 1 ms CPU a frame is 6 mJ
    ([("g", 0.0, 0.0, 0, 0.0), ("g", 2.0, 40.0, 40, 0.04)], (20.0, 6.0)),
    # too short, then long enough: one window from the first reading
    ([("g", 0.0, 0.0, 0, 0.0), ("g", 1.0, 60.0, 20, 0.0), ("g", 2.0, 120.0, 40, 0.0)],
     (20.0, 2000.0)),
    # too few inferences (a slow source): no figure yet
    ([("g", 0.0, 0.0, 0, 0.0), ("g", 3.0, 180.0, MIN_INFERENCES - 1, 0.0)], None),
    # another variant took over: its window starts afresh
    ([("g", 0.0, 0.0, 0, 0.0), ("c", 2.0, 120.0, 40, 0.0)], None),
    # a counter that went backwards: a fresh window, never a negative figure
    ([("g", 0.0, 100.0, 0, 0.0), ("g", 2.0, 50.0, 40, 0.0)], None),
    # below idle (the floor moved): the accelerator's share is 0, never negative
    ([("g", 0.0, 0.0, 0, 0.0), ("g", 2.0, 30.0, 40, 0.0)], (20.0, 0.0)),
])
def test_a_window_of_served_frames(readings, want):
    w = ServedWindow()
    got = None
    for vid, t, j, n, cpu in readings:
        got = w.feed(vid, t, j, n, cpu, need_s=2.0, idle_w=20.0, w_per_core=6.0,
                     error_of=_err) or got
    if want is None:
        assert got is None
    else:
        assert got is not None
        assert (got.rate_hz, got.live_mj) == pytest.approx(want)
        assert got.error == pytest.approx(0.05)


def test_at_20_hz_the_daemon_re_ranks_onto_the_lower_at_rate_energy(tmp_path, monkeypatch):
    """The profiler measured a GPU that raced to idle after its burst: no gap power, so at
    20 Hz its at-rate figure is its (tiny) back-to-back one and it is chosen over the CPU.
    Served at 20 Hz the GPU keeps 40 W above its idle floor between frames (the lent H200's
    active-idle case): its meter reads ~2 J a frame while serving, far beyond the meter's
    error; the daemon replaces the figure, chooses again, says so in one `rerank` event, and
    ends on the CPU variant."""
    from power import nvml as nvml_mod
    from runtime.config import load
    from runtime.device import daemon as daemon_mod
    from runtime.device import serving as serving_mod
    from runtime.engine.backends.onnxruntime import OnnxRuntimeBackend

    # a 1 W idle floor: the profiler's idle and gap figures are good to ~5 % of the GPU's
    # power (its meter's resolution), 0.05 W here, ~2.5 mJ a frame at 20 Hz
    gpu = FakeGpu(tick_s=0.1, idle_w=1.0, busy_w=1.0, hold_w=1.0, hold_s=5.0)
    monkeypatch.setattr(daemon_mod, "gpu_meters", lambda: nvml_mod.gpu_meters(FakeNvml([gpu])))
    monkeypatch.setattr(serving_mod, "discover", lambda cfg: [
        OnnxRuntimeBackend(), gpu_backend(OnnxRuntimeBackend, gpu, 0.001)])
    model = tiny_cnn(tmp_path / "m.onnx", batch=1, hw=(256, 256))  # ~2 ms a CPU core
    cfg = write_config(tmp_path, tmp_path / "cache", source='kind = "synthetic"\nrate_hz = 20',
                       extra=f'[model]\npath = "{model}"\n')
    cfg.write_text(cfg.read_text().replace("accuracy_floor = 0.99\n", "")
                   .replace("rate_hz = 40", "rate_hz = 20")
                   .replace("[profiler]\n", '[profiler]\nschedule = "exhaustive"\n'))
    d = daemon_mod.Daemon(load(cfg))
    said: list = []
    emit = d.event
    d.event = lambda type_, severity="info", **f: (said.append((type_, f)),
                                                   emit(type_, severity, **f))
    d.start()
    try:
        gpu_id = d.pipeline.active.variant_id
        model = d.serving.box.model
        assert model.by_id[gpu_id].engine.startswith("fakegpu"), model.profiles
        cpu_id = next(p.variant_id for p in model.profiles if p.variant_id != gpu_id)
        assert model.by_id[gpu_id].gap_w == pytest.approx(0.0, abs=0.1)  # raced to idle
        gpu.hold_w = 41.0  # serving at a cadence: 40 W above idle between frames
        end = time.monotonic() + 30
        while time.monotonic() < end and not (
                [f for t, f in said if t == "rerank"] and d.pipeline.active
                and d.pipeline.active.variant_id == cpu_id):
            d.serving.apply_installs(d.ota.apply)
            d.control_tick()
            time.sleep(d.cfg.governor.tick_s)
        reranks = [f for t, f in said if t == "rerank"]
        assert len(reranks) == 1, said
        r = reranks[0]
        assert r["variant"] == gpu_id and r["choice"] == cpu_id
        assert r["outcome"] == f"{cpu_id} chosen instead of {gpu_id}"
        # the source offers 20 frames a second; the daemon serves what its host keeps up
        # with (13-15/s beside two CPU hogs on a 2-core machine: a frame's Python takes
        # longer than 50 ms of a loaded core), never more
        assert 5.0 <= r["rate_hz"] <= 20.0 * 1.15, r
        # 40 W x (a frame's period at the rate served - the 1 ms kernel), within the meter's
        # error and the source's jitter: ~1.96 J at 20/s
        assert r["live_mj"] == pytest.approx(40.0 * (1e3 / r["rate_hz"] - 1.0), rel=0.15)
        assert r["profiled_mj"] < 0.05 * r["live_mj"] and 0 < r["error"] <= 0.1
        assert "measured while serving" in r["label"]
        model = d.serving.box.model  # the re-rank installed a new measurement
        assert d.pipeline.active.variant_id == cpu_id and model.rungs[-1].variant_id == cpu_id
        assert "measured while serving" in model.by_id[gpu_id].gap_source
    finally:
        d.stop()
