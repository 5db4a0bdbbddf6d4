"""One OpenCL ICD loader per process, so OpenCV and pyopencl list the same devices.

pyopencl's wheel carries its own loader (`pyopencl/.libs/libOpenCL-<hash>.so.1.0.0`, ocl-icd
built to read the ICDs in `$PYOPENCL_HOME/.libs` as well as `/etc/OpenCL/vendors` or
`OCL_ICD_VENDORS`); pocl-binary-distribution installs its `pocl.icd` and `libpocl-<hash>.so`
there. OpenCV dlopens `libOpenCL.so.1` with RTLD_GLOBAL the first time it asks about OpenCL.
Where FFmpeg is installed that is Debian's ocl-icd, which reads `/etc/OpenCL/vendors` only,
and from then on pyopencl's own calls bind to it (the global scope is searched before a
library's own dependencies): no platform, the pocl wheel's device gone.

`share()` makes the wheel's loader the process's one loader: it imports pyopencl (which loads
that loader from pyopencl's own extension, whose RPATH is the only way the loader's bare
`libpocl-<hash>.so` resolves, and sets PYOPENCL_HOME) and names the same file to OpenCV
(`OPENCV_OPENCL_RUNTIME`), so OpenCV's dlopen returns the library already loaded. Both then
see the wheel's pocl and every system ICD, whatever the import order, as long as OpenCV has
not asked about OpenCL before. docs/install.md ("One OpenCL loader") has the measurements.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterable, MutableMapping
from pathlib import Path

log = logging.getLogger(__name__)

OPENCV_RUNTIME = "OPENCV_OPENCL_RUNTIME"  # OpenCV's name for the OpenCL library it dlopens
_warned: list[bool] = []  # the warning below, once a process (share() runs per engine module)


def bundled_loader() -> Path | None:
    """The ICD loader inside the installed pyopencl wheel, found without importing it; None
    without pyopencl or when it was built against the system's libOpenCL (then both libraries
    use that one already)."""
    spec = importlib.util.find_spec("pyopencl")
    if spec is None or not spec.origin:
        return None
    libs = Path(spec.origin).parent / ".libs"
    found = sorted(libs.glob("libOpenCL*.so*")) if libs.is_dir() else []
    return found[0] if found else None


def plan(loader: Path | None, environ: MutableMapping[str, str]) -> dict[str, str]:
    """The environment to set so OpenCV loads `loader`: nothing without a bundled loader, or
    when the operator named another OpenCL library for OpenCV (or `disabled`). Named already
    (a parent process's setting): the same again, since pyopencl must still load it first."""
    if loader is None or environ.get(OPENCV_RUNTIME, str(loader)) != str(loader):
        return {}
    return {OPENCV_RUNTIME: str(loader)}


def foreign(maps: Iterable[str], loader: Path | None) -> list[str]:
    """OpenCL loaders mapped in the process other than `loader`, from /proc/self/maps lines:
    one loaded first (by OpenCV before `share()`) holds the process's OpenCL calls."""
    out = []
    for line in maps:
        parts = line.split()
        path = parts[-1] if len(parts) >= 6 else ""
        name = Path(path).name
        if name.startswith("libOpenCL") and ".so" in name and path not in out \
                and (loader is None or Path(path) != loader):
            out.append(path)
    return out


def foreign_loaders() -> list[str]:
    """The OpenCL loaders that hold pyopencl's calls instead of its bundled one: those this
    process has mapped, when the global scope's `clGetPlatformIDs` (what pyopencl's extension
    binds to first) is not the bundled loader's. A loader mapped in a library's local scope
    (FFmpeg's, inside a GStreamer plugin) takes no call from pyopencl and is not named.
    Meaningful once pyopencl is imported (its loader loaded)."""
    import ctypes

    loader = bundled_loader()
    if loader is None:
        return []
    try:
        first = ctypes.cast(ctypes.CDLL(None).clGetPlatformIDs, ctypes.c_void_p).value
    except AttributeError:  # no OpenCL library in the global scope: pyopencl binds its own
        return []
    try:
        ours = ctypes.cast(ctypes.CDLL(str(loader)).clGetPlatformIDs, ctypes.c_void_p).value
    except (OSError, AttributeError):
        ours = None
    if first == ours:  # OpenCV loaded the bundled one (share()): one loader
        return []
    try:
        with open("/proc/self/maps") as f:
            return foreign(f, loader) or ["another OpenCL library"]
    except OSError:
        return ["another OpenCL library"]


def share() -> str:
    """Make pyopencl's bundled loader the one OpenCV loads too (module docstring). Returns what
    was done, in words, for the log; never raises (a pyopencl that cannot be imported is the
    opencl engine's to report)."""
    env = os.environ  # OpenCV reads the process's environment when it first asks
    loader = bundled_loader()
    todo = plan(loader, env)
    if not todo:
        if loader is not None:
            return f"OpenCV's OpenCL library is named by {OPENCV_RUNTIME}={env[OPENCV_RUNTIME]}"
        return ("no pyopencl with a bundled OpenCL loader (absent, or built against the "
                "system's, which OpenCV then shares)")
    try:
        import pyopencl  # noqa: F401  # loads the loader with its RPATH; sets PYOPENCL_HOME
    except Exception as e:  # a broken install: the opencl engine reports it when discovered
        return f"pyopencl cannot be imported ({type(e).__name__}: {e}); OpenCV left alone"
    env.update(todo)
    early = foreign_loaders()
    if early and not _warned:  # OpenCV (or another library) loaded it first: for good
        _warned.append(True)
        log.warning("OpenCL: %s was loaded before pyopencl's loader; pyopencl may list no "
                    "platform in this process. Import runtime.engine.backends before anything "
                    "asks OpenCV about OpenCL (docs/install.md, \"One OpenCL loader\")",
                    ", ".join(early))
    return f"OpenCV and pyopencl share pyopencl's OpenCL loader {loader}"
