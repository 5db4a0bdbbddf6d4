"""Daemon in the loop: the real `edgerun serve` process against the simulated plant.

The daemon runs with its in-process simulator (runtime/device/simdevice.py) in lockstep: the
plant moves only as the daemon's control loop ticks (exactly tick_s a tick, paced to `speed`
when the host keeps up), it is heated by the rung and rate the daemon actually chose, the
sensors read the sysfs tree the plant writes, and the control step is the shipped one.
Profiles are replayed from a recording (`simulator.profiles`) so runs repeat; the sessions are
real. So the decisions do not depend on how busy the host is, only the wall time does. The
tally arrives in the daemon's own health messages (health["simulated"]), read here from its
outbox.

Used by bench/governor.py --daemon and tests/tools/test_daemon_loop.py.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from power.governor import GovernorConfig

# The backends the reference profiles (models/inspection/reference-profiles.json) were recorded
# with (bench/data/ladder-profile.toml): a replay finds a variant only under the same id.
REFERENCE_BACKENDS = """\
[backends]
enabled = ["onnxruntime", "openvino"]
threads = [1]

[backends.onnxruntime]
spinning = [false]
include_default = false

[backends.openvino]
precision_hints = ["f32"]
"""

CONFIG = """\
[device]
profile = "{device}"

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
policy = "{policy}"
tick_s = {tick_s}
rate_hz = {rate_hz}
min_rate_hz = {min_rate_hz}
band_c = {band_c}

[simulator]
enabled = true
scenario = "{scenario}"
speed = {speed}
start_hour = {start_hour}
hours = {hours}
profiles = "{profiles}"
offered_share = {offered_share}
battery_frac = {battery_frac}

[daemon]
state_dir = "{state}"

[telemetry]
device = "loop"
health_interval_s = 0.25

[telemetry.outbox]
path = "{state}/outbox.db"
# no broker here: health reaches the outbox's database (where the loop reads the tally) at
# once, not after the minute a device on a link waits for its broker
spill_after_s = 0.0
"""


@dataclass(frozen=True)
class LoopResult:
    """What the daemon-in-the-loop run delivered (health["simulated"]) and how it ended."""

    simulated: dict
    health: dict
    wall_s: float
    exit_code: int
    log: str


def latest_health(outbox: Path) -> dict | None:
    """The newest health message in a daemon's outbox, or None."""
    try:
        con = sqlite3.connect(f"file:{outbox}?mode=ro", uri=True, timeout=1)
        try:
            row = con.execute("SELECT body FROM other WHERE kind='health' "
                              "ORDER BY id DESC LIMIT 1").fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return json.loads(row[0]) if row else None


def run(workdir: Path, device: str, scenario: str, policy: str, hours: float, rate_hz: float,
        profiles: Path, speed: float = 300.0, start_hour: float = 8.0, tick_s: float = 1.0,
        latency_ms: float = 20.0, min_rate_hz: float = 0.2, source_hz: float = 20.0,
        timeout_s: float | None = None, extra: str = "",
        band_c: float = GovernorConfig.band_c, accuracy_floor: float | None = None,
        offered_share: float = 1.0, battery_frac: float = 1.0) -> LoopResult:
    """Run `edgerun serve` until `hours` of simulated time have passed (its simulated clock
    stops there: [simulator] hours); SIGTERM; the tally, of exactly `hours`.
    `source_hz`: the synthetic camera's frames per wall second at `speed` (it offers them per
    simulated second, source_hz / speed: a slowed run offers fewer). `extra` is appended to
    the config (e.g. a `[sleep]` section). `accuracy_floor`: [constraints]'s (None: its
    default; the demo's is 0.95); `offered_share`: [simulator]'s, with `rate_hz` 0;
    `battery_frac`: [simulator]'s, the battery's charge at the start."""
    state = workdir / "state"
    state.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "edgerun.toml"
    cfg.write_text(CONFIG.format(device=device, scenario=scenario, policy=policy, speed=speed,
                                 hours=hours,
                                 start_hour=start_hour, profiles=profiles.resolve(),
                                 state=state, rate_hz=rate_hz, tick_s=tick_s,
                                 latency_ms=latency_ms, min_rate_hz=min_rate_hz, band_c=band_c,
                                 offered_share=offered_share, battery_frac=battery_frac,
                                 floor_line="" if accuracy_floor is None else
                                 f"accuracy_floor = {accuracy_floor}",
                                 source_hz=source_hz / speed,
                                 backends=REFERENCE_BACKENDS) + extra)
    log = workdir / "daemon.log"
    t0 = time.monotonic()
    # lockstep: a busy host runs slower than `speed` (never differently); 50x counted on
    limit = timeout_s if timeout_s is not None else 120 + 3 * hours * 3600 / min(speed, 50.0)
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--config",
                                 str(cfg)], stdout=out, stderr=subprocess.STDOUT)
        health = None
        try:
            while time.monotonic() - t0 < limit and proc.poll() is None:
                time.sleep(0.25)
                h = latest_health(state / "outbox.db")
                if h and h.get("simulated", {}).get("elapsed_s", 0) >= hours * 3600:
                    health = h
                    break
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    text = log.read_text()
    if health is None:
        raise RuntimeError(f"the daemon did not reach {hours} simulated hours in {limit:.0f} s "
                           f"(exit {proc.returncode}); its log:\n{text[-3000:]}")
    return LoopResult(health["simulated"], health, time.monotonic() - t0, proc.returncode, text)
