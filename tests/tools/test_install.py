"""The service install path (issue 14, item 7): a venv under /opt/edgerun made by
`python3 -m runtime.tools.install`, units whose ExecStart is that venv's script and that pass
`systemd-analyze verify`, the edgerun user, /etc/edgerun; idempotent; never the system pip.

The fast version installs a wheel of this checkout with --no-index (offline, ~30 s) into a
venv in a temp root that sees the test environment's dependencies (a .pth file: works from a
venv, where --system-site-packages would see the base interpreter's packages instead); the
slow one installs from the checkout with pip's build isolation and the index, as an operator
would."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from support.wheel_build import build_wheel

from runtime.tools import install

# The module's venv and install (its fixtures) land on whichever test first asks for them:
# 36 s of setup on a loaded 2-core box (docs/testing-timing.md)
pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
EXE = "/opt/edgerun/venv/bin/edgerun"
needs_systemd = pytest.mark.skipif(
    not (shutil.which("systemd-sysusers") and shutil.which("systemd-tmpfiles")),
    reason="systemd-sysusers/-tmpfiles are not installed (.ci/run installs systemd)")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to the edgerun group needs root")


def _install(root: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "runtime.tools.install", "--root", str(root),
                           *args],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def _gid(root: Path, name: str) -> int:
    for line in (root / "etc/group").read_text().splitlines():
        if line.split(":")[0] == name:
            return int(line.split(":")[2])
    raise AssertionError(f"no group {name}")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """This checkout as a wheel (offline where the environment has the build requirements:
    tests/support/wheel_build.py)."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def _dependency_dirs() -> list[str]:
    """Where this test run imports its dependencies from: every site directory on sys.path
    (a venv's site-packages, or the system's dist-packages), not the checkout."""
    dirs = []
    for entry in sys.path:
        p = Path(entry or ".").resolve()
        if p.is_dir() and p.name in ("site-packages", "dist-packages") and str(p) not in dirs:
            dirs.append(str(p))
    return dirs


def _venv_seeing_our_dependencies(root: Path) -> None:
    """The target's venv made up front (the installer keeps a working one), with a .pth that
    appends this run's site directories: pip then finds the dependencies installed and
    needs no index; edgerun itself goes into the venv's own site-packages, which come first."""
    venv = root / "opt/edgerun/venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True,
                   timeout=300)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "edgerun-test-deps.pth").write_text("".join(d + "\n" for d in _dependency_dirs()))


@pytest.fixture(scope="module")
def installed(tmp_path_factory, wheel) -> tuple[Path, subprocess.CompletedProcess]:
    """One install into a temp root, shared by the tests below (a venv takes ~20 s)."""
    if not (shutil.which("systemd-sysusers") and shutil.which("systemd-tmpfiles")):
        pytest.skip("systemd-sysusers/-tmpfiles are not installed")
    if os.geteuid() != 0:
        pytest.skip("chown to the edgerun group needs root")
    root = tmp_path_factory.mktemp("root")
    # the machine says it is a Pi 4 (as its device tree does): the config names that profile
    (root / "proc/device-tree").mkdir(parents=True)
    (root / "proc/device-tree/model").write_bytes(b"Raspberry Pi 4 Model B Rev 1.4\0")
    _venv_seeing_our_dependencies(root)
    out = _install(root, "--source", str(wheel), "--pip-arg=--no-index")
    assert out.returncode == 0, out.stdout + out.stderr
    return root, out


def test_the_venv_runs_this_checkouts_edgerun(installed):
    root, _ = installed
    exe = root / EXE.lstrip("/")
    assert os.access(exe, os.X_OK)
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert out.returncode == 0 and out.stdout.strip().startswith("edgerun "), out.stderr
    where = subprocess.run([str(root / "opt/edgerun/venv/bin/python"), "-c",
                            "import runtime.tools.install as m; print(m.__file__)"],
                           capture_output=True, text=True, timeout=60, cwd="/",
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert where.stdout.startswith(str(root / "opt/edgerun/venv/lib")), where.stdout
    link = root / "usr/local/bin/edgerun"
    assert link.is_symlink() and os.readlink(link) == EXE


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze missing")
@pytest.mark.parametrize("unit", install.UNITS)
def test_rendered_unit_runs_the_venv_and_verifies(installed, unit, tmp_path):
    root, _ = installed
    text = (root / "etc/systemd/system" / unit).read_text()
    execs = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    assert len(execs) == 1 and execs[0].startswith(f"ExecStart={EXE} ")
    docs = [u for line in text.splitlines() if line.startswith("Documentation=")
            for u in line.split("=", 1)[1].split()]
    assert docs and all(u.startswith("file:///opt/edgerun/doc/") for u in docs), docs
    for u in docs:  # every page the unit names was installed
        assert (root / u.removeprefix("file:///")).is_file(), u
    # verify checks that ExecStart is an executable: on this host the target's /opt is
    # under the temp root, so that one path is mapped there (everything else as rendered).
    (tmp_path / unit).write_text(text.replace(EXE, str(root / EXE.lstrip("/"))))
    out = subprocess.run(["systemd-analyze", "verify", str(tmp_path / unit)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and unit not in out.stdout + out.stderr, out.stdout + out.stderr


def test_user_config_dir_and_config(installed):
    from runtime import config as config_mod

    root, _ = installed
    passwd = (root / "etc/passwd").read_text().splitlines()
    user = next(p for p in passwd if p.startswith("edgerun:"))
    assert user.split(":")[5] == "/var/lib/edgerun"
    members = {line.split(":")[0]: line.split(":")[3]
               for line in (root / "etc/group").read_text().splitlines()}
    assert "edgerun" in members["video"] and "edgerun" in members["render"]
    gid = _gid(root, "edgerun")
    etc = (root / "etc/edgerun").stat()
    assert (stat.S_IMODE(etc.st_mode), etc.st_uid, etc.st_gid) == (0o750, 0, gid)
    cfg_file = root / "etc/edgerun/edgerun.toml"
    st = cfg_file.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 0, gid)
    cfg = config_mod.load(cfg_file)  # valid, and pointed at the unit's directories
    assert cfg.device.profile == "rpi4"  # what the (fake) device tree says
    _, out = installed
    assert "device profile: rpi4 (the device tree says 'Raspberry Pi 4 Model B Rev 1.4')" in (
        out.stdout)
    assert cfg.daemon.state_dir == "/var/lib/edgerun"
    assert cfg.telemetry.outbox.path == "/var/lib/edgerun/outbox.db"
    assert cfg.profiler.cache_dir == "/var/cache/edgerun/profiles"
    unit = (root / "etc/systemd/system/edgerun.service").read_text()
    assert "StateDirectory=edgerun\n" in unit and "CacheDirectory=edgerun\n" in unit


def test_rerun_changes_nothing_and_keeps_the_operators_config(installed, wheel):
    root, _ = installed
    cfg = root / "etc/edgerun/edgerun.toml"
    cfg.write_text(cfg.read_text() + "# the operator's edit\n")
    units = {u: (root / "etc/systemd/system" / u).read_text() for u in install.UNITS}
    out = _install(root, "--source", str(wheel), "--pip-arg=--no-index", "--enable",
                   "--without", "opencl")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "(already there)" in out.stdout and "(kept as it is)" in out.stdout
    # the requirements named one by one, the engine left out removed from the venv (here it
    # is the system's, which pip leaves alone: outside the environment)
    assert "left out: opencl (pyopencl, pocl-binary-distribution, pytools, siphash24)" in out.stdout
    assert "wrote " not in out.stdout  # no unit, sysusers or tmpfiles file rewritten
    assert "has device profile" not in out.stdout  # the kept config's is this machine's
    assert cfg.read_text().endswith("# the operator's edit\n")
    assert {u: (root / "etc/systemd/system" / u).read_text() for u in install.UNITS} == units
    passwd = (root / "etc/passwd").read_text()
    assert [line.split(":")[0] for line in passwd.splitlines()].count("edgerun") == 1
    # --enable under a root: systemctl --root enables offline (no running systemd needed)
    wants = root / "etc/systemd/system/multi-user.target.wants/edgerun.service"
    assert wants.is_symlink() and os.readlink(wants) == "/etc/systemd/system/edgerun.service"


def test_install_module_needs_only_the_standard_library():
    """It runs with Debian's bare python3 before anything is installed (-S: no site-packages)."""
    out = subprocess.run([sys.executable, "-S", "-c", "import runtime.tools.install"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr


def test_shipped_units_name_the_venv_and_the_example_config_renders():
    for unit in install.UNITS:
        text = (ROOT / "systemd" / unit).read_text()
        assert f"ExecStart={install.SHIPPED_EXE} " in text
        rendered = install.render_unit(text, "/srv/e/venv/bin/edgerun", "/srv/e")
        assert "ExecStart=/srv/e/venv/bin/edgerun " in rendered
        assert "Documentation=file:///srv/e/doc/README.md " in rendered
        for u in rendered.split("Documentation=", 1)[1].splitlines()[0].split():
            assert (ROOT / u.removeprefix("file:///srv/e/doc/")).is_file(), u
    text = install.render_config((ROOT / "firmware_config/examples/edgerun.toml").read_text())
    assert "~" not in "".join(line for line in text.splitlines()
                              if line.startswith(("state_dir", "cache_dir", "path")))
    with pytest.raises(install.InstallError):
        install.render_unit("[Service]\nExecStart=/usr/bin/edgerun serve\n", "/x")


def test_without_an_engine_drops_only_what_it_needs():
    reqs = install.requirements(ROOT, ("demo",), ("openvino", "opencl"))
    names = {install._dist_name(r) for r in reqs}
    assert not names & {"openvino", "pyopencl", "pocl-binary-distribution"}
    assert {"onnxruntime", "opencv-python-headless", "numpy", "amqtt"} <= names
    assert install.requirements(ROOT, (), ()) == __import__("tomllib").loads(
        (ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    example = (ROOT / "firmware_config/examples/edgerun.toml").read_text()
    text = install.render_config(example, ("openvino",))
    assert 'enabled = ["onnxruntime", "opencv"]' in text
    assert "enabled = false" in text  # [simulator]'s flag untouched
    with pytest.raises(install.InstallError, match="pyproject.toml"):
        install.requirements(ROOT / "docs", (), ("openvino",))
    with pytest.raises(install.InstallError, match="neither"):
        install.requirements(Path("edgerun==0.1.0"), (), ("openvino",))
    with pytest.raises(SystemExit):
        install.main(["--root", "/tmp/x", "--without", "onnxruntime"])  # not optional


def _norm(reqs: list[str]) -> list[str]:
    return sorted(str(Requirement(r)) for r in reqs)


def test_a_wheels_requirements_are_the_checkouts(wheel):
    """--without works from a wheel too (an offline install): its Requires-Dist, extras'
    clauses taken off, are pyproject's requirements."""
    for extras in ((), ("demo",), ("demo", "test")):
        for without in ((), ("openvino",), ("openvino", "opencl")):
            got = install.requirements(wheel, extras, without)
            want = install.requirements(ROOT, extras, without)
            # packaging's form: the wheel writes a requirement's specifiers sorted (<5,>=4.10)
            assert _norm(got) == _norm(want), (extras, without)


@pytest.mark.parametrize(("model", "dmi", "want"), [
    ("Raspberry Pi 5 Model B Rev 1.0", {}, "rpi5"),
    ("Raspberry Pi Compute Module 5 Rev 1.0", {}, "rpi5"),
    ("Raspberry Pi 4 Model B Rev 1.4", {}, "rpi4"),
    ("Raspberry Pi 400 Rev 1.0", {}, "rpi4"),
    ("Raspberry Pi Compute Module 4 Rev 1.0", {}, "rpi4"),
    ("NVIDIA Jetson Orin Nano Developer Kit", {}, "jetson-orin-nano"),
    ("NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super", {}, "jetson-orin-nano"),
    ("Raspberry Pi 3 Model B Plus Rev 1.3", {}, "generic-x86"),  # no profile: the fallback
    ("Raspberry Pi 40 Rev 1.0", {}, "generic-x86"),  # a word boundary, not a prefix
    (None, {"sys_vendor": "Intel(R) Client Systems", "product_name": "NUC11TNHi5"},
     "generic-x86"),
    (None, {}, "generic-x86"),
])
def test_pick_profile_from_what_the_machine_says(model, dmi, want):
    got, why = install.pick_profile(model, dmi)
    assert got == want
    assert got in install.bundled_profiles()
    if model and got != install.FALLBACK_PROFILE:
        assert model in why
    elif dmi:
        assert "NUC11TNHi5" in why and "a PC" in why
    else:
        assert "check it" in why  # a guess says so


def test_every_board_profile_is_bundled():
    assert {p for _, p in install.BOARD_PROFILES} | {install.FALLBACK_PROFILE} <= set(
        install.bundled_profiles())


def test_machine_profile_reads_under_the_root(tmp_path):
    o = install.Options(root=tmp_path, log=lambda _: None)
    assert install.machine_profile(o)[0] == "generic-x86"  # nothing there: the fallback
    dmi = tmp_path / "sys/class/dmi/id"
    dmi.mkdir(parents=True)
    (dmi / "sys_vendor").write_text("LENOVO\n")
    (dmi / "product_name").write_bytes(b"\xff\x1b[31m20XW\n")  # hostile bytes: dropped
    profile, why = install.machine_profile(o)
    assert profile == "generic-x86" and "LENOVO" in why and "\x1b" not in why
    (tmp_path / "proc/device-tree").mkdir(parents=True)  # a device tree wins over DMI
    (tmp_path / "proc/device-tree/model").write_bytes(b"Raspberry Pi 5 Model B Rev 1.0\0")
    assert install.machine_profile(o) == ("rpi5", "the device tree says "
                                          "'Raspberry Pi 5 Model B Rev 1.0'")


def test_set_profile_writes_a_loadable_config(tmp_path):
    from runtime import config as config_mod

    example = (ROOT / "firmware_config/examples/edgerun.toml").read_text()
    assert install.config_profile(example) == "generic-x86"
    text = install.set_profile(install.render_config(example), "rpi4")
    assert install.config_profile(text) == "rpi4"
    assert text.count("\n") == example.count("\n")  # one value changed, nothing else
    (tmp_path / "e.toml").write_text(text)
    assert config_mod.load(tmp_path / "e.toml").device.profile == "rpi4"
    with pytest.raises(install.InstallError, match="profile"):
        install.set_profile("[model]\npath = ''\n", "rpi4")
    for bad in ("no-such-board", 'x".toml', "a\nb.toml"):
        with pytest.raises(SystemExit):
            install.main(["--root", str(tmp_path), "--profile", bad])


def test_extras_go_where_pip_reads_them(tmp_path):
    wheel = tmp_path / "edgerun-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    assert install.with_extras(str(tmp_path), ("demo",)) == f"{tmp_path}[demo]"
    assert install.with_extras(str(wheel), ("demo", "x")) == f"{wheel}[demo,x]"
    assert install.with_extras("edgerun==0.1.0", ("demo",)) == "edgerun[demo]==0.1.0"
    assert install.with_extras("edgerun", ()) == "edgerun"


def test_a_kept_config_is_not_changed_but_a_profile_mismatch_is_said(tmp_path):
    example = ROOT / "firmware_config/examples/edgerun.toml"
    dest = tmp_path / "etc/edgerun/edgerun.toml"
    dest.parent.mkdir(parents=True)
    dest.write_text(example.read_text())  # the operator's, naming generic-x86
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "proc/device-tree/model").write_bytes(b"Raspberry Pi 5 Model B Rev 1.0\0")
    for profile, says in (("", "looks like 'rpi5' (the device tree says"),
                          ("rpi4", "--profile rpi4 is not applied to a kept config")):
        said: list[str] = []
        install.install_config(install.Options(root=tmp_path, log=said.append,
                                               profile=profile), example)
        assert dest.read_text() == example.read_text()
        assert any("has device profile 'generic-x86'" in x and says in x for x in said), said
    dest.write_text(install.set_profile(example.read_text(), "rpi5"))
    said = []
    install.install_config(install.Options(root=tmp_path, log=said.append), example)
    assert not any("device profile" in x for x in said), said  # it matches: nothing to say


def test_link_leaves_a_foreign_edgerun_alone(tmp_path):
    said = []
    o = install.Options(root=tmp_path, log=said.append)
    foreign = tmp_path / "usr/local/bin/edgerun"
    foreign.parent.mkdir(parents=True)
    foreign.write_text("#!/usr/bin/python3\n# an old sudo pip install\n")
    install.link_exe(o)
    assert not foreign.is_symlink() and "old sudo pip" in foreign.read_text()
    assert said and "left as it is" in said[0]
    foreign.unlink()
    foreign.symlink_to("/opt/old-prefix/venv/bin/edgerun")  # our link, an earlier prefix
    install.link_exe(o)
    assert os.readlink(foreign) == EXE


def test_refuses_without_root_on_the_live_system():
    if os.geteuid() == 0:
        pytest.skip("running as root")
    assert install.main([]) == 2


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("EDGERUN_SLOW"),
                    reason="downloads ~750 MB of wheels: set EDGERUN_SLOW=1")
@needs_systemd
@needs_root
def test_full_install_from_the_checkout(tmp_path):
    """As an operator runs it: the checkout, pip's build isolation and the index, no system
    site-packages. Every engine imports from the venv; the demo-only broker is not there."""
    out = _install(tmp_path, timeout=1800)
    assert out.returncode == 0, out.stdout + out.stderr
    py = tmp_path / "opt/edgerun/venv/bin/python"
    check = ("import importlib.util as u, onnxruntime, openvino, cv2, pyopencl, "
             "paho.mqtt, jsonschema, cryptography, prometheus_client; "
             "assert u.find_spec('amqtt') is None")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([str(py), "-c", check], capture_output=True, text=True, timeout=300,
                       cwd="/", env=env)
    assert r.returncode == 0, r.stderr
    full = _venv_bytes(tmp_path / "opt/edgerun/venv")
    # Leaving OpenVINO and OpenCL out, on the same venv: gone from it, the rest still runs.
    out = _install(tmp_path, "--without", "openvino,opencl", timeout=1800)
    assert out.returncode == 0, out.stdout + out.stderr
    check = ("import importlib.util as u, onnxruntime, cv2; "
             "assert not any(u.find_spec(m) for m in ('openvino', 'pyopencl'))")
    r = subprocess.run([str(py), "-c", check], capture_output=True, text=True, timeout=300,
                       cwd="/", env=env)
    assert r.returncode == 0, r.stderr
    slim = _venv_bytes(tmp_path / "opt/edgerun/venv")
    print(f"venv: {full / 1e6:.0f} MB full, {slim / 1e6:.0f} MB without openvino and opencl")
    assert full - slim > 150e6  # openvino alone is ~185 MB


def _venv_bytes(venv: Path) -> int:
    return sum(p.stat().st_size for p in venv.rglob("*") if p.is_file() and not p.is_symlink())


def _wheels_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("ci_wheels", ROOT / ".ci" / "wheels.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_aarch64_check_evaluates_our_markers_for_the_target(tmp_path):
    """pip judges markers by the host, so the CI check evaluates ours for the target: pocl's
    wheel (x86_64 only) is left out on aarch64, kept on x86_64, and every other runtime
    dependency is asked for on both."""
    w = _wheels_module()
    pi = w.TARGETS[0]
    assert pi.machine == "aarch64" and pi.glibc == (2, 36) and pi.python == "3.11"
    tags = pi.platforms()
    assert "manylinux_2_17_aarch64" in tags and "manylinux_2_36_aarch64" in tags
    assert "manylinux_2_37_aarch64" not in tags and not any("x86_64" in t for t in tags)
    names = {Requirement(r).name for r in w.requirements(pi)}
    assert "pocl-binary-distribution" not in names and "amqtt" not in names
    assert {"onnxruntime", "openvino", "pyopencl", "opencv-python-headless"} <= names
    x86 = w.Target("x86", "x86_64", (2, 36), "3.11")
    assert "pocl-binary-distribution" in {Requirement(r).name for r in w.requirements(x86)}
    assert all(";" not in r for r in w.requirements(pi))  # markers settled, not left to pip
