"""CI: the runtime dependency set resolves to wheels on the aarch64 devices users have.

For each target (Raspberry Pi OS / Debian 12 on a Pi 4/5; Jetson on JetPack 6) pip resolves
pyproject's dependencies with `--only-binary=:all:` for that target's manylinux tags and
Python, `--dry-run --report` (PyPI serves wheel metadata on its own, so nothing large is
downloaded). A dependency without a wheel there fails the check; the fix is a platform marker
in pyproject.toml and a line in docs/install.md.

pip evaluates environment markers against the machine it runs on, not `--platform`, so the
markers of our own dependencies are evaluated here for the target first (a marker on a
transitive dependency is still pip's host view: a known pip limitation).

    python3 .ci/wheels.py            # every target
    python3 .ci/wheels.py --list     # ... and print what each resolves to
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

try:
    from packaging.markers import Marker
    from packaging.requirements import Requirement
except ImportError:  # pip always carries a copy
    from pip._vendor.packaging.markers import Marker  # type: ignore[no-redef]
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Target:
    """A device family: its CPU, the newest glibc its OS ships, its Python."""

    name: str
    machine: str
    glibc: tuple[int, int]
    python: str

    def platforms(self) -> list[str]:
        """Every manylinux tag a wheel for this target may carry (pip does not expand a
        `--platform manylinux_2_36_...` to the older tags it implies)."""
        major, minor = self.glibc
        tags = [f"manylinux_{major}_{m}_{self.machine}" for m in range(17, minor + 1)]
        return [*tags, f"manylinux2014_{self.machine}"]

    def environment(self) -> dict[str, str]:
        """Marker variables as they are on the target."""
        return {"platform_machine": self.machine, "sys_platform": "linux",
                "platform_system": "Linux", "os_name": "posix",
                "python_version": self.python, "python_full_version": self.python + ".0",
                "implementation_name": "cpython", "platform_python_implementation": "CPython"}


TARGETS = (
    Target("Raspberry Pi OS / Debian 12 (bookworm), aarch64", "aarch64", (2, 36), "3.11"),
    # JetPack 6 is Ubuntu 22.04 (glibc 2.35; its python3 is 3.10, so a 3.11 is needed)
    Target("Jetson, JetPack 6 (Ubuntu 22.04), aarch64", "aarch64", (2, 35), "3.11"),
)


def requirements(target: Target, pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """pyproject's runtime dependencies that apply on `target` (markers evaluated for it),
    without their markers."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    out = []
    for dep in deps:
        req = Requirement(dep)
        if req.marker is None or Marker(str(req.marker)).evaluate(target.environment()):
            req.marker = None
            out.append(str(req))
    return out


def resolve(target: Target, reqs: list[str]) -> tuple[bool, str, list[dict]]:
    """pip's resolution of `reqs` to wheels for `target`: (ok, pip's output, installs)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--disable-pip-version-check", "--quiet", "--report", str(report),
               # pip 23 wants --target with --platform even for a dry run
               "--target", str(Path(tmp) / "t"), "--only-binary=:all:",
               "--implementation", "cp", "--python-version", target.python]
        for tag in target.platforms():
            cmd += ["--platform", tag]
        out = subprocess.run([*cmd, *reqs], capture_output=True, text=True)
        text = "\n".join(line for line in (out.stdout + out.stderr).splitlines()
                         if "is ignored: it is neither a file nor a directory" not in line)
        installs = json.loads(report.read_text())["install"] if report.exists() else []
    return out.returncode == 0, text, installs


def main(argv: list[str] | None = None) -> int:
    """Check every target; exit 1 when one does not resolve."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--list", action="store_true", help="print every resolved wheel")
    args = p.parse_args(argv)
    failed = 0
    for target in TARGETS:
        reqs = requirements(target)
        ok, text, installs = resolve(target, reqs)
        if not ok:
            failed += 1
            print(f"wheels: {target.name}: does NOT resolve to wheels (Python {target.python}, "
                  f"glibc <= {target.glibc[0]}.{target.glibc[1]}):\n{text}")
            continue
        print(f"wheels: {target.name}: {len(installs)} wheels for {len(reqs)} requirements "
              f"(Python {target.python}, glibc <= {target.glibc[0]}.{target.glibc[1]})")
        if args.list:
            for item in installs:
                url = item["download_info"]["url"].rsplit("/", 1)[-1]
                print(f"  {item['metadata']['name']} {item['metadata']['version']}  {url}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
