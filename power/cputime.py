"""CPU time of inference work, not of the whole process.

An estimate of inference energy from CPU time must count the thread that runs the engine and
the engine's own worker threads (ONNX Runtime / OpenVINO / pocl pools, started in C++), and
nothing else: the process also decodes frames, preprocesses, stores and publishes. Counting the
whole process (time.process_time) and subtracting an idle baseline measured while the
pipeline runs is what made every in-daemon profile read 0 mJ.

`inference_cpu_s()` = CPU time of the calling thread + CPU time of every thread Python did not
start. Use it as a difference over a window in one thread. While a multi-threaded session of
the pipeline runs at the same time, its pool threads are counted too (an overestimate, never
an underestimate). A thread that exits keeps its last reading in the sum (a dropped session's
pool threads exit: taking their CPU time off made the window of whatever was measured
meanwhile negative, billed 0 mJ), so the sum never decreases.
"""

from __future__ import annotations

import os
import threading
import time

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_TASKS = "/proc/self/task"


def _thread_cpu_s(tid: str) -> float:
    """One thread's CPU seconds: schedstat's nanoseconds where the kernel has it, else the
    utime + stime clock ticks of stat (10 ms steps: too coarse for sub-millisecond models)."""
    try:
        with open(f"{_TASKS}/{tid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        pass
    with open(f"{_TASKS}/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK  # stat fields 14 and 15


_lock = threading.Lock()
_seen: dict[int, float] = {}  # native thread id -> its last reading
_gone_s = 0.0  # the last readings of native threads that have exited


def native_threads_cpu_s() -> float:
    """CPU seconds of this process's threads that Python did not start, including the last
    reading of those that have exited (see module doc); 0 where /proc is not available."""
    global _gone_s
    python = {t.native_id for t in threading.enumerate()}
    # read and account under one lock: a reading older than the last one accounted would
    # look like a thread that exited
    with _lock:
        try:
            tids = os.listdir(_TASKS)
        except OSError:
            return 0.0
        now: dict[int, float] = {}
        for tid in tids:
            if not tid.isdigit() or int(tid) in python:
                continue
            try:
                now[int(tid)] = _thread_cpu_s(tid)
            except (OSError, ValueError, IndexError):
                continue  # the thread exited between listdir and open
        for tid, last in _seen.items():
            if now.get(tid, -1.0) < last:  # exited (or its id now names a new thread)
                _gone_s += last
        _seen.clear()
        _seen.update(now)
        return _gone_s + sum(now.values())


def inference_cpu_s() -> float:
    """CPU seconds of the calling thread plus the engines' native threads (see module doc)."""
    return time.thread_time() + native_threads_cpu_s()


def named_threads_cpu_s(name: str) -> float | None:
    """CPU seconds of this process's running Python threads called `name` (the publisher's
    "mqtt"), from schedstat per thread; None when no such thread runs or /proc cannot say."""
    ids = [t.native_id for t in threading.enumerate() if t.name == name and t.native_id]
    if not ids:
        return None
    try:
        return sum(_thread_cpu_s(str(i)) for i in ids)
    except (OSError, ValueError, IndexError):
        return None  # it exited between enumerate and the read
