"""One OpenCL loader for OpenCV and pyopencl (runtime/engine/backends/opencl_loader.py): where
FFmpeg brought Debian's ICD loader and no vendor ICD, discovery still finds the OpenCL engine
and the pocl wheel's device, whatever was imported first; a system ICD beside the wheel adds
its devices; and each engine discovery did not find says why and what to do.

Each case runs discovery in a fresh process (the order libraries load in is the point), with
the vendors folder (`OCL_ICD_VENDORS`) the test writes: empty is "the loader, no vendor ICD"."""

from __future__ import annotations

import ctypes.util
import glob
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.under_test import child_env

from runtime.engine.backends import opencl_loader
from runtime.engine.backends.opencl_loader import OPENCV_RUNTIME, foreign, plan

WHEEL = Path("/venv/lib/pyopencl/.libs/libOpenCL-5519dec5.so.1.0.0")


@pytest.mark.parametrize("loader, environ, want", [
    (None, {}, {}),  # pyopencl absent, or built against the system's loader: nothing to share
    (WHEEL, {}, {OPENCV_RUNTIME: str(WHEEL)}),
    (WHEEL, {OPENCV_RUNTIME: str(WHEEL)}, {OPENCV_RUNTIME: str(WHEEL)}),  # a parent's setting
    (WHEEL, {OPENCV_RUNTIME: "disabled"}, {}),  # the operator's choice stands
    (WHEEL, {OPENCV_RUNTIME: "/opt/vendor/libOpenCL.so"}, {}),
])
def test_plan(loader, environ, want):
    assert plan(loader, environ) == want


MAPS = [
    "7f00-7f01 r--p 00000000 08:01 12 /usr/lib/x86_64-linux-gnu/libOpenCL.so.1.0.0",
    "7f01-7f02 r-xp 00001000 08:01 12 /usr/lib/x86_64-linux-gnu/libOpenCL.so.1.0.0",
    f"7f02-7f03 r-xp 00001000 08:01 13 {WHEEL}",
    "7f03-7f04 rw-p 00000000 00:00 0 ",
    "7f04-7f05 r-xp 00000000 08:01 14 /usr/lib/x86_64-linux-gnu/libOpenCV.so.4",
]


@pytest.mark.parametrize("loader, want", [
    (WHEEL, ["/usr/lib/x86_64-linux-gnu/libOpenCL.so.1.0.0"]),
    (None, ["/usr/lib/x86_64-linux-gnu/libOpenCL.so.1.0.0", str(WHEEL)]),
])
def test_foreign_loaders_from_maps(loader, want):
    assert foreign(MAPS, loader) == want


# What a fresh process reports: discovery's record of the opencl and opencv engines, what
# OpenCV then says about OpenCL, and pyopencl's platforms (name, version).
REPORT = """
import json
from runtime.config import BackendsConfig
from runtime.engine.backends import survey
found = survey(BackendsConfig(enabled=("opencv", "opencl")))
import cv2
import pyopencl as cl
try:
    platforms = [(p.name, p.version) for p in cl.get_platforms()]
except cl.Error:
    platforms = []
print(json.dumps({
    "engines": {e.name: {"devices": [[d.id, d.details.get("platform", "")] for d in e.devices],
                         "missing": e.missing, "remedy": e.remedy} for e in found.engines},
    "opencv_has_opencl": bool(cv2.ocl.haveOpenCL()),
    "platforms": platforms,
}))
"""
FIRST = {
    "discovery": "",  # the daemon's order: the opencv engine asks first (the issue)
    "cv2 imported first": "import cv2\n",
    "pyopencl imported first": "import pyopencl\n",
    # the system's loader in a library's own scope, as FFmpeg's is inside a GStreamer plugin:
    # it takes none of pyopencl's calls, and nothing is blamed on it
    "system loader loaded locally": "import ctypes, ctypes.util\n"
                                    "name = ctypes.util.find_library('OpenCL')\n"
                                    "lib = name and ctypes.CDLL(name)\n",
}


def _wheel_pocl() -> Path:
    """The pocl wheel's ICD library (in pyopencl's folder), or a skip saying why not."""
    loader = opencl_loader.bundled_loader()
    if loader is None:
        pytest.skip("pyopencl has no bundled ICD loader here (built against the system's)")
    pocl = sorted(loader.parent.glob("libpocl*.so*"))
    if not pocl:
        pytest.skip("no pocl wheel (pocl-binary-distribution: x86_64 wheels only)")
    return pocl[0]


def _shell_env(vendors: Path, **extra: str) -> dict[str, str]:
    """The environment of a process started from a shell, with `vendors` as the ICD folder
    (none of this process's OpenCL settings inherited)."""
    env = {k: v for k, v in child_env(**extra).items()
           if k not in (OPENCV_RUNTIME, "PYOPENCL_HOME", "OCL_ICD_FILENAMES")}
    env["OCL_ICD_VENDORS"] = str(vendors)
    return env


def _no_vendor_icd(tmp_path: Path) -> Path:
    """An empty ICD folder: the system's loader as FFmpeg's package leaves it."""
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    return vendors


def _report(tmp_path: Path, first: str, vendors: Path) -> dict:
    """REPORT in a fresh process started as a shell would start it, after `first`."""
    r = subprocess.run([sys.executable, "-c", first + REPORT], env=_shell_env(vendors),
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


@pytest.mark.parametrize("first", FIRST, ids=list(FIRST))
def test_the_wheels_pocl_is_found_whatever_loads_first(first, tmp_path):
    _wheel_pocl()
    got = _report(tmp_path, FIRST[first], _no_vendor_icd(tmp_path))
    opencl = got["engines"]["opencl"]
    assert opencl["missing"] == "", opencl
    assert [p for _, p in opencl["devices"]] == ["Portable Computing Language"], opencl
    assert len(got["platforms"]) == 1, got["platforms"]  # listed once, not once per loader
    assert got["engines"]["opencv"]["missing"] == ""
    assert got["opencv_has_opencl"], "OpenCV sees another OpenCL than pyopencl"


def _system_icds() -> list[Path]:
    """Real ICD libraries other than the wheel's: Debian's pocl, and whatever
    /etc/OpenCL/vendors names (a GPU vendor's)."""
    found = [Path(p) for p in sorted(glob.glob("/usr/lib/*/libpocl.so.2*"))][:1]
    for icd in sorted(Path("/etc/OpenCL/vendors").glob("*.icd")):
        lib = icd.read_text().strip()
        path = Path(lib) if lib.startswith("/") else ctypes.util.find_library(
            lib.removeprefix("lib").split(".so")[0])
        if path and Path(path).exists() and Path(path) not in found:
            found.append(Path(path))
    return found


def test_a_system_icd_beside_the_wheel_adds_its_devices(tmp_path):
    _wheel_pocl()
    icds = _system_icds()
    if not icds:
        pytest.skip("no system OpenCL ICD here (Debian's pocl-opencl-icd, or a vendor's in "
                    "/etc/OpenCL/vendors): `apt install pocl-opencl-icd` runs this case")
    vendors = tmp_path / "vendors"
    vendors.mkdir()
    for i, lib in enumerate(icds):
        (vendors / f"system-{i}.icd").write_text(f"{lib}\n")
    for first in FIRST.values():
        got = _report(tmp_path, first, vendors)
        opencl = got["engines"]["opencl"]
        # the wheel's platform and each system ICD's: one device at least each (a CPU driver
        # that cannot build kernels still lists its device; tests skip it per device)
        assert len(got["platforms"]) == 1 + len(icds), (first, got["platforms"])
        assert len(opencl["devices"]) >= 1 + len(icds), (first, opencl)
        assert got["opencv_has_opencl"]


def test_opencv_asked_before_edgerun_is_reported_with_what_to_do(tmp_path):
    """What cannot be mended in-process (OpenCV asked first, and the system's loader holds
    every OpenCL call from then on) is named, not silent."""
    _wheel_pocl()
    if not ctypes.util.find_library("OpenCL"):
        pytest.skip("no system OpenCL loader (ocl-icd-libopencl1): OpenCV finds none to load")
    got = _report(tmp_path, "import cv2\ncv2.ocl.haveOpenCL()\n", _no_vendor_icd(tmp_path))
    opencl = got["engines"]["opencl"]
    assert opencl["missing"].startswith("no device: pyopencl's calls went to "), opencl
    assert "libOpenCL.so" in opencl["missing"] and "before" in opencl["missing"]
    assert "pocl-binary-distribution" in opencl["remedy"]


def test_a_missing_engine_says_why_and_what_to_do(tmp_path):
    """Discovery's record for an engine whose library is absent, and the `check` lines."""
    from runtime.config import BackendsConfig
    from runtime.engine.backends import survey

    found = survey(BackendsConfig(enabled=("onnxruntime",), plugins=("no_such_sdk:Backend",)))
    by = {e.name: e for e in found.engines}
    assert by["onnxruntime"].found and by["onnxruntime"].devices
    plugin = by["no_such_sdk:Backend"]
    assert not plugin.found and plugin.missing.startswith("library absent: ")
    assert "no_such_sdk" in plugin.missing and "[backends] plugins" in plugin.remedy
    assert [b.name for b in found.backends] == ["onnxruntime"]


def test_check_lists_engines_and_devices(tmp_path):
    """`edgerun check`, started from a shell on a box with the loader and no vendor ICD: every
    engine found with its devices (OpenCL: whether each builds the kernels), each missing
    one with why and what to do."""
    pocl = _has_wheel_pocl()
    cfg = tmp_path / "edgerun.toml"
    cfg.write_text('[backends]\nenabled = ["onnxruntime", "opencl"]\n'
                   'plugins = ["no_such_sdk:Backend"]\n[governor]\npolicy = "off"\n')
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(cfg)],
                       env=_shell_env(_no_vendor_icd(tmp_path)), cwd=tmp_path,
                       capture_output=True, text=True, timeout=180)
    err = r.stderr
    names = "onnxruntime, opencl" if pocl else "onnxruntime"
    assert f"engines: {len(names.split(', '))} of 3 found: {names}" in err, err
    assert "onnxruntime: CPU (" in err
    if pocl:  # the wheel's device: it builds the kernels, or is refused naming why
        assert "opencl: CPU.0 (pthread-" in err or "opencl: CPU.0 REFUSED: device CPU.0" in err
    assert "no_such_sdk:Backend: MISSING: library absent: ModuleNotFoundError" in err
    assert "  what to do: check the plugin's" in err


def _has_wheel_pocl() -> bool:
    loader = opencl_loader.bundled_loader()
    return loader is not None and any(loader.parent.glob("libpocl*.so*"))


PROFILER = ('[profiler]\nwarmup_runs = 1\nmin_runs = 3\nmax_runs = 10\ntime_budget_s = 0.02\n'
            'idle_baseline_s = 0.05\n[backends.opencv]\nengines = ["new"]\n')


def test_profile_reports_engines_and_profiles_opencl(tmp_path):
    """`edgerun profile --json` from a shell on such a box: the opencl engine and its device
    are found (after OpenCV's), its variants measured or refused naming the device."""
    _wheel_pocl()
    cfg = tmp_path / "fast.toml"
    cfg.write_text(PROFILER)
    env = _shell_env(_no_vendor_icd(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "profile", "inspection",
                        "--config", str(cfg), "--engine", "opencv", "--engine", "opencl",
                        "--threads", "1", "--latency-ms", "1000", "--json"], env=env,
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    engines = {e["name"]: e for e in doc["engines"]}
    assert engines["opencl"]["missing"] is None and "CPU.0" in engines["opencl"]["devices"]
    assert engines["opencv"]["missing"] is None
    ran = {v["status"] for v in doc["variants"] if v["engine"] == "opencl"}
    assert ran and ran <= {"ok", "refused"}, doc["variants"]
