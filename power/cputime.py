"""CPU time of inference work, not of the whole process.

An estimate of inference energy from CPU time must count the thread that runs the engine and
the engine's own worker threads (ONNX Runtime / OpenVINO / pocl pools, started in C++), and
nothing else: the process also decodes frames, preprocesses, stores and publishes. Counting the
whole process (time.process_time) and subtracting an idle baseline measured while the
pipeline runs is what made every in-daemon profile read 0 mJ.

`inference_cpu_s()` = CPU time of the calling thread + CPU time of every thread Python did not
start. Use it as a difference over a window in one thread. While a multi-threaded session of
the pipeline runs at the same time, its pool threads are counted too (an overestimate, never
an underestimate). Threads that exit during a window drop out of the sum, so a negative
difference is possible and callers clamp.
"""

from __future__ import annotations

import os
import threading
import time

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_TASKS = "/proc/self/task"


def native_threads_cpu_s() -> float:
    """CPU seconds (user + system) of this process's threads that Python did not start; 0
    where /proc is not available."""
    python = {t.native_id for t in threading.enumerate()}
    total = 0
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return 0.0
    for tid in tids:
        if not tid.isdigit() or int(tid) in python:
            continue
        try:
            with open(f"{_TASKS}/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the thread exited between listdir and open
        total += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14 and 15)
    return total / _TICK


def inference_cpu_s() -> float:
    """CPU seconds of the calling thread plus the engines' native threads (see module doc)."""
    return time.thread_time() + native_threads_cpu_s()
