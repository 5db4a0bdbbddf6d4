"""Install edgerun as a service on Debian 12 / Raspberry Pi OS: a venv under /opt, the units
pointing at it, the service user, /etc/edgerun. Idempotent; never touches the system pip.

Run from a checkout with the system Python (standard library only, so it works before
anything is installed):

    sudo python3 -m runtime.tools.install            # or: sudo systemd/install.sh
    sudo python3 -m runtime.tools.install --enable   # ... and start the daemon

Debian 12 marks its Python "externally managed" (PEP 668): `sudo pip install .` is refused,
and where it is forced it lands in /usr/local/bin. Here everything pip does happens inside
PREFIX/venv, so the unit's ExecStart is one stable path: PREFIX/venv/bin/edgerun.

`--root DIR` writes every file under DIR while the paths written into the files stay as the
target sees them, and uses systemctl only offline (--root). It is for tests: the venv's
scripts name their interpreter by its path under DIR, so the tree is not relocatable.
Steps (each safe to repeat): venv -> pip install -> /usr/local/bin/edgerun symlink -> units,
sysusers and tmpfiles -> service user -> /etc/edgerun/edgerun.toml (only if absent; its
device profile picked from what the machine says it is, or --profile) -> daemon-reload
(-> enable --now).
"""

from __future__ import annotations

import argparse
import grp
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from runtime.durable import write_atomic

SOURCE = Path(__file__).resolve().parents[2]  # the checkout this module runs from
UNITS = ("edgerun.service", "edgerun-coordinator.service")
# The path the shipped units name; rendered to PREFIX/venv/bin/edgerun for another prefix.
SHIPPED_EXE = "/opt/edgerun/venv/bin/edgerun"
DEFAULT_PREFIX = "/opt/edgerun"
SHIPPED_DOC = "file:///opt/edgerun/doc/"  # the units' Documentation=, rendered like ExecStart
# The example config's per-user paths, and where the unit's StateDirectory/CacheDirectory
# put them (the service's HOME is /var/lib/edgerun, so `~` would land there too; spelled out
# so an operator reading /etc/edgerun/edgerun.toml sees the real place).
SERVICE_PATHS = (
    # [profiler]'s (empty there: the user's cache); [backends.openvino]'s has no comment
    ('cache_dir = ""                 # empty = the user\'s cache',
     'cache_dir = "/var/cache/edgerun/profiles"  # empty = the user\'s cache'),
    ('state_dir = "~/.local/state/edgerun"', 'state_dir = "/var/lib/edgerun"'),
    ('path = "~/.local/state/edgerun/outbox.db"', 'path = "/var/lib/edgerun/outbox.db"'),
)


# Engines a device can go without (each backend disables itself when its library is missing):
# engine -> the distributions only it needs (our requirement first, then what only it pulls
# in), and its import package. docs/install.md has their sizes.
OPTIONAL_ENGINES = {"openvino": ("openvino", "openvino-telemetry"),
                    "opencl": ("pyopencl", "pocl-binary-distribution", "pytools", "siphash24")}
_ENGINE_PACKAGE = {"openvino": "openvino", "opencl": "pyopencl"}


# `enabled = [...]` of the [backends] section (the first key after its header).
_ENABLED = re.compile(r"^\[backends\]\s*\n(?:[^\[\n].*\n|\n)*?enabled = \[(.*)\]", re.M)
# `profile = "..."` of the [device] section.
_PROFILE = re.compile(r'^(\[device\]\s*\n(?:[^\[\n].*\n|\n)*?profile = )"([^"]*)"', re.M)

# What a board's device tree calls it (/proc/device-tree/model, NUL-terminated) -> the bundled
# profile (firmware_config/devices/) for it; the first match wins. The strings are the boards'
# own: "Raspberry Pi 5 Model B Rev 1.0", "Raspberry Pi 4 Model B Rev 1.4", "Raspberry Pi 400
# Rev 1.0", "Raspberry Pi Compute Module 4 Rev 1.0", "NVIDIA Jetson Orin Nano Developer Kit".
BOARD_PROFILES = (
    (re.compile(r"^Raspberry Pi (5|Compute Module 5)\b"), "rpi5"),
    (re.compile(r"^Raspberry Pi (4|400|Compute Module 4)\b"), "rpi4"),
    (re.compile(r"\bJetson Orin Nano\b"), "jetson-orin-nano"),
)
FALLBACK_PROFILE = "generic-x86"  # the example config's, and what a PC (DMI) gets
DMI_KEYS = ("sys_vendor", "product_name", "board_name")


class InstallError(RuntimeError):
    """A step failed; the message says which and what to do."""


@dataclass
class Options:
    """What to install where (every path on the target, i.e. without `root`)."""

    root: Path = Path("/")
    prefix: str = DEFAULT_PREFIX
    source: str = str(SOURCE)  # a checkout, a wheel, or a requirement such as "edgerun==0.1"
    extras: tuple[str, ...] = ()
    system_site_packages: bool = False
    pip_args: tuple[str, ...] = ()
    python: str = sys.executable
    enable: bool = False
    without: tuple[str, ...] = ()  # keys of OPTIONAL_ENGINES not to install
    link: bool = True  # /usr/local/bin/edgerun -> the venv's, for operators' shells
    profile: str = ""  # the device profile to write; empty: picked from the machine
    log: Callable[[str], None] = field(default=print)

    def at(self, path: str | Path) -> Path:
        """`path` (absolute, as the target sees it) under the install root."""
        return self.root / str(path).lstrip("/")

    @property
    def venv(self) -> str:
        """The venv's path on the target."""
        return f"{self.prefix.rstrip('/')}/venv"

    @property
    def exe(self) -> str:
        """The console script the units run, on the target."""
        return f"{self.venv}/bin/edgerun"


def _run(cmd: Sequence[str], what: str, hint: str = "") -> None:
    """Run `cmd`; a failure is an InstallError naming the step, its output and `hint`."""
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True)
    except OSError as e:
        raise InstallError(f"{what}: cannot run {cmd[0]}: {e.strerror}. {hint}".strip()) from e
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip()[-2000:]
        raise InstallError(f"{what} failed (exit {out.returncode}): {' '.join(cmd)}\n{tail}"
                           + (f"\n{hint}" if hint else ""))


def make_venv(o: Options) -> Path:
    """Create PREFIX/venv unless a working one is there; returns its python."""
    venv = o.at(o.venv)
    python = venv / "bin" / "python"
    if python.exists():
        try:
            subprocess.run([str(python), "-c", "import pip"], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            pass  # half-made (interrupted, or python upgraded under it): make it again
        else:
            o.log(f"venv: {venv} (already there)")
            return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    cmd = [o.python, "-m", "venv", "--clear"]
    if o.system_site_packages:
        cmd.append("--system-site-packages")
    _run([*cmd, str(venv)], "creating the venv",
         "On Debian / Raspberry Pi OS: sudo apt install python3-venv")
    o.log(f"venv: {venv} (created)")
    return python


def with_extras(source: str, extras: Sequence[str]) -> str:
    """`source` asking for `extras`: `DIR[demo]`, `x.whl[demo]`, `edgerun[demo]==0.1.0`."""
    if not extras:
        return source
    tag = "[" + ",".join(extras) + "]"
    if Path(source).exists():
        return source + tag
    m = re.match(r"([A-Za-z0-9._-]+)(.*)", source)
    return m.group(1) + tag + m.group(2) if m else source + tag


def pip_install(o: Options, python: Path) -> None:
    """Install (or upgrade to) the source, with its extras, into the venv: the venv's own pip,
    never the system's."""
    target = with_extras(o.source, o.extras)
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", *o.pip_args]
    # Dependencies: installed or upgraded only where the venv's do not satisfy the source.
    if o.without:  # the source's requirements minus the engines left out, named one by one
        _run([*pip, "--upgrade", *requirements(Path(o.source), o.extras, o.without)],
             "pip install of the dependencies into the venv")
    else:
        _run([*pip, "--upgrade", target], "pip install into the venv")
    # edgerun itself always: a checkout's code changes without its version number changing,
    # and pip would call the venv's copy "already satisfied".
    _run([*pip, "--force-reinstall", "--no-deps", o.source], "pip install of edgerun itself")
    if o.without:  # an earlier full install left them: remove them from the venv only
        dists = [d for e in o.without for d in OPTIONAL_ENGINES[e]]
        _run([str(python), "-m", "pip", "uninstall", "--yes", *dists],
             "removing the engines left out")
        # pocl's wheel puts files inside pyopencl/; after both are uninstalled an empty
        # pyopencl/ stays, and Python imports an empty directory as a namespace package.
        for site in o.at(o.venv).glob("lib/python3*/site-packages"):
            for e in o.without:
                left = site / _ENGINE_PACKAGE[e]
                if left.is_dir() and not any(f.is_file() for f in left.rglob("*")):
                    shutil.rmtree(left)
        o.log(f"left out: {', '.join(o.without)} ({', '.join(dists)})")
    o.log(f"installed: {target} into {o.at(o.venv)}")


def _dist_name(requirement: str) -> str:
    """The normalised distribution name of a requirement string (PEP 503)."""
    m = re.match(r"\s*([A-Za-z0-9._-]+)", requirement)
    return re.sub(r"[-_.]+", "-", m.group(1)).lower() if m else ""


def requirements(source: Path, extras: Sequence[str], without: Sequence[str]) -> list[str]:
    """The runtime (and `extras`') requirements of a checkout or a wheel, markers kept,
    without those only the engines in `without` need."""
    if source.is_dir():
        reqs = _checkout_requirements(source, extras)
    elif source.suffix == ".whl" and source.is_file():
        reqs = _wheel_requirements(source, extras)
    else:
        raise InstallError(f"--without needs a checkout or a wheel to read the requirements "
                           f"from; {source} is neither")
    drop = {_dist_name(d) for e in without for d in OPTIONAL_ENGINES[e]}
    return [r for r in reqs if _dist_name(r) not in drop]


def _checkout_requirements(checkout: Path, extras: Sequence[str]) -> list[str]:
    import tomllib  # 3.11+: imported here so that older Pythons reach the version message

    pyproject = checkout / "pyproject.toml"
    if not pyproject.is_file():
        raise InstallError(f"{checkout} has no pyproject.toml to read the requirements from")
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project.get("optional-dependencies", {}).get(extra, [])
    return reqs


_EXTRA = re.compile(r"""\s*(?:and\s+)?\(?extra\s*==\s*["']([^"']+)["']\)?(?:\s+and)?\s*""")


def _wheel_requirements(wheel: Path, extras: Sequence[str]) -> list[str]:
    """Requires-Dist of a wheel: every unconditional one, and those of `extras` with the
    `extra == ...` clause taken off their marker."""
    import email.parser
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        name = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        if name is None:
            raise InstallError(f"{wheel} has no METADATA")
        meta = email.parser.Parser().parsestr(z.read(name).decode())
    out = []
    for line in meta.get_all("Requires-Dist") or ():
        req, _, marker = line.partition(";")
        m = _EXTRA.search(marker)
        if m is None:
            out.append(line.strip())
        elif m.group(1) in extras:
            rest = (marker[:m.start()] + " " + marker[m.end():]).strip()
            out.append(req.strip() + (f"; {rest}" if rest else ""))
    return out


def link_exe(o: Options) -> None:
    """/usr/local/bin/edgerun -> the venv's script, so `edgerun fleet ls` works in a shell.
    A file there that is not our link (an old `pip install`) is left alone, with a warning."""
    link = o.at("/usr/local/bin/edgerun")
    if link.is_symlink() and os.readlink(link) == o.exe:
        return
    if link.exists() or link.is_symlink():
        if not link.is_symlink():
            o.log(f"warning: {link} exists and is not a link to {o.exe}; left as it is (an "
                  "earlier `pip install`? remove it so your shell runs the service's edgerun)")
            return
        link.unlink()  # our link to an older prefix
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(o.exe)
    o.log(f"link: {link} -> {o.exe}")


def render_unit(text: str, exe: str, prefix: str = DEFAULT_PREFIX) -> str:
    """A shipped unit with its ExecStart pointing at `exe` and its Documentation= at the
    docs installed under `prefix`."""
    if SHIPPED_EXE not in text:
        raise InstallError(f"the unit does not run {SHIPPED_EXE}; cannot point it at {exe}")
    return text.replace(SHIPPED_EXE, exe).replace(SHIPPED_DOC, f"file://{prefix.rstrip('/')}/doc/")


def render_config(text: str, without: Sequence[str] = ()) -> str:
    """The example config with the service's state and cache directories, and without the
    engines left out in `backends.enabled` (so no start-up warns that they are missing)."""
    for old, new in SERVICE_PATHS:
        if old not in text:
            raise InstallError(f"the example config has no {old!r} line to point at the "
                               "service's directories")
        text = text.replace(old, new)
    m = _ENABLED.search(text)
    if without and m:
        keep = [e for e in re.findall(r'"([^"]+)"', m.group(1)) if e not in without]
        text = (text[:m.start()] + "enabled = [" + ", ".join(f'"{e}"' for e in keep) + "]"
                + text[m.end():])
    return text


def _write(path: Path, text: str, mode: int) -> bool:
    """Write `text` if it differs; returns whether the file changed."""
    if path.exists() and path.read_text() == text:
        path.chmod(mode)
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text, mode=mode)
    return True


def install_files(o: Options, shipped: Path) -> list[Path]:
    """Units (ExecStart rendered), sysusers and tmpfiles under /etc; returns what changed."""
    changed = []
    for unit in UNITS:
        dest = o.at(f"/etc/systemd/system/{unit}")
        if _write(dest, render_unit((shipped / unit).read_text(), o.exe, o.prefix), 0o644):
            changed.append(dest)
    for src, dest in (("edgerun.sysusers", "/etc/sysusers.d/edgerun.conf"),
                      ("edgerun.tmpfiles", "/etc/tmpfiles.d/edgerun.conf")):
        if _write(o.at(dest), (shipped / src).read_text(), 0o644):
            changed.append(o.at(dest))
    changed += install_docs(o, shipped.parent)
    for path in changed:
        o.log(f"wrote {path}")
    return changed


def install_docs(o: Options, checkout: Path) -> list[Path]:
    """README.md and docs/ (pages and images, same relative layout so links work) under
    PREFIX/doc, where the units' Documentation= points; returns what changed."""
    changed = []
    files = [checkout / "README.md", *sorted((checkout / "docs").rglob("*"))]
    for src in files:
        if not src.is_file() or src.suffix not in (".md", ".png", ".json"):
            continue
        dest = o.at(f"{o.prefix.rstrip('/')}/doc/{src.relative_to(checkout)}")
        data = src.read_bytes()
        if dest.exists() and dest.read_bytes() == data:
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(dest, data, mode=0o644)
        changed.append(dest)
    return changed


def _root_args(o: Options) -> list[str]:
    return [] if o.root == Path("/") else [f"--root={o.root}"]


def create_user(o: Options) -> None:
    """The `edgerun` user and group (members of video and render), and /etc/edgerun owned
    root:edgerun 0750, through systemd-sysusers and systemd-tmpfiles."""
    _run(["systemd-sysusers", *_root_args(o), str(o.at("/etc/sysusers.d/edgerun.conf"))],
         "creating the edgerun user")
    _run(["systemd-tmpfiles", *_root_args(o), "--create",
          str(o.at("/etc/tmpfiles.d/edgerun.conf"))], "creating /etc/edgerun")


def _gid(o: Options, name: str) -> int:
    """A group's id in the target's /etc/group (not the host's when --root is given)."""
    if o.root == Path("/"):
        return grp.getgrnam(name).gr_gid
    for line in o.at("/etc/group").read_text().splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[0] == name:
            return int(parts[2])
    raise InstallError(f"no group {name!r} in {o.at('/etc/group')}")


def pick_profile(model: str | None, dmi: dict[str, str]) -> tuple[str, str]:
    """(profile, why) for a machine that says it is `model` (its device tree's, None when it
    has none) with DMI fields `dmi` (sys_vendor, product_name, ...; empty when absent).
    A known board gets its profile; a PC (DMI, no device tree) and anything unknown get
    FALLBACK_PROFILE, with a why that says to check it."""
    if model:
        for pattern, profile in BOARD_PROFILES:
            if pattern.search(model):
                return profile, f"the device tree says {model!r}"
        return FALLBACK_PROFILE, (f"no bundled profile for {model!r} (device tree): "
                                  "check it, or write one (docs/install.md)")
    said = " ".join(v for k in DMI_KEYS if (v := dmi.get(k, "")))
    if said:
        return FALLBACK_PROFILE, f"a PC (DMI says {said!r})"
    return FALLBACK_PROFILE, ("neither a device tree model nor DMI found: check it "
                              "(docs/install.md)")


def _read_id(path: Path) -> str | None:
    """A short identification file (device-tree model, DMI field), printable text only;
    None when absent or unreadable (DMI's serial files are root-only, a container has none)."""
    try:
        raw = path.read_bytes()[:256]
    except OSError:
        return None
    text = "".join(c for c in raw.decode("utf-8", "replace") if c.isprintable()).strip()
    return text or None


def machine_profile(o: Options) -> tuple[str, str]:
    """(profile, why) for the target machine, from what it says it is under the install root:
    `/proc/device-tree/model`, then DMI (`/sys/class/dmi/id/*`)."""
    model = _read_id(o.at("/proc/device-tree/model"))
    dmi = {k: v for k in DMI_KEYS if (v := _read_id(o.at(f"/sys/class/dmi/id/{k}")))}
    return pick_profile(model, dmi)


def set_profile(text: str, profile: str) -> str:
    """The config text with `[device] profile` set to `profile` (its comment kept)."""
    m = _PROFILE.search(text)
    if m is None:
        raise InstallError("the example config has no [device] profile line to set")
    return text[:m.start(2) - 1] + f'"{profile}"' + text[m.end(2) + 1:]


def config_profile(text: str) -> str | None:
    """The `[device] profile` a config file names, None when it names none."""
    m = _PROFILE.search(text)
    return m.group(2) if m else None


def install_config(o: Options, example: Path) -> None:
    """/etc/edgerun/edgerun.toml from the example, root:edgerun 0640 — only when absent: an
    operator's config is never replaced."""
    dest = o.at("/etc/edgerun/edgerun.toml")
    profile, why = (o.profile, "--profile") if o.profile else machine_profile(o)
    if dest.exists():
        o.log(f"config: {dest} (kept as it is)")
        text = dest.read_text()
        m = _ENABLED.search(text)
        named = [e for e in o.without if m and f'"{e}"' in m.group(1)]
        if named:
            o.log(f"note: {dest} enables {', '.join(named)}, which is not installed: each "
                  "start will say it is disabled (remove it from backends.enabled)")
        has = config_profile(text)
        if has is not None and has != profile:
            said = (f"--profile {profile} is not applied to a kept config" if o.profile else
                    f"this machine looks like {profile!r} ({why})")
            o.log(f"note: {dest} has device profile {has!r}; {said}: change [device] "
                  "profile there if it is wrong")
        return
    _write(dest, set_profile(render_config(example.read_text(), o.without), profile), 0o640)
    os.chown(dest, 0, _gid(o, "edgerun"))
    o.log(f"config: {dest} (from {example}; edit it: model, source, [telemetry])")
    o.log(f"device profile: {profile} ({why}); [device] profile in {dest} changes it")


def systemd_reload(o: Options) -> None:
    """daemon-reload on a live system; enable (and start) when asked. Where systemd is not
    running (a container, a chroot building an image) enabling is done offline instead."""
    booted = Path("/run/systemd/system").is_dir()  # sd_booted(3)
    if o.root == Path("/") and booted:
        _run(["systemctl", "daemon-reload"], "systemctl daemon-reload")
        if o.enable:
            _run(["systemctl", "enable", "--now", "edgerun.service"], "starting edgerun")
            o.log("enabled and started edgerun.service (journalctl -u edgerun -f)")
    elif o.root == Path("/"):
        o.log("systemd is not running here: no daemon-reload"
              + ("; enabling offline" if o.enable else ""))
        if o.enable:
            _run(["systemctl", "enable", "edgerun.service"], "enabling edgerun")
    elif o.enable:
        _run(["systemctl", *_root_args(o), "enable", "edgerun.service"], "enabling edgerun")
        o.log(f"enabled edgerun.service under {o.root}")


def bundled_profiles() -> list[str]:
    """The names of the device profiles shipped in firmware_config/devices/."""
    return sorted(p.stem for p in (SOURCE / "firmware_config" / "devices").glob("*.toml"))


def install(o: Options) -> None:
    """Every step, in order; each is a no-op when already done."""
    # This module itself runs on older Pythons (Debian 11's 3.9), so it can say why it stops.
    if sys.version_info < (3, 11):  # noqa: UP036
        raise InstallError(f"edgerun needs Python 3.11 or newer; {o.python} is "
                           f"{sys.version.split()[0]}")
    python = make_venv(o)
    pip_install(o, python)
    if not o.at(o.exe).exists():
        raise InstallError(f"pip finished but {o.at(o.exe)} is missing")
    if o.link:
        link_exe(o)
    install_files(o, SOURCE / "systemd")
    create_user(o)
    install_config(o, SOURCE / "firmware_config" / "examples" / "edgerun.toml")
    systemd_reload(o)


def main(argv: list[str] | None = None) -> int:
    """`python3 -m runtime.tools.install`: see the module docstring."""
    p = argparse.ArgumentParser(prog="python3 -m runtime.tools.install", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefix", default=DEFAULT_PREFIX, help="venv goes in PREFIX/venv "
                   "(default %(default)s)")
    p.add_argument("--root", type=Path, default=Path("/"), help="install under this "
                   "directory instead of / (tests: the venv is not relocatable)")
    p.add_argument("--source", default=str(SOURCE), help="what pip installs (default: this "
                   "checkout; or a wheel, or a requirement such as edgerun==0.1.0)")
    p.add_argument("--extras", default="", help="comma-separated extras, e.g. demo")
    p.add_argument("--without", default="", metavar="ENGINES",
                   help="leave these engines out to save space (comma-separated: "
                   f"{', '.join(OPTIONAL_ENGINES)}; docs/install.md has their sizes); pass it "
                   "again on upgrades")
    p.add_argument("--system-site-packages", action="store_true",
                   help="let the venv see apt's Python packages (e.g. python3-picamera2)")
    p.add_argument("--pip-arg", action="append", default=[], metavar="ARG",
                   help="passed to pip (repeat), e.g. --pip-arg=--no-index "
                   "--pip-arg=--find-links=/srv/wheels for an offline install")
    p.add_argument("--no-link", action="store_true",
                   help="do not link /usr/local/bin/edgerun to the venv's script")
    p.add_argument("--enable", action="store_true",
                   help="systemctl enable --now edgerun.service when done")
    p.add_argument("--profile", default="", metavar="NAME",
                   help="the device profile a new config names (one of "
                   f"{', '.join(bundled_profiles())}, or a .toml path); default: picked from "
                   "/proc/device-tree/model or DMI")
    a = p.parse_args(argv)
    without = tuple(x for x in a.without.split(",") if x)
    if bad := [x for x in without if x not in OPTIONAL_ENGINES]:
        p.error(f"--without {', '.join(bad)}: not an optional engine (one of "
                f"{', '.join(OPTIONAL_ENGINES)})")
    if a.profile and not (a.profile in bundled_profiles() or (
            a.profile.endswith(".toml") and a.profile.isprintable()
            and not set(a.profile) & set('"\\'))):  # it goes into a TOML string
        p.error(f"--profile {a.profile!r}: not a bundled profile (one of "
                f"{', '.join(bundled_profiles())}) nor a path to a .toml")
    if a.root == Path("/") and os.geteuid() != 0:
        print("edgerun install: run as root (sudo python3 -m runtime.tools.install), or pass "
              "--root DIR to install into a directory (tests)", file=sys.stderr)
        return 2
    opts = Options(root=a.root.resolve(), prefix=a.prefix, source=a.source,
                   extras=tuple(x for x in a.extras.split(",") if x),
                   system_site_packages=a.system_site_packages, pip_args=tuple(a.pip_arg),
                   enable=a.enable, without=without, link=not a.no_link, profile=a.profile)
    try:
        install(opts)
    except InstallError as e:
        print(f"edgerun install: {e}", file=sys.stderr)
        return 1
    if opts.root == Path("/") and not opts.enable:
        print("next: edit /etc/edgerun/edgerun.toml, `edgerun check /etc/edgerun/edgerun.toml`, "
              "then `sudo systemctl enable --now edgerun`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
