"""Loaded (as sitecustomize) only by processes a test runs under libfaketime with
FAKETIME_DONT_FAKE_MONOTONIC=1: libfaketime 0.9.10 then fails clock_nanosleep with an absolute
CLOCK_MONOTONIC deadline (EINVAL), which is what Python's time.sleep uses; a condition wait
on the monotonic clock works, so time.sleep waits on one instead. The process is otherwise
the real one."""

import threading
import time

_never = threading.Event()


def _sleep(seconds: float) -> None:
    if seconds > 0:
        _never.wait(seconds)


time.sleep = _sleep
