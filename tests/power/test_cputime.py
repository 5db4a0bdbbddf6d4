"""Inference energy is billed to inference work, not to the whole process (power/cputime.py):
the bug was every profile made inside the running daemon reading 0 mJ."""

from __future__ import annotations

import threading
import time

import numpy as np

from power.cputime import inference_cpu_s
from power.sensors import EstimatedMeter


def _burn(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        x += 1  # a pipeline thread busy with something else


def test_another_busy_python_thread_is_not_billed():
    stop = threading.Event()
    t = threading.Thread(target=_burn, args=(stop,), daemon=True)
    t.start()
    try:
        meter = EstimatedMeter(idle_w=1.0, active_w_per_core=5.0)
        e0, w0 = meter.energy_j(), time.monotonic()
        time.sleep(0.5)  # this thread idles while the other one burns a core
        e1, w1 = meter.energy_j(), time.monotonic()
    finally:
        stop.set()
        t.join()
    idle = 1.0 * (w1 - w0)
    assert e1 - e0 < idle + 5.0 * 0.05  # at most a sliver of CPU billed, not 0.5 s of a core


def test_work_in_this_thread_is_billed_and_never_zero():
    meter = EstimatedMeter(idle_w=0.0, active_w_per_core=5.0)
    a = np.random.default_rng(0).standard_normal((300, 300))
    c0, e0 = inference_cpu_s(), meter.energy_j()
    for _ in range(30):
        a = a @ a.T / 300
    c1, e1 = inference_cpu_s(), meter.energy_j()
    assert c1 > c0 and e1 - e0 > 0


def test_an_engine_thread_that_exits_in_the_window_takes_nothing_off(tiny_model):
    """A session's pool threads exit when it is dropped (a swap, the profiler going on to the
    next variant): their CPU time must not leave the sum, or the window of whatever was being
    measured meanwhile reads negative and is billed 0 mJ (it did, order-dependently: in a full
    test run another test's engine threads exited during the test above)."""
    import gc

    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 3  # two pool threads besides the caller
    sess = ort.InferenceSession(str(tiny_model), so, providers=["CPUExecutionProvider"])
    x = np.zeros((8, 3, 32, 32), np.float32)
    name = sess.get_inputs()[0].name
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:  # the pool threads work (and spin) for a while
        sess.run(None, {name: x})
    c0 = inference_cpu_s()
    del sess
    gc.collect()  # the session and its pool threads are gone
    c1 = inference_cpu_s()
    assert c1 >= c0, (c0, c1)
