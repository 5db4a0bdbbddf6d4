"""A bound on glibc's malloc arenas for the long-lived daemon.

glibc gives each thread that allocates its own arena, up to 8 per core, and each arena keeps
the peak of what its thread freed as resident memory. The daemon's threads (camera, pipeline,
publisher, MQTT, ONNX Runtime's) churn frames and tensors, so on the field soak
(bench/field_soak.py, docs/daemon.md "Field soak") `edgerun serve` grew ~13 MB in its first
simulated day and swung +/-5 MB from sample to sample, all of it glibc arena space (Python's
own objects flat). Two arenas leave a few MB of warm-up and no swing. `MALLOC_ARENA_MAX` set
by the operator wins: glibc read it at start, and it is not overridden here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_ARENA_MAX = -8  # glibc's malloc.h
DEFAULT_ARENAS = 2


def limit_malloc_arenas(n: int = DEFAULT_ARENAS) -> bool:
    """Cap glibc's malloc arenas at `n` (call before threads start allocating: arenas made
    already stay). True when the cap was set; False on a libc without mallopt's M_ARENA_MAX
    (musl, macOS) or when MALLOC_ARENA_MAX is set in the environment."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 -- glibc only: M_ARENA_MAX means another thing elsewhere
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt(M_ARENA_MAX, n) == 1
