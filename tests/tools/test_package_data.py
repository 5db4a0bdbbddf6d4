"""What ships is what was tested (issue 22, item 6): the wheel holds every file the code opens
from its own packages (OpenCL kernels, dashboard files, bundled models, device profiles, the
example config), and a CI run imports the installed wheel, not this checkout.

The wheel is built here (`pip wheel --no-deps`, tests/support/wheel_build.py). Two checks: every
module and data file of the package tree is in it (a file pyproject's package-data misses, a
folder without __init__.py), and the code, imported from the unpacked wheel alone, finds each
file it opens through its own paths (a path the code builds that the tree does not match)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from support.under_test import INSTALLED, ROOT, child_env
from support.wheel_build import build_wheel

PACKAGES = ("runtime", "power", "firmware_config", "models")
# Files in the package tree that are for readers of the checkout, not for the code.
NOT_SHIPPED = {"models/README.md"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """This checkout as a wheel."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def _tree_files(src: Path) -> set[str]:
    """Every file of the product packages in the clean copy the wheel was built from (git's
    files, tracked or new: tests/support/wheel_build.py)."""
    return {str(p.relative_to(src)) for pkg in PACKAGES for p in (src / pkg).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and ".egg-info" not in str(p)}


def test_the_wheel_holds_every_module_and_data_file(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_tree_files(wheel.parent / "src") - NOT_SHIPPED - names)
    assert not missing, (f"{wheel.name} leaves out {missing}: add them to "
                         "[tool.setuptools.package-data] in pyproject.toml (or an __init__.py "
                         "to a package folder)")
    assert not NOT_SHIPPED & names


# Run with only the unpacked wheel importable as edgerun (no checkout on sys.path): opens each
# file the way the code does and says which one is missing.
_OPENS = r"""
import re, sys
from importlib import resources
from pathlib import Path

import models, runtime
assert runtime.__file__.startswith(sys.argv[1]), runtime.__file__

# dashboard: the page and every file it references, through the server's own lookup
from runtime.coordinator import dashboard
page = dashboard.static_file("/")
assert page, "dashboard index.html"
refs = re.findall(r'(?:src|href)="(/static/[^"]+)"', page[0].decode())
assert refs, "index.html references no /static/ file"
for ref in [*refs, "/static/vendor/uplot/LICENSE", "/static/vendor/uplot/VERSION"]:
    assert dashboard.static_file(ref), ref

# device profiles: every bundled one loads by name, the default one included
from runtime.device.profiles import load_profile
from runtime.config import DeviceConfig, load
names = sorted(p.name.removesuffix(".toml")
               for p in (resources.files("firmware_config") / "devices").iterdir()
               if p.name.endswith(".toml"))
assert DeviceConfig().profile in names, names
for name in names:
    load_profile(name)
# the example config the installer starts from is a valid config
load(Path(str(resources.files("firmware_config") / "examples" / "edgerun.toml")))

# bundled models: every variant verifies (file there, sha256 matches); the demo's replayed
# profiles read
from runtime.choice.measure import recorded_profiles
from runtime.engine.manifest import load_manifest, model_files
bundled = [d for d in models.ROOT.iterdir() if (d / "manifest.json").is_file()]
assert {d.name for d in bundled} >= {"inspection", "defects"}, bundled
for d in bundled:
    assert model_files(load_manifest(d)), d
assert recorded_profiles(models.bundled() / "reference-profiles.json")

# OpenCL kernels: compiled where a driver is installed, else the file the backend names
from runtime.engine.backends import opencl
src = Path(opencl.__file__).read_text()
for name in re.findall(r'with_name\("([^"]+)"\)', src):
    assert Path(opencl.__file__).with_name(name).is_file(), name
# (read from the wheel and built on each device; a device whose driver refuses every kernel,
# pip's pocl on a CPU it does not know, is the device's fault, not the wheel's)
backend = opencl.OpenClBackend()
refused = backend.probe()
print("opencl: kernels built on", [d.id for d in backend.devices() if d.id not in refused],
      "refused by", refused)
print("ok")
"""


def test_the_code_finds_its_files_in_the_unpacked_wheel(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}
    r = subprocess.run([sys.executable, "-c", _OPENS, str(site)], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


@pytest.mark.skipif(not INSTALLED, reason="CI's wheel run only (.ci/run sets "
                    "EDGERUN_TEST_INSTALLED=1); a checkout run tests the checkout")
def test_ci_imports_the_installed_wheel_not_the_checkout():
    import runtime

    purelib = Path(sysconfig.get_paths()["purelib"]).resolve()
    assert Path(runtime.__file__).resolve().is_relative_to(purelib), runtime.__file__
    assert not Path(runtime.__file__).resolve().is_relative_to(ROOT / "runtime"), runtime.__file__
    # ... and so do the tests' subprocesses started from the checkout
    r = subprocess.run([sys.executable, "-c", "import runtime; print(runtime.__file__)"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT, env=child_env())
    assert r.returncode == 0 and Path(r.stdout.strip()).resolve().is_relative_to(purelib), (
        r.stdout + r.stderr)
