"""Fourteen days in the field with faults, in lockstep: a real Mosquitto, a real coordinator
process and two real `edgerun serve` processes (a sunny cabinet, rpi5; a solar node in a sealed
enclosure, solar-node) over `--days` simulated days, faults on a schedule.

Simulated time. Each daemon runs its own in-process simulator (runtime/device/simdevice.py):
the plant, the sensors' sysfs tree, the synthetic camera's frames and the governor's ticks
move on one simulated clock, in lockstep with the control loop, at `--speed` simulated seconds
per wall second when the host keeps up and slower (same decisions) when it does not. The soak
reads each daemon's simulated time from what the daemon itself says (its health history and
the health the coordinator stored) and times every fault on it, so a busy host delays the
faults with the days instead of moving them. The broker, the coordinator and the daemons'
network and storage duties (MQTT keepalives, ack timeouts, reconnect backoffs, the
coordinator's offline timer) count wall time: libfaketime at a rate would make those fire
`--speed` times sooner in wall time (a 5 s keepalive every 3 ms), a network that flaps
by construction, and the results' times come from the daemon's wall clock anyway. So a
2-hour cut is 2 simulated hours of the plant and the camera, `7200 / speed` wall seconds
of the link; what the daemon and the coordinator did about it is measured in both.

A daemon's simulator starts its plant at the hour it is given: after each kill -9 the soak
starts the daemon again at the last simulated time it reported, the plant at the ambient of
that hour (the die's few minutes of heat are lost, not the day). The solar node's panel sees
the sky of `WEATHER_SEED` (power.plant.solar_trace: days sunny, partly cloudy or overcast, the
same sky on the same day in every life), and each life starts its battery at the charge the
last health of the one before reported (a kill -9 loses the minutes since).

Faults (`schedule`), each timed on the simulated clock of the device it hits, never two on one
device at once: broker restarts (Mosquitto stopped and started, persistence off: whatever it
held is lost), a 2-hour network cut (a TCP relay between the devices and the broker stops
forwarding: open connections go silent, new ones are held, as a dead radio link), disk full
for an hour (the cabinet's state directory is a tmpfs, filled to ENOSPC; root only), a dead
temperature sensor for an hour (the plant stops writing the zone's file and removes it:
power/plant.py DEAD_SENSORS), a kill -9 of each daemon each day, a clock jump (the solar
node runs under libfaketime; its clock steps back an hour and stays there), and an OTA update
half-way through (day 7 of 14, on each device's own clock): the bundled model `inspection`
re-released as version OTA_VERSION (the same network, signed by a publisher key the soak makes
and the daemons trust), uploaded to the coordinator process and rolled out to each device
through the coordinator's HTTP API (a group of that one device, all at once); the daemon
downloads, verifies and installs it and judges it in probation. A new version of the same
model with the same forms replays the same recorded profiles (`[simulator] profiles` are keyed
by variant id: model name and form, no version), as a retrained network of those forms would.

Printed: results made / stored / lost / duplicated per device; the OTA update on each device
(the version its health reports, the model events the coordinator stored, the simulated hours
from the rollout to the swap and to the probation's verdict); RSS, fds, threads and disk use
of each process with their slope per simulated day (RSS, fds and threads within each process
life, the first 2 simulated hours of a life left out: a restart's warm-up is not a leak);
each fault as the device's health and the coordinator saw it; per simulated day the highest
die reading against the passive trip and the governor's accuracy-weighted good inferences
against the hindsight oracle's (power/oracle.py) for the same day.

Targets (docs/daemon.md, "Field soak"): 0 lost, 0 duplicated, RSS slope < 1 MB a simulated day;
each device serving OTA_VERSION after a passed probation, nothing rolled back.

Usage: python bench/field_soak.py [--days 14] [--speed 1500] [--workdir DIR] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from support.daemon_harness import held_rows  # noqa: E402
from support.governor_day import DEMO_SHARE, PROFILES, ladder  # noqa: E402
from support.under_test import child_env  # noqa: E402

from models import bundled  # noqa: E402
from power.oracle import best_schedule  # noqa: E402
from power.plant import DEAD_SENSORS, SCENARIOS, ambient  # noqa: E402
from runtime.coordinator import api_client  # noqa: E402
from runtime.device.profiles import load_profile  # noqa: E402
from runtime.ota.bundle import make as make_bundle  # noqa: E402
from runtime.telemetry import resultlog  # noqa: E402
from runtime.tools.simloop import REFERENCE_BACKENDS  # noqa: E402
from runtime.wire import clock as wire_clock  # noqa: E402
from runtime.wire.broker import Mosquitto, free_port, wait_port  # noqa: E402
from runtime.wire.commands import generate_keypair, load_private_key  # noqa: E402

DAY_H = 24.0
FLEET = "field"
LATENCY_MS = 20.0
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SHIM = ROOT / "tests" / "support" / "faketime_shim"
WARMUP_H = 2.0  # simulated hours of each process life left out of the RSS/fd/thread slopes
TARGET_RSS_MB_PER_DAY = 1.0


def terminate(proc: subprocess.Popen) -> int | None:
    """SIGTERM to a process this soak started, then wait (SIGKILL after 60 s); its status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


# -- the schedule (pure) ----------------------------------------------------------------------

@dataclass(frozen=True)
class Fault:
    """One fault: `kind` on `device` (whose simulated clock times it) from `at_h` simulated
    hours after the soak's start, for `dur_h` (0: an instant)."""

    kind: str  # broker_restart, network_cut, disk_full, dead_sensor, kill9, clock_jump,
    # ota_update
    device: str
    at_h: float
    dur_h: float = 0.0

    @property
    def end_h(self) -> float:
        """The simulated hour it ends at."""
        return self.at_h + self.dur_h


# kind -> (share of the run it starts at, duration h, device); the broker and the link are
# shared, timed on the cabinet's clock
PLACED = (("broker_restart", 0.10, 0.0, "cabinet"), ("disk_full", 0.22, 1.0, "cabinet"),
          ("dead_sensor", 0.36, 1.0, "cabinet"), ("broker_restart", 0.47, 0.0, "cabinet"),
          ("network_cut", 0.60, 2.0, "cabinet"), ("clock_jump", 0.74, 0.0, "solar"),
          ("broker_restart", 0.86, 0.0, "cabinet"))
DEVICES = ("cabinet", "solar")
SHARED = frozenset({"broker_restart", "network_cut"})  # hit every device
KILL_MARGIN_H = 1.5  # a kill is kept this far from any other fault's window
# The OTA update: half-way through, on each device's own clock. Its window is the simulated
# time reserved for the rollout, the download, the install and the probation (OTA_PROBATION
# frames at the synthetic camera's ~12 frames a simulated hour: under 2 h at full rate), kept
# OTA_MARGIN_H from the other faults of the device and the link (a broker restart's reconnects
# take a few wall seconds, hours of simulated time).
OTA_SHARE, OTA_H, OTA_MARGIN_H = 0.5, 3.0, 1.0
OTA_VERSION = "2"
OTA_PROBATION = 20
# the solar node's sky (power.plant.solar_trace): days 1-3 sunny, 4 partly cloudy, 5 sunny,
# 6-8 overcast (a dark spell the battery must ride through), 9-14 sunny
WEATHER_SEED = 2


def ota_time(days: int, others: Iterable[Fault], device: str) -> float | None:
    """The simulated hour of `device`'s OTA update in a `days`-day soak: half-way, or None
    when its window (OTA_H, OTA_MARGIN_H either side) would meet another fault of the device
    or the link, or pass the end (a 1-day soak is too full of faults for one)."""
    total = days * DAY_H
    at = round(OTA_SHARE * total, 2)
    if at + OTA_H + OTA_MARGIN_H > total:
        return None
    for f in others:
        if f.kind != "kill9" and (f.device == device or f.kind in SHARED) and (
                f.at_h <= at + OTA_H + OTA_MARGIN_H and f.end_h >= at - OTA_MARGIN_H):
            return None
    return at


def schedule(days: int, left_out: Iterable[str] = ()) -> list[Fault]:
    """The faults of a `days`-day soak, in time order: those of PLACED (all but the kinds
    in `left_out`), an OTA update of each device half-way (`ota_time`) and a kill -9 of each
    device each day at an hour that moves through the day (7 h later each day) and keeps
    KILL_MARGIN_H from every other fault's window."""
    total = days * DAY_H
    out = [Fault(k, d, round(share * total, 2), dur) for k, share, dur, d in PLACED
           if k not in left_out]
    if "ota_update" not in left_out:
        placed = list(out)
        out += [Fault("ota_update", dev, at, OTA_H) for dev in DEVICES
                if (at := ota_time(days, placed, dev)) is not None]
    for day in range(days):
        for i, dev in enumerate(DEVICES):
            hour = (5.3 + 12 * i + 7 * day) % DAY_H
            at = day * DAY_H + hour

            def clash(t: float, dev: str = dev) -> bool:
                """`t` is within KILL_MARGIN_H of another fault on `dev` or the link."""
                return any(f.at_h - KILL_MARGIN_H <= t <= f.end_h + KILL_MARGIN_H
                           for f in out if f.kind != "kill9"
                           and (f.device == dev or f.kind in SHARED))

            while clash(at) and at < (day + 1) * DAY_H - 1:
                at += 0.5
            if at < (day + 1) * DAY_H - 1 and "kill9" not in left_out:
                out.append(Fault("kill9", dev, round(at, 2)))
    return sorted(out, key=lambda f: (f.at_h, f.device))


# -- the figures (pure) -----------------------------------------------------------------------

def slope_within(samples: Iterable[tuple[Any, float, float]]) -> float | None:
    """The least-squares slope of y on x with an intercept of its own for each group (one
    process life: a restart's drop is not a fall): samples are (group, x, y). None when
    fewer than 3 samples or no spread of x within a group."""
    groups: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    for g, x, y in samples:
        groups[g].append((x, y))
    sxx = sxy = 0.0
    n = 0
    for pts in groups.values():
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        sxx += sum((x - mx) ** 2 for x, _ in pts)
        sxy += sum((x - mx) * (y - my) for x, y in pts)
        n += len(pts)
    if n < 3 or sxx <= 0:
        return None
    return sxy / sxx


@dataclass
class Tally:
    """Results of one device: made (seqs the outbox gave), stored (distinct at the
    coordinator), lost (made, never stored), duplicated (stored more than once: the same
    seq twice, or the same result under two seqs)."""

    made: int
    stored: int
    lost: int
    duplicated: int
    lost_seqs: list[int] = field(default_factory=list)


def tally(made: int, stored: list[tuple[str, int, str]]) -> Tally:
    """`made`: the device's highest seq (seqs 1..made were made); `stored`: (stream, seq,
    body without seq) of each row the coordinator holds for the device."""
    seqs = [q for _, q, _ in stored]
    distinct = set(seqs)
    by_body: dict[str, int] = defaultdict(int)
    for _, _, body in stored:
        by_body[body] += 1
    dup = (len(seqs) - len(distinct)) + sum(n - 1 for n in by_body.values() if n > 1)
    lost = sorted(set(range(1, made + 1)) - distinct)
    return Tally(made, len(distinct & set(range(1, made + 1))), len(lost), dup, lost[:20])


def day_of(h: float) -> int:
    """The simulated day (0-based) that simulated hour `h` ends: midnight belongs to the day
    before (the last reading of a run that stops at 24 h is its day's)."""
    return max(0, math.ceil(h / DAY_H - 1e-9) - 1)


def per_day(points: Iterable[tuple[float, float]]) -> dict[int, float]:
    """The highest y of each simulated day: points are (simulated hour, y)."""
    out: dict[int, float] = {}
    for h, y in points:
        d = day_of(h)
        out[d] = max(out.get(d, -math.inf), y)
    return out


def gains_per_day(lives: dict[str, list[tuple[float, float]]]) -> dict[int, float]:
    """Accuracy-weighted good inferences of each simulated day, from each process life's
    cumulative tally: lives maps a boot id to its (simulated hour, cumulative) points (the
    tally is 0 where the life began). Each increment goes to the day its interval ends in
    (an interval ending at midnight to the day before; health comes every few simulated
    minutes, so a day's edge moves a few minutes of inferences at most)."""
    out: dict[int, float] = defaultdict(float)
    for pts in lives.values():
        prev = 0.0
        for h, g in sorted(pts):
            if g < prev:  # not this life's tally
                continue
            out[day_of(h)] += g - prev
            prev = g
    return dict(out)


INTERESTING = re.compile(r"(total|error|drop|lost|full|connect|resend|takeover|jump|state|"
                         r"status|sensor|problem|unwritable|evict|refus|spill|dead|missing|"
                         r"fail|stale|offline|degrad|fallback|held|^boot$|model_version)",
                         re.I)
VOLATILE = re.compile(r"(^t$|\.t$|labels\.|uptime|latency|rate_hz|simulated\.|power|energy|temp_c|"
                      r"die_|_ms$|bytes|wal|^seq$|mono|clk\.)", re.I)


def flatten(h: Any, prefix: str = "") -> dict[str, Any]:
    """A health message's leaves as dotted keys (lists by index, at most 8 items)."""
    out: dict[str, Any] = {}
    if isinstance(h, dict):
        for k, v in h.items():
            out.update(flatten(v, f"{prefix}{k}."))
    elif isinstance(h, list):
        for i, v in enumerate(h[:8]):
            out.update(flatten(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = h
    return out


def health_change(before: dict | None, after: dict | None, most: int = 8) -> list[str]:
    """What a fault changed in the daemon's health, as `key: before -> after` for the
    counters and states whose names say they concern faults."""
    a, b = flatten(before or {}), flatten(after or {})
    out = []
    for k in sorted(set(a) | set(b)):
        if not INTERESTING.search(k) or VOLATILE.search(k):
            continue
        if a.get(k) != b.get(k):
            out.append(f"{k}: {a.get(k)} -> {b.get(k)}")
    return out[:most] + ([f"(+{len(out) - most} more)"] if len(out) > most else [])


# -- the edges: a link to cut, a disk to fill, processes to watch -----------------------------

class Link:
    """A TCP relay between the devices and the broker that can be cut: while cut it forwards
    nothing (open connections go silent, new ones are accepted and held unanswered), as a
    dead radio link looks to both ends until their keepalives expire; restored, the
    connections of before the cut are closed and new ones forwarded."""

    def __init__(self, target_port: int):
        self.target = target_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.cut = threading.Event()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, name="link-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                c, _ = self.server.accept()
            except OSError:
                return
            with self._lock:
                self._socks.append(c)
            if self.cut.is_set():
                continue  # held: nothing answers
            try:
                up = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:  # the broker is down: refused, as it would be
                c.close()
                continue
            with self._lock:
                self._socks.append(up)
            for a, b in ((c, up), (up, c)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.2)
        try:
            while not self._closed:
                if self.cut.is_set():
                    return  # silent: the peer's keepalive finds out; closed on restore
                try:
                    data = src.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        if not self.cut.is_set():
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def set_cut(self) -> None:
        """Cut the link."""
        self.cut.set()

    def restore(self) -> None:
        """Forward again; the connections from before are closed (they died in the cut)."""
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            with contextlib.suppress(OSError):
                s.close()
        self.cut.clear()

    def close(self) -> None:
        """Stop relaying and close every socket."""
        self._closed = True
        self.restore()
        self.server.close()


class Disk:
    """A tmpfs of `size_mb` at `path` (root only); `fill()` takes every free byte (ENOSPC),
    `free()` gives it back."""

    def __init__(self, path: Path, size_mb: int):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        got = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs",
                              str(path)], capture_output=True, text=True)
        if got.returncode != 0:
            raise OSError(f"cannot mount a tmpfs at {path}: {got.stderr.strip()}")
        self.filler = path / "filler"

    def fill(self) -> None:
        """Write until the file system refuses (unbuffered, big blocks then small ones)."""
        with self.filler.open("ab", buffering=0) as f:
            for size in (1 << 20, 64 << 10, 4096, 512, 1):
                block = b"\0" * size
                try:
                    while f.write(block):
                        pass
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise

    def free(self) -> None:
        """Give the space back."""
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        """Unmount (lazily: a process may still hold a file there)."""
        subprocess.run(["umount", "-l", str(self.path)], check=False)


def tree(pid: int) -> list[int]:
    """`pid` and its descendants (from /proc)."""
    kids: dict[int, list[int]] = defaultdict(list)
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids[ppid].append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def usage(pid: int) -> tuple[float, int, int] | None:
    """(RSS MB, open fds, threads) of `pid` and its descendants, None once it is gone."""
    rss = fds = threads = 0
    found = False
    for p in tree(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            continue
        found = True
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss += int(line.split()[1])
            elif line.startswith("Threads:"):
                threads += int(line.split()[1])
    return (rss / 1024, fds, threads) if found else None


def disk_mb(path: Path, skip: str = "filler") -> float:
    """Bytes under `path` (files, not counting the disk-full filler), MB."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            if f != skip:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(dirpath, f)).st_size
    return total / 1e6


def query(db: Path, sql: str, args: tuple = ()) -> list[tuple]:
    """Rows of `sql` on `db`, read-only ([] while it does not exist or lacks the table)."""
    if not db.exists():
        return []
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
        try:
            return con.execute(sql, args).fetchall()
        finally:
            con.close()
    except sqlite3.Error:
        return []


# -- the processes ----------------------------------------------------------------------------

NODE_TOML = """\
[device]
profile = "{profile}"
sysfs_root = "{sysroot}"

[constraints]
latency_ms = {latency_ms}
{floor_line}

{backends}
[profiler]
idle_baseline_s = 0.1
cache_dir = "{state}/profiles"

[source]
kind = "synthetic"
rate_hz = {source_hz}

[governor]
policy = "step_wise"
tick_s = {tick_s}
rate_hz = 0

[simulator]
enabled = true
scenario = "{scenario}"
speed = {speed}
start_hour = {start_hour}
hours = {hours}
profiles = "{profiles}"
offered_share = {share}
root = "{sysroot}"
weather_seed = {weather_seed}
battery_frac = {battery_frac}

[daemon]
state_dir = "{state}"

[telemetry]
fleet = "{fleet}"
device = "{name}"
health_interval_s = 0.5
ack_timeout_s = 2.0
trusted_keys = ["{command_pub}"]

[telemetry.broker]
host = "127.0.0.1"
port = {port}
keepalive_s = 5
username = "{username}"
password_file = "{password_file}"

[telemetry.outbox]
path = "{state}/outbox.db"
spill_after_s = 0.2

[models]
publisher_keys = ["{publisher_pub}"]
# a short probation, every frame of it also run on the old model (the shadow sample): the
# camera gives ~12 frames a simulated hour, and the soak's OTA window is 3 simulated hours
probation_frames = {probation}
shadow_every = 1

[storage]
# the soak reads each daemon's simulated hour from its health history while the link is cut:
# written every second (the default's 300 s of wall time are days at the soak's speed)
history_flush_s = 1.0
"""


@dataclass
class Node:
    """One `edgerun serve` in the soak, across its lives (one per start)."""

    name: str
    profile: str
    scenario: str
    share: float
    floor: float | None
    tick_s: float  # the governor's tick (simulated s): the control step's cost is per tick
    home: Path  # its directory: config, log, faketime file; state/ may be a tmpfs
    sysroot: Path  # the simulated sysfs tree (in memory, as sysfs is: /dev/shm)
    keys: Path | None = None  # command.pub and publisher.pub, trusted
    faketime: bool = False
    proc: subprocess.Popen | None = None
    lives: int = 0
    boot_starts: dict[str, float] = field(default_factory=dict)  # boot id -> start hour
    sim_h: float = 0.0
    life_start_h: float = 0.0
    crashes: list[str] = field(default_factory=list)
    killed: bool = False
    weather_seed: int = -1  # the sky over its solar panel (-1: none)
    battery_frac: float = 1.0  # the charge its newest health reported: the next life's start

    @property
    def state(self) -> Path:
        """Its state directory (outbox, health history, profiles)."""
        return self.home / "state"

    def start(self, broker: Mosquitto, port: int, speed: float, start_h: float,
              end_h: float, source_hz: float, faults: Iterable[Fault] = ()) -> None:
        """Start a life at simulated hour `start_h`, its simulated clock stopping at
        `end_h` (the soak's end). The life that will see a clock jump (none of this node's
        kills before it) runs under libfaketime, its clock right until the jump; the
        others do not (a reboot after the jump comes up synced, an hour forward again)."""
        later = [f for f in faults if f.device == self.name and f.at_h > start_h]
        jumps = [f.at_h for f in later if f.kind == "clock_jump"]
        self.faketime = bool(jumps) and not any(f.kind == "kill9" and f.at_h < min(jumps)
                                                 for f in later)
        self.state.mkdir(parents=True, exist_ok=True)
        flag = self.sysroot / wire_clock.TIMESYNC_FLAG  # the clock is synced (timesyncd)
        flag.parent.mkdir(parents=True, exist_ok=True)
        flag.touch()
        creds = broker.device(FLEET, self.name)
        cfg = self.home / "edgerun.toml"
        cfg.write_text(NODE_TOML.format(
            profile=self.profile, sysroot=self.sysroot, latency_ms=LATENCY_MS,
            floor_line="" if self.floor is None else f"accuracy_floor = {self.floor}",
            backends=REFERENCE_BACKENDS, state=self.state, source_hz=source_hz / speed,
            scenario=self.scenario, speed=speed, tick_s=self.tick_s, start_hour=round(start_h, 6),
            hours=round(end_h - start_h, 6), profiles=PROFILES.resolve(), share=self.share,
            fleet=FLEET, name=self.name, port=port, username=creds.username,
            password_file=creds.password_file, command_pub=self.keys / "command.pub",
            publisher_pub=self.keys / "publisher.pub", probation=OTA_PROBATION,
            weather_seed=self.weather_seed, battery_frac=round(self.battery_frac, 4)))
        env = child_env()  # the checkout, or the installed wheel under test
        if self.faketime:
            fake = self.home / "faketime"
            fake.write_text("+0\n")
            env = child_env(SHIM, LD_PRELOAD=str(LIBFAKETIME),
                            FAKETIME_TIMESTAMP_FILE=str(fake), FAKETIME_CACHE_DURATION="1",
                            FAKETIME_DONT_FAKE_MONOTONIC="1")
        log = (self.home / "daemon.log").open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--config",
                                      str(cfg)], stdout=log, stderr=subprocess.STDOUT,
                                     env=env, cwd=ROOT)
        log.close()
        self.lives += 1
        self.sim_h = max(self.sim_h, start_h)
        self.life_start_h = start_h
        self.killed = False

    def kill9(self) -> None:
        """SIGKILL this life (by its pid) and reap it."""
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.killed = True

    def stop(self) -> int | None:
        """SIGTERM, then wait (SIGKILL after 60 s); the exit status."""
        return None if self.proc is None else terminate(self.proc)

    def history_sim_h(self) -> float | None:
        """The simulated hour of the newest record of its health history."""
        path = self.state / "health-history.jsonl"
        try:
            with path.open("rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                lines = f.read().splitlines()
        except OSError:
            return None
        for line in reversed(lines):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("sim_t"), int | float):
                return rec["sim_t"] / 3600
        return None

    def made(self) -> int:
        """The highest seq its outbox ever gave (database and result log)."""
        db = self.state / "outbox.db"
        seqs = [s for (s,) in query(db, "SELECT seq FROM sqlite_sequence WHERE "
                                        "name='results'")]
        rec = resultlog.read(db.with_name(db.name + ".log"))
        seqs += [q for q, _ in rec.results] + [rec.acked]
        return max([0, *seqs])


class Coordinator:
    """`edgerun coordinator` as a child process on a SQLite store."""

    def __init__(self, home: Path, broker: Mosquitto, keys: Path):
        home.mkdir(parents=True, exist_ok=True)
        self.home, self.store = home, home / "coord.db"
        self.http = free_port()
        self.device_keys = home / "device-keys"
        self.device_keys.mkdir(exist_ok=True)
        creds = broker.coordinator(FLEET)
        self.conf = home / "coordinator.toml"
        self.conf.write_text(
            "[coordinator]\n"
            f'fleet = "{FLEET}"\nstore = "{self.store}"\nclient_id = "coordinator"\n'
            f"http_port = {self.http}\n"
            f'api_token_file = "{home / "api-token"}"\n'
            # commands signed with the key the daemons trust; replies checked against the
            # keys of the devices enrolled in device_keys
            f'signing_key = "{keys / "command.pem"}"\ndevice_keys = "{self.device_keys}"\n'
            # the offline timer counts wall time: short, so a cut of 2 simulated hours
            # (seconds of wall time) is long enough to be seen
            "stale_after_s = 3\noffline_after_s = 6\n"
            "[coordinator.broker]\n"
            f'host = "127.0.0.1"\nport = {broker.port}\nkeepalive_s = 5\n'
            f'username = "{creds.username}"\npassword_file = "{creds.password_file}"\n')
        log = (home / "coordinator.log").open("ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "coordinator",
                                      "--config", str(self.conf)], stdout=log,
                                     stderr=subprocess.STDOUT, cwd=ROOT,
                                     env=child_env())
        log.close()
        wait_port(self.http, 60)

    def stop(self) -> int | None:
        """SIGTERM, then wait (SIGKILL after 60 s); the exit status."""
        return terminate(self.proc)

    def enroll(self, device: str, public: Path) -> bool:
        """Put a device's reply-signing key in device_keys (whole, by a rename: the
        coordinator re-reads the file when it changes); False while the device has not
        written it yet."""
        tmp = self.device_keys / f".{device}.pub.tmp"
        try:
            shutil.copyfile(public, tmp)
        except OSError:
            return False
        tmp.replace(self.device_keys / f"{device}.pub")
        return True

    def api(self, method: str, path: str, body: dict | None = None) -> Any:
        """A call of the coordinator's HTTP API (the one `edgerun fleet` makes): its JSON
        answer; an HTTP or connection error raises api_client.ApiError with the API's
        message."""
        return api_client.call(self.url, path, body, token=self.token(), method=method,
                               timeout=60)

    def upload(self, bundle: Path) -> Any:
        """PUT a bundle file to the coordinator (`edgerun fleet deploy` does): its record;
        api_client.ApiError when the coordinator refuses it."""
        return api_client.upload(self.url, bundle, self.token(), timeout=60)

    def token(self) -> str:
        """The API token the coordinator wrote at its start."""
        return (self.home / "api-token").read_text().strip()

    @property
    def url(self) -> str:
        """The base URL of its HTTP API."""
        return f"http://127.0.0.1:{self.http}"

    def roll_out(self, bundle_id: str, device: str) -> dict:
        """Roll bundle `bundle_id` out to `device` alone, now: a group of that device and a
        rollout to it all at once (`edgerun fleet group` / `fleet deploy --canary 100%`)."""
        group = f"ota-{device}"
        self.api("POST", "/api/v1/groups", {"group": group, "devices": [device]})
        return self.api("POST", "/api/v1/rollouts", {"bundle": bundle_id, "to": group,
                                                     "canary_pct": 100})

    def model_events(self, device: str, rowid: int) -> list[tuple[int, str, dict]]:
        """(rowid, type, body) of the model events (model_*) stored for `device` after
        `rowid`."""
        out = []
        for rid, typ, body in query(self.store, "SELECT rowid, type, body FROM events WHERE "
                                                "device = ? AND rowid > ? AND type LIKE "
                                                "'model%' ORDER BY rowid", (device, rowid)):
            with contextlib.suppress(ValueError):
                doc = json.loads(body)
                out.append((rid, typ, doc if isinstance(doc, dict) else {}))
        return out

    def healths(self, device: str, after_rowid: int = 0) -> list[tuple[int, float, dict]]:
        """(rowid, wall t, body) of the health stored for `device` after `after_rowid`."""
        out = []
        for rowid, t, body in query(self.store, "SELECT rowid, t, body FROM health WHERE "
                                                "device = ? AND rowid > ? ORDER BY rowid",
                                    (device, after_rowid)):
            with contextlib.suppress(ValueError):
                out.append((rowid, t, json.loads(body)))
        return out

    def latest_health(self, device: str) -> tuple[int, dict] | None:
        """(rowid, body) of the newest health stored for `device`, None before any."""
        rows = query(self.store, "SELECT rowid, body FROM health WHERE device = ? ORDER BY "
                                 "rowid DESC LIMIT 1", (device,))
        return (rows[0][0], json.loads(rows[0][1])) if rows else None

    def events_after(self, device: str, rowid: int) -> list[tuple[int, str, str]]:
        """(rowid, type, severity) of the events stored for `device` after `rowid`."""
        out = []
        for rid, typ, body in query(self.store, "SELECT rowid, type, body FROM events WHERE "
                                                "device = ? AND rowid > ? ORDER BY rowid",
                                    (device, rowid)):
            try:
                sev = json.loads(body).get("severity", "")
            except (ValueError, AttributeError):
                sev = ""
            out.append((rid, typ, sev))
        return out

    def log_size(self) -> int:
        """Where its log ends now."""
        try:
            return (self.home / "coordinator.log").stat().st_size
        except OSError:
            return 0

    def log_lines(self, offset: int) -> list[str]:
        """The lines its log gained after `offset`."""
        try:
            with (self.home / "coordinator.log").open("rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace").splitlines()
        except OSError:
            return []

    def max_event_rowid(self) -> int:
        """The newest event's rowid (0 before any)."""
        rows = query(self.store, "SELECT COALESCE(MAX(rowid), 0) FROM events")
        return int(rows[0][0]) if rows else 0

    def stored(self, device: str) -> list[tuple[str, int, str]]:
        """(stream, seq, body without its seq) of each stored result of `device`."""
        out = []
        for stream, seq, body in query(self.store, "SELECT stream, seq, body FROM results "
                                                   "WHERE device = ?", (device,)):
            try:
                doc = json.loads(body)
                doc.pop("seq", None)
                key = json.dumps(doc, sort_keys=True)
            except (ValueError, AttributeError):
                key = body
            out.append((stream, seq, key))
        return out


# -- the soak ---------------------------------------------------------------------------------

@dataclass
class Seen:
    """One fault as it happened and as the device's health and the coordinator saw it."""

    fault: Fault
    wall_start: float = 0.0
    wall_end: float = 0.0
    done: bool = False
    health_before: dict | None = None
    health_during: dict | None = None
    event_rowid: int = 0
    log_offset: int = 0
    health: list[str] = field(default_factory=list)
    coordinator: list[str] = field(default_factory=list)
    note: str = ""
    ota: dict[str, Any] = field(default_factory=dict)  # an OTA update's course (follow_ota)


@dataclass
class Report:
    """What the soak printed, as data (the test's assertions read it)."""

    days: int
    speed: float
    wall_s: float
    finished: bool
    tallies: dict[str, dict]
    resources: list[dict]
    faults: list[dict]
    daily: list[dict]
    left_out: dict[str, str]
    crashes: dict[str, list[str]]
    exit_codes: dict[str, int | None]
    samples: dict[str, list] = field(default_factory=dict)  # (life, hour, RSS, fds, thr, disk)
    ota: dict[str, dict] = field(default_factory=dict)  # device -> its OTA update (ota_outcome)


def soak(workdir: Path, days: int = 14, speed: float = 1500.0, source_hz: float = 5.0,
         wall_limit_s: float | None = None, say: Callable[[str], None] = print,
         kills: bool = True) -> Report:
    """Run the soak in `workdir` (module doc); the report. `kills=False` leaves the daily
    kill -9 out: one life per daemon, whose RSS slope is not cut into day-long pieces."""
    workdir.mkdir(parents=True, exist_ok=True)
    end_h = days * DAY_H
    limit = wall_limit_s if wall_limit_s is not None else 600 + 4 * end_h * 3600 / speed
    left_out: dict[str, str] = {}
    if os.geteuid() != 0:
        left_out["disk_full"] = "mounting a tmpfs to fill (a real ENOSPC) needs root"
    if not kills:
        left_out["kill9"] = "--no-kill: one life per daemon (the RSS slope over all of it)"
        # the jump's life would be the whole run, under libfaketime (~3x slower a tick)
        left_out["clock_jump"] = "--no-kill: libfaketime would slow the whole run"
    if not LIBFAKETIME.exists():
        left_out["clock_jump"] = f"libfaketime is not installed ({LIBFAKETIME})"
    plan = schedule(days, left_out)
    if not any(f.kind == "ota_update" for f in plan):
        left_out["ota_update"] = (f"no {OTA_H:g} h window half-way free of the other faults "
                                  f"(a {days}-day run)")
    faults = [Seen(f) for f in plan]
    # the soak's keys: the coordinator's command key and a publisher's bundle key, both
    # trusted by the daemons; the release the OTA update rolls out, signed
    keys = workdir / "keys"
    keys.mkdir(exist_ok=True)
    for k in ("command", "publisher"):
        generate_keypair(keys / f"{k}.pem", keys / f"{k}.pub")
    release = workdir / f"inspection-{OTA_VERSION}.edgerun"
    if "ota_update" not in left_out:  # the bundled model, the same network, a new version
        make_bundle(bundled(), load_private_key(keys / "publisher.pem"), release, OTA_VERSION)
    (workdir / "broker").mkdir(exist_ok=True)
    broker = Mosquitto(workdir / "broker").start()
    broker_life = 1
    link = Link(broker.port)
    # the simulated sysfs trees in memory, as sysfs is: on a busy disk each of the plant's
    # atomic renames (a few a tick) costs milliseconds, the solar node's battery files most
    shm = Path(tempfile.mkdtemp(prefix="field-soak-", dir="/dev/shm"
                                if Path("/dev/shm").is_dir() else None))
    # the cabinet ticks every 2 s as the demo does; the solar node's control step (battery
    # and energy planning) costs ~4x the cabinet's a tick, and its sealed enclosure's time
    # constant is 40 minutes (r_case_amb x c_case): it ticks every 5 s
    nodes = {"cabinet": Node("cabinet", "rpi5", "cabinet", DEMO_SHARE, 0.95, 2.0,
                             workdir / "cabinet", shm / "cabinet", keys),
             "solar": Node("solar", "solar-node", "sun", 1.0, None, 5.0, workdir / "solar",
                           shm / "solar", keys, weather_seed=WEATHER_SEED)}
    enrolled: set[str] = set()
    bundle_id = ""
    disk = None
    coord = None
    samples: dict[str, list[tuple[Any, float, float, float, float, float]]] = defaultdict(list)
    t0 = time.monotonic()
    finished = False
    exit_codes: dict[str, int | None] = {}
    try:
        if "disk_full" not in left_out:
            disk = Disk(nodes["cabinet"].home / "state", 128)
        coord = Coordinator(workdir / "coordinator", broker, keys)
        if release.exists():  # published before the soak: the rollout is the fault
            bundle_id = coord.upload(release)["id"]
        for n in nodes.values():
            n.start(broker, link.port, speed, 0.0, end_h, source_hz, plan)
        say(f"field soak: {days} simulated days at {speed:g}x, faults: "
            + ", ".join(f"{f.fault.kind}@{f.fault.at_h:g}h/{f.fault.device}"
                        for f in faults if f.fault.kind != "kill9")
            + (", kill -9 of each daemon daily" if kills else "")
            + f"; left out: {', '.join(left_out) or 'none'}")
        last_sample = 0.0
        last_say = time.monotonic()
        while time.monotonic() - t0 < limit:
            time.sleep(0.2)
            for n in nodes.values():  # the simulated time each daemon reached
                if n.name not in enrolled and coord.enroll(n.name, n.state / "device.pub"):
                    enrolled.add(n.name)  # its command replies can be verified from now
                hs = [n.history_sim_h()]
                if (got := coord.latest_health(n.name)) is not None:
                    sim = got[1].get("simulated") or {}
                    hs.append(sim.get("t", 0) / 3600)
                    if isinstance(sim.get("battery_frac"), int | float):
                        n.battery_frac = min(1.0, max(0.0, sim["battery_frac"]))
                n.sim_h = max([n.sim_h, *(h for h in hs if h is not None)])
                if n.proc.poll() is not None and not n.killed:  # died on its own
                    n.crashes.append(f"exit {n.proc.returncode} at {n.sim_h:.2f} h")
                    say(f"  {n.name} exited {n.proc.returncode} at {n.sim_h:.2f} h: restarted")
                    n.start(broker, link.port, speed, n.sim_h, end_h, source_hz, plan)
            for s in faults:
                n = nodes[s.fault.device]
                if not s.wall_start and n.sim_h >= s.fault.at_h:
                    if s.fault.kind == "ota_update":
                        s.ota["bundle"] = bundle_id
                    broker_life += begin(s, n, nodes, broker, link, disk, coord, say)
                    if s.fault.kind == "kill9":
                        n.start(broker, link.port, speed, n.sim_h, end_h, source_hz, plan)
                if s.fault.kind == "ota_update" and s.wall_start:
                    follow_ota(s, n, coord, say)
                if s.wall_start and not s.done and n.sim_h >= s.fault.end_h:
                    finish(s, n, link, disk, coord)
            for s in faults:  # what each fault looked like, once things settled after it
                if s.done and not s.health and time.monotonic() - s.wall_end > 8:
                    observe(s, nodes[s.fault.device], coord)
            now = time.monotonic()
            if now - last_sample >= 1.0:
                last_sample = now
                sample(samples, nodes, coord, broker, broker_life)
            if now - last_say >= 30:
                last_say = now
                say(f"  wall {now - t0:4.0f} s: " + ", ".join(
                    f"{n.name} day {n.sim_h / DAY_H:.2f}" for n in nodes.values()))
            if all(n.sim_h >= end_h - 1e-6 for n in nodes.values()) and all(
                    s.done for s in faults):
                finished = True
                break
        for s in faults:
            if s.wall_start and not s.done:
                finish(s, nodes[s.fault.device], link, disk, coord)
            if s.done and not s.health:
                observe(s, nodes[s.fault.device], coord)
        # drain: every result made reaches the coordinator before the daemons stop
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(
                held_rows(n.state / "outbox.db") for n in nodes.values()):
            time.sleep(0.5)
        time.sleep(2.0)  # the last health of each daemon stored
        ota = {s.fault.device: ota_outcome(s, coord) for s in faults
               if s.fault.kind == "ota_update"}
        wall_s = time.monotonic() - t0
        for n in nodes.values():
            exit_codes[n.name] = n.stop()
        time.sleep(1.0)  # the last acks' rows committed
        exit_codes["coordinator"] = coord.stop()
        tallies = {n.name: asdict(tally(n.made(), coord.stored(n.name))) for n in
                   nodes.values()}
        daily = days_table(nodes, coord, end_h)
    finally:
        for n in nodes.values():
            if n.proc and n.proc.poll() is None:
                n.stop()
        if coord is not None and coord.proc.poll() is None:
            coord.stop()
        link.close()
        broker.stop()
        if disk is not None:
            disk.free()
            disk.unmount()
        shutil.rmtree(shm, ignore_errors=True)
    return Report(days, speed, round(wall_s, 1), finished, tallies, resources(samples),
                  [{**asdict(s.fault), "health": s.health, "coordinator": s.coordinator,
                    "note": s.note} for s in faults], daily, left_out,
                  {n.name: n.crashes for n in nodes.values()}, exit_codes,
                  {k: [[round(x, 3) for x in r] for r in v] for k, v in samples.items()},
                  ota)


def begin(s: Seen, n: Node, nodes: dict[str, Node], broker: Mosquitto, link: Link,
          disk: Disk | None, coord: Coordinator, say: Callable[[str], None]) -> int:
    """Start fault `s` (a kill -9 is over at once); 1 when the broker started a new life."""
    s.wall_start = time.monotonic()
    got = coord.latest_health(n.name)
    s.health_before = got[1] if got else None
    s.event_rowid = coord.max_event_rowid()
    s.log_offset = coord.log_size()
    kind, new_broker = s.fault.kind, 0
    if kind == "kill9":
        n.kill9()
        s.note = f"at {n.sim_h:.2f} h (life {n.lives})"
    elif kind == "broker_restart":
        broker.stop()
        time.sleep(2.0)  # down for 2 wall seconds, as a service restart
        broker.start()
        new_broker = 1
    elif kind == "network_cut":
        link.set_cut()
    elif kind == "disk_full":
        assert disk is not None
        disk.fill()
    elif kind == "dead_sensor":
        zone = load_profile(n.profile).thermal.zone
        (n.sysroot / DEAD_SENSORS).write_text(f"{zone}/temp\n")
    elif kind == "clock_jump":
        (n.home / "faketime").write_text("-1h\n")  # the wall clock steps back an hour
    elif kind == "ota_update":
        s.ota.update(sent_h=round(n.sim_h, 3), health_rowid=got[0] if got else 0)
        try:  # through the coordinator's API, as an operator would
            r = coord.roll_out(s.ota["bundle"], n.name)
            s.ota.update(rollout=r["id"], version=r["version"])
        except (api_client.ApiError, ValueError, KeyError, OSError) as e:
            # refused: a finding, reported
            s.ota["refused"] = str(e)[:300]
            say(f"  the rollout to {n.name} was refused: {e}")
    if s.fault.dur_h == 0:
        s.done, s.wall_end = True, time.monotonic()
    say(f"  {n.sim_h:7.2f} h  {kind} on {n.name}"
        + (f" for {s.fault.dur_h:g} h" if s.fault.dur_h else ""))
    return new_broker


def finish(s: Seen, n: Node, link: Link, disk: Disk | None, coord: Coordinator) -> None:
    """End fault `s`."""
    kind = s.fault.kind
    if kind == "network_cut":
        link.restore()
    elif kind == "disk_full" and disk is not None:
        disk.free()
    elif kind == "dead_sensor":
        (n.sysroot / DEAD_SENSORS).unlink(missing_ok=True)
    got = coord.latest_health(n.name)  # the newest the coordinator has from the fault
    s.health_during = got[1] if got else None
    s.done, s.wall_end = True, time.monotonic()
    s.note = f"{s.wall_end - s.wall_start:.1f} s of wall time"


def observe(s: Seen, n: Node, coord: Coordinator) -> None:
    """Record what the daemon's health and the coordinator said about fault `s`."""
    got = coord.latest_health(n.name)
    after = got[1] if got else None
    if s.fault.dur_h:  # before -> the newest health from during it; then -> after it
        s.health = ([f"during: {x}" for x in health_change(s.health_before, s.health_during)]
                    + [f"after: {x}" for x in health_change(s.health_during, after)])
    else:
        s.health = health_change(s.health_before, after)
    s.health = s.health or ["(no change)"]
    counts: dict[str, int] = defaultdict(int)
    for _, typ, sev in coord.events_after(n.name, s.event_rowid):
        counts[f"{typ}{'/' + sev if sev else ''}"] += 1
    said = [f"events {', '.join(f'{k} x{v}' for k, v in sorted(counts.items()))}"] if counts \
        else ["no event"]
    seen: list[str] = []
    for line in coord.log_lines(s.log_offset):  # its log: states and alerts, in order
        if s.fault.kind in ("broker_restart", "network_cut") and re.search(
                r"coordinator connected|disconnected from the broker|connection to the broker "
                r"was lost", line):
            what = re.sub(r"^\S+ \S+: |to 127\.0\.0\.1:\d+, ", "", line)[:70]
            if what not in seen:
                seen.append(what)
        if f"device {n.name}: " in line:
            what = re.sub(r"\(last seen [^)]*\)|/dev/shm/\S+/", "", line.split(
                f"device {n.name}: ", 1)[1]).strip()[:70]
            if what not in seen:
                seen.append(what)
    s.coordinator = said + seen[:5] + ([f"(+{len(seen) - 5} more)"] if len(seen) > 5 else [])


VERDICTS = ("model_probation_passed", "model_rolled_back", "model_deploy_failed")


def follow_ota(s: Seen, n: Node, coord: Coordinator, say: Callable[[str], None]) -> None:
    """Note the simulated hour of `n` when the soak first sees the coordinator hold the
    swap and then the probation's verdict (or a refusal) of OTA update `s`."""
    if "verdict" in s.ota or "refused" in s.ota:
        return
    for _, typ, body in coord.model_events(n.name, s.event_rowid):
        if typ == "model_swapped" and "swap_h" not in s.ota:
            s.ota["swap_h"] = round(n.sim_h, 3)
            say(f"  {n.sim_h:7.2f} h  {n.name} swapped to {body.get('to')} (probation)")
        elif typ in VERDICTS:
            got = coord.latest_health(n.name)
            s.ota.update(verdict=typ, verdict_h=round(n.sim_h, 3),
                         verdict_wall_s=round(time.monotonic() - s.wall_start, 1),
                         verdict_rowid=got[0] if got else 0,
                         reason=str(body.get("reason") or body.get("error") or "")[:300])
            say(f"  {n.sim_h:7.2f} h  {n.name}: {typ}"
                + (f" ({s.ota['reason']})" if s.ota["reason"] else ""))
            return


def ota_outcome(s: Seen, coord: Coordinator) -> dict[str, Any]:
    """How OTA update `s` ended, from what the coordinator holds: the model events it
    stored for the device since the rollout, the probation's figures, the rollout's state
    (its API), and the version every health since the verdict reported (kill -9 restarts
    after the update included) with the number of daemon lives they came from."""
    dev, o = s.fault.device, dict(s.ota)
    o["events"] = [typ for _, typ, _ in coord.model_events(dev, s.event_rowid)]
    for _, typ, body in coord.model_events(dev, s.event_rowid):
        if typ == "model_probation_passed":
            o["probation"] = {k: v for k, v in body.items() if k in (
                "frames", "errors", "p95_ms", "target_ms", "shadow_compared", "agreement",
                "energy_mj")}
    if o.get("rollout"):
        try:
            r = coord.api("GET", f"/api/v1/rollouts/{o['rollout']}")
            o["rollout_state"] = r["state"]
            o["device_state"] = r["devices"][dev]["state"]
        except (api_client.ApiError, ValueError, KeyError, OSError) as e:
            o["rollout_state"] = f"unreadable: {e}"[:200]
    after = coord.healths(dev, o.get("verdict_rowid", 0)) if o.get("verdict") else []
    o["served_after"] = sorted({str(h.get("model_version", "")) for _, _, h in after})
    o["lives_after"] = len({h.get("boot") for _, _, h in after})
    got = coord.latest_health(dev)
    o["model_version"] = got[1].get("model_version") if got else None
    return o


def sample(samples: dict, nodes: dict[str, Node], coord: Coordinator, broker: Mosquitto,
           broker_life: int) -> None:
    """One sample of each process: (life, simulated hour, RSS MB, fds, threads, disk MB)."""
    clock_h = nodes["cabinet"].sim_h
    for n in nodes.values():
        if (n.proc and n.proc.poll() is None and n.sim_h - n.life_start_h >= WARMUP_H
                and (u := usage(n.proc.pid)) is not None):
            samples[f"serve {n.name}"].append((n.lives, n.sim_h, *u, disk_mb(n.state)))
    for name, proc, life, path in (("coordinator", coord.proc, 1, coord.home),
                                   ("mosquitto", broker.proc, broker_life, None)):
        if (proc is not None and proc.poll() is None and clock_h >= WARMUP_H
                and (u := usage(proc.pid)) is not None):
            samples[name].append((life, clock_h, *u, disk_mb(path) if path else math.nan))


def resources(samples: dict) -> list[dict]:
    """Per process: first and last value of each figure and its slope per simulated day."""
    out = []
    for name, rows in samples.items():
        for i, what in ((2, "rss_mb"), (3, "fds"), (4, "threads"), (5, "disk_mb")):
            pts = [(r[0], r[1] / DAY_H, r[i]) for r in rows if not math.isnan(r[i])]
            if not pts:
                continue
            # disk is not reset by a restart: one line over the whole run
            slope = slope_within(pts if what != "disk_mb" else [(0, x, y) for _, x, y in pts])
            out.append({"process": name, "figure": what, "first": pts[0][2],
                        "last": pts[-1][2], "max": max(p[2] for p in pts),
                        "per_day": slope, "samples": len(pts)})
    return out


def days_table(nodes: dict[str, Node], coord: Coordinator, end_h: float) -> list[dict]:
    """Per device and simulated day: the highest die reading and the passive trip, the
    daemon's accuracy-weighted good inferences and the oracle's for the same day."""
    rows = []
    for n in nodes.values():
        dev = load_profile(n.profile)
        trip = dev.thermal.trip("passive").temp_c
        rungs = ladder(dev, n.floor)
        oracle = best_schedule(dev, rungs, ambient(*SCENARIOS[n.scenario]), 0.0, 86400.0,
                               rungs[-1].max_rate_hz() * n.share, LATENCY_MS / 1e3)
        temps: list[tuple[float, float]] = []
        lives: dict[str, list[tuple[float, float]]] = defaultdict(list)
        # the hottest health of each day, with what the governor said then: a day over the
        # trip is explained in the report, not only flagged (a rare 0.02 °C over, once)
        why: dict[int, tuple[float, str]] = {}
        for _, _, h in coord.healths(n.name):
            sim = h.get("simulated") or {}
            if not isinstance(sim.get("t"), int | float):
                continue
            hour = min(sim["t"] / 3600, end_h)  # the last life's start was rounded
            if isinstance(h.get("temp_c"), int | float):
                temps.append((hour, h["temp_c"]))
                d = day_of(hour)
                if h["temp_c"] > why.get(d, (-math.inf, ""))[0]:
                    why[d] = (h["temp_c"], _governor_said(hour, h))
            boot = str(h.get("boot", ""))
            if isinstance(sim.get("good_weighted"), int | float):
                lives[boot].append((hour, sim["good_weighted"]))
        for line in history_lines(n.state):  # readings the coordinator missed (the cut)
            if isinstance(line.get("sim_t"), int | float) and isinstance(
                    line.get("temp_c"), int | float):
                temps.append((min(line["sim_t"] / 3600, end_h), line["temp_c"]))
        hottest = per_day(temps)
        gains = gains_per_day(lives)
        for d in sorted(set(hottest) | set(gains)):
            rows.append({"device": n.name, "day": d + 1, "die_max_c": hottest.get(d),
                         "hottest_health": why.get(d, (None, None))[1],
                         "trip_c": trip, "good_weighted": gains.get(d),
                         "oracle": oracle.good_weighted,
                         "ratio": (gains[d] / oracle.good_weighted
                                   if gains.get(d) is not None and oracle.good_weighted
                                   else None)})
    return rows


def _governor_said(hour: float, h: dict) -> str:
    """One line of what a health says the governor was doing (its time, rung, level,
    filtered temperature and slope, reason, what it held back)."""
    g = h.get("governor") if isinstance(h.get("governor"), dict) else {}
    return (f"{hour:.2f} h rung {h.get('rung')}/{h.get('rungs')} level {g.get('level')} "
            f"filtered {g.get('temp_filtered_c')} °C slope {g.get('slope_c_per_min')} °C/min "
            f"cap {h.get('rate_cap_hz')} Hz: {g.get('reason')}; refused: {g.get('refused')}"
            )[:400]


def history_lines(state: Path) -> list[dict]:
    """The records of a daemon's health history (rotated file first)."""
    out = []
    for p in (state / "health-history.jsonl.1", state / "health-history.jsonl"):
        with contextlib.suppress(OSError):
            for line in p.read_text(errors="replace").splitlines():
                with contextlib.suppress(ValueError):
                    rec = json.loads(line)
                    if isinstance(rec, dict):
                        out.append(rec)
    return out


def fmt(x: Any, spec: str) -> str:
    """`x` formatted by `spec`, "-" for None."""
    return "-" if x is None else format(x, spec)


def render(r: Report) -> str:
    """The report as the bench prints it."""
    lines = [f"field soak: {r.days} simulated days at {r.speed:g}x in {r.wall_s:.0f} s of wall "
             f"time ({r.days * 86400 / max(r.wall_s, 1e-9):.0f}x achieved)"
             + ("" if r.finished else ": DID NOT FINISH in its wall-time limit"), "",
             "results        made   stored   lost   duplicated"]
    for name, t in r.tallies.items():
        lines.append(f"  {name:10s} {t['made']:6d}   {t['stored']:6d} {t['lost']:6d}   "
                     f"{t['duplicated']:6d}" + (f"   lost seqs {t['lost_seqs']}"
                                                if t["lost"] else ""))
    lines += ["", "resources (slope per simulated day; RSS/fds/threads within each life)",
              "  process            figure      first      last       max    per day   n"]
    for x in r.resources:
        lines.append(f"  {x['process']:18s} {x['figure']:8s} {x['first']:9.1f} "
                     f"{x['last']:9.1f} {x['max']:9.1f} {fmt(x['per_day'], '+9.3f')} "
                     f"{x['samples']:4d}")
    lines += ["", "faults (simulated hour, device): the daemon's health after it; the "
                  "coordinator's events"]
    for f in r.faults:
        lines.append(f"  {f['at_h']:7.2f} h {f['kind']:14s} {f['device']:8s} {f['note']}")
        lines.append(f"      health: {'; '.join(f['health'])}")
        lines.append(f"      coordinator: {'; '.join(f['coordinator'])}")
    lines += ["", "per simulated day: highest die reading vs the passive trip, governor / "
                  "oracle (accuracy-weighted good inferences)",
              "  device     day   die max   trip   daemon      oracle     ratio"]
    for d in r.daily:
        lines.append(f"  {d['device']:10s} {d['day']:3d}  {fmt(d['die_max_c'], '7.2f')} "
                     f"{d['trip_c']:6.1f} {fmt(d['good_weighted'], '10.0f')} "
                     f"{d['oracle']:10.0f}  {fmt(d['ratio'], '6.3f')}")
        if d.get("hottest_health"):
            lines.append(f"      hottest health: {d['hottest_health']}")
    if r.ota:
        lines += ["", "OTA update: the bundled model re-released as a new version (the same "
                      "network), rolled out through the coordinator's API",
                  "  device     sent h  swapped h  verdict h  wall s  verdict                 "
                  "serving now     rollout"]
        for dev, o in r.ota.items():
            lines.append(
                f"  {dev:10s} {fmt(o.get('sent_h'), '6.2f')}  {fmt(o.get('swap_h'), '9.2f')}  "
                f"{fmt(o.get('verdict_h'), '9.2f')}  {fmt(o.get('verdict_wall_s'), '6.1f')}  "
                f"{o.get('verdict') or o.get('refused') or 'none':23s} "
                f"{o.get('model_version') or 'configured':15s} "
                f"{o.get('rollout_state', '-')}/{o.get('device_state', '-')}")
            lines.append(f"      events: {', '.join(o.get('events', [])) or 'none'}"
                         + (f"; {o['reason']}" if o.get("reason") else ""))
            if o.get("probation"):
                lines.append("      probation: " + ", ".join(
                    f"{k} {v}" for k, v in o["probation"].items()))
            lines.append(f"      every health since the verdict: "
                         f"{', '.join(o.get('served_after', [])) or '-'} "
                         f"(from {o.get('lives_after', 0)} daemon lives)")
    if r.left_out:
        lines += ["", "left out:"] + [f"  {k}: {v}" for k, v in r.left_out.items()]
    crashes = {k: v for k, v in r.crashes.items() if v}
    lines.append("")
    lines.append(f"crashes (exits the soak did not cause): {crashes or 'none'}; exit codes "
                 f"at the end: {r.exit_codes}")
    rss = [x["per_day"] for x in r.resources if x["figure"] == "rss_mb"
           and x["process"].startswith("serve") and x["per_day"] is not None]
    lost = sum(t["lost"] for t in r.tallies.values())
    dup = sum(t["duplicated"] for t in r.tallies.values())
    lines.append(f"targets: lost {lost} (0), duplicated {dup} (0), daemons' RSS slope "
                 f"{', '.join(f'{s:+.3f}' for s in rss)} MB/day (< {TARGET_RSS_MB_PER_DAY:g})"
                 + "".join(f", {dev} {o.get('verdict') or 'no verdict'} serving "
                           f"{o.get('model_version') or 'configured'}"
                           for dev, o in r.ota.items()))
    return "\n".join(lines)


def main() -> None:
    """The command line (module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=14)
    ap.add_argument("--speed", type=float, default=1500.0,
                    help="simulated seconds per wall second (lockstep: slower on a busy host)")
    ap.add_argument("--source-hz", type=float, default=5.0,
                    help="the synthetic cameras' frames per wall second")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    ap.add_argument("--wall-limit", type=float, default=None,
                    help="stop after this many wall seconds (default: 600 + 4x the days at "
                         "--speed); the report then says it did not finish")
    ap.add_argument("--no-kill", action="store_true",
                    help="no daily kill -9: one life per daemon, for the RSS slope")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="field-soak-") as tmp:
        r = soak(a.workdir or Path(tmp), a.days, a.speed, a.source_hz, a.wall_limit,
                 kills=not a.no_kill)
    print(render(r))
    if a.json:
        a.json.write_text(json.dumps(asdict(r), indent=1))


if __name__ == "__main__":
    main()
