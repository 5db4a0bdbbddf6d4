"""The daemon's cap on glibc malloc arenas (runtime/device/malloc_arenas.py): with it, eight
threads allocating at once share at most two arenas; without it, each gets its own."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import pytest
from support.under_test import child_env

from runtime.device.malloc_arenas import limit_malloc_arenas

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="arenas and malloc_info are glibc's")

# Counts the arenas glibc made (malloc_info's <heap> elements) once 8 threads have each
# allocated while the others hold theirs: a thread gets a new arena on its first malloc
# until the cap is reached.
PROBE = textwrap.dedent("""
    import ctypes, sys, tempfile, threading
    if sys.argv[1] == "capped":
        from runtime.device.malloc_arenas import limit_malloc_arenas
        print(limit_malloc_arenas())
    else:
        print(None)
    n = 8
    barrier = threading.Barrier(n + 1)
    def work():
        held = [bytearray(4096) for _ in range(64)]  # > pymalloc's 512 B: glibc malloc
        barrier.wait()
        barrier.wait()
        del held
    threads = [threading.Thread(target=work) for _ in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    libc = ctypes.CDLL("libc.so.6")
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    with tempfile.NamedTemporaryFile(suffix=".xml") as f:
        fp = libc.fopen(f.name.encode(), b"w")
        libc.malloc_info(0, fp)
        libc.fclose(fp)
        print(open(f.name).read().count("<heap nr="))
    barrier.wait()
    for t in threads:
        t.join()
""")


def arenas(mode: str) -> tuple[str, int]:
    """(what limit_malloc_arenas returned or None, arenas counted) in a fresh process."""
    env = child_env()
    env.pop("MALLOC_ARENA_MAX", None)
    out = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    return out[0], int(out[1])


def test_the_cap_keeps_eight_allocating_threads_in_two_arenas():
    said, capped = arenas("capped")
    _, free = arenas("free")
    assert said == "True"
    assert capped <= 2, capped
    # the probe can tell: without the cap the same threads spread over more arenas
    assert free > 2, free


def test_an_operators_malloc_arena_max_is_left_alone(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False
    assert os.environ["MALLOC_ARENA_MAX"] == "4"
