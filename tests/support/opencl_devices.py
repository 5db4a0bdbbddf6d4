"""The OpenCL devices the tests run on, found once per process (at collection): every device
pyopencl lists, by the id the backend gives it, or only the one EDGERUN_TEST_OPENCL_DEVICE
names. A device whose driver cannot build a one-line kernel is a skip with the driver's reason,
never a failure (pip's pocl on a CPU its LLVM does not know: `unknown target CPU 'generic'`).
"""

from __future__ import annotations

import functools
import os

import pytest

ENV = "EDGERUN_TEST_OPENCL_DEVICE"
ONE_LINE = "__kernel void one(__global float *x) { x[get_global_id(0)] = 1.0f; }"


@functools.cache
def found() -> dict[str, str]:
    """Every OpenCL device id -> "" when a one-line kernel builds on it, else why not (the
    backend's own refusal: the device and the build log's `error:` line). Empty without
    pyopencl or an OpenCL driver."""
    try:
        from runtime.engine.backends.opencl import OpenClBackend
    except ImportError:
        return {}
    b = OpenClBackend(kernel_source=ONE_LINE)
    refused = b.probe()
    return {d.id: refused.get(d.id, "") for d in b.devices()}


def named() -> str:
    """The device EDGERUN_TEST_OPENCL_DEVICE names ("" when unset: every device)."""
    return os.environ.get(ENV, "").strip()


def selected() -> list[str]:
    """The device ids OpenCL tests are for: the named one, else every device found."""
    return [named()] if named() else list(found())


def broken() -> dict[str, str]:
    """Devices found whose driver cannot build a one-line kernel, with why."""
    return {d: why for d, why in found().items() if why}


def working() -> list[str]:
    """The selected devices a one-line kernel builds on."""
    return [d for d in selected() if d in found() and not found()[d]]


def runs(v) -> bool:
    """Whether a test should run variant `v`: any other engine's, or an OpenCL one on a
    selected device that works."""
    return v.engine != "opencl" or v.device in working()


def refused_here(p) -> bool:
    """Whether profile `p` is a refusal by a device found broken here: recorded as refused,
    naming the device (what a test that profiles every variant accepts instead of numbers)."""
    return (p.status == "refused" and p.engine == "opencl" and p.device in broken()
            and f"device {p.device} (" in p.error)


def measured(profiles) -> list[tuple]:
    """Each profile's id, status and p95 (None where nothing ran: a failure's p95 is NaN,
    and NaN != NaN), to compare two runs' results."""
    return [(p.variant_id, p.status, p.p95_ms if p.ok else None) for p in profiles]


def params() -> list:
    """One pytest param per selected device (its id as the test id): a device that cannot
    build the one-line kernel is skip-marked with why; a named device stays unmarked even
    then (it was asked for: `require` fails it). A skip-marked None where there is none."""
    if not selected():
        return [pytest.param(None, id="no-device", marks=pytest.mark.skip(
            reason="no OpenCL device (pyopencl and a driver: pocl-binary-distribution "
                   "provides one on x86_64)"))]
    out = []
    for d in selected():
        why = broken().get(d)
        marks = [pytest.mark.skip(reason=f"OpenCL {why}")] if why and not named() else []
        out.append(pytest.param(d, id=d, marks=marks))
    return out


def require(device_id: str) -> str:
    """The device id, once it is known to work; a named device that is absent or broken
    fails the test with why."""
    if device_id not in found():
        pytest.fail(f"{ENV}={device_id}: no such OpenCL device here (found: "
                    f"{', '.join(found()) or 'none'})")
    if found()[device_id]:
        pytest.fail(f"{ENV}={device_id}: {found()[device_id]}")
    return device_id
