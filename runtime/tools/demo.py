"""`edgerun demo`: broker + coordinator + daemon on the bundled model, with a live view.

Everything a new user needs, started by one command: a local MQTT broker (Mosquitto when it
is installed, otherwise the pure-Python amqtt broker of the `[demo]` extra), the coordinator
(`edgerun coordinator`), and `edgerun serve` running the bundled inspection model on the
synthetic conveyor, on a simulated Raspberry Pi 5 in a cabinet that gets the midday sun (time
accelerated). The live view prints one line per second from what the coordinator received
(through its API, as `edgerun fleet` reads it); watch the rung step down as the die heats
towards its trip point and back up as it cools. Ctrl-C stops it all.

Processes: the broker, the coordinator and the daemon each run in a process group of their
own, so a Ctrl-C (SIGINT to the terminal's foreground group) reaches only this process, which
stops them in order: the daemon (its outbox drained to the coordinator), the coordinator, the
broker. SIGTERM and SIGHUP (a closed terminal) stop it the same way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from models import bundled
from runtime.config.paths import user_cache
from runtime.config.telemetry import BrokerConfig
from runtime.device.sensing import RefusalWatch
from runtime.tools.simloop import REFERENCE_BACKENDS
from runtime.wire.broker import Mosquitto, free_port, mosquitto_path, wait_port
from runtime.wire.brokerauth import (
    DEVICE_PUBLISHES,
    DEVICE_SUBSCRIBES,
    PREFIX,
    connection_username,
    device_username,
    new_password,
    write_secret,
)
from runtime.wire.commands import generate_keypair
from runtime.wire.events import EventType

log = logging.getLogger("edgerun.demo")


def say(*args: Any, **kw: Any) -> None:
    """say(), but a terminal that went away (SSH dropped, `edgerun demo | head`) must not
    stop the stop half-way, leaving the broker, the coordinator and the daemon running: after
    the first broken pipe the rest of the view goes nowhere."""
    try:
        print(*args, **kw)
    except (BrokenPipeError, ValueError):  # ValueError: stdout already closed
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (for the rest of the process)

KEEP_LOGS = 5  # daemon logs of past demos kept in the user's cache (the oldest go first)

# the events the demo prints besides a rung change: what the governor and sensors decide
SHOWN = (EventType.GOVERNOR, EventType.SENSOR_INVALID, EventType.SENSOR_HOLD,
         EventType.REPROFILE, EventType.PHYSICS_BOUNDED, EventType.GOVERNOR_DISABLED)

# The simulated line's camera offers 60 % of what the top rung can take on all four cores: on
# the cabinet's nights (22 °C) the top rung runs at that rate ~5 °C under the trip, in its
# afternoon (42 °C) not even the cheapest rung can, so the day shows the step down, the hold
# and the climb back (at the top rung's full rate no rung but the cheapest settles under the
# trip even at night: the demo then ran that rung until morning).
OFFERED_SHARE = 0.6

DEMO_CONFIG = """\
[device]
profile = "{device}"

[constraints]
latency_ms = 20.0
accuracy_floor = 0.95

[profiler]
warmup_runs = 3
min_runs = 20
max_runs = 400
time_budget_s = 0.25
idle_baseline_s = 0.3
cache_dir = "{state}/profiles"

{backends}
[source]
kind = "synthetic"
rate_hz = {rate}               # per simulated second: the conveyor's --rate a wall second at pace

[governor]
policy = "step_wise"
tick_s = 2.0
rate_hz = 0                    # the simulated camera's rate: [simulator] offered_share

[simulator]
enabled = true
scenario = "{scenario}"
speed = {speed}
start_hour = {start_hour}
profiles = "{profiles}"        # the bundled model's reference profiles: the demo repeats
offered_share = {offered_share}  # the camera: this share of what the top rung takes on 4 cores

[daemon]
state_dir = "{state}"

[telemetry]
fleet = "demo"
device = "demo-box"
health_interval_s = 1.0
trusted_keys = ["{state}/command.pub"]

[telemetry.broker]
host = "127.0.0.1"
port = {port}
keepalive_s = 10
username = "{username}"
password_file = "{password_file}"

[telemetry.outbox]
path = "{state}/outbox.db"
"""


COORDINATOR_CONFIG = """\
[coordinator]
fleet = "demo"
store = "{state}/coordinator.db"
signing_key = "{state}/command.pem"
device_keys = "{device_keys}"
stale_after_s = 5
offline_after_s = 15
http_host = "127.0.0.1"
http_port = {http_port}

[coordinator.broker]
host = "127.0.0.1"
port = {port}
username = "{username}"
password_file = "{password_file}"
"""

# One line an operator can act on, when neither broker is there (amqtt is the `[demo]` extra:
# a fleet device has no use for it, and it pulls in typer, rich and pydantic).
MISSING_BROKER = ("edgerun demo needs an MQTT broker and found none: install Mosquitto "
                  "(sudo apt install mosquitto) or the demo extra (pip install 'edgerun[demo]'; "
                  "from a checkout: pip install '.[demo]')")
_AMQTT_MAIN = ("import sys; from amqtt.scripts.broker_script import main; "
               "sys.argv[0] = 'amqtt'; sys.exit(main())")


class EmbeddedBroker:
    """amqtt in a child process, for machines without Mosquitto (pure pip install).

    Authenticated like Mosquitto: amqtt's FileAuthPlugin (argon2 password file) and its
    TopicAccessControlListPlugin with the same grants as the Mosquitto ACL, spelled out per
    user (amqtt has no %u patterns, and it cannot reload, so identities are enrolled before
    `start`). One difference: amqtt checks subscriptions and publishes, not each delivery.
    """

    def __init__(self, workdir: Path):
        self.port = free_port()
        self.workdir = workdir
        self.conf = workdir / "amqtt.yaml"
        self.passwd = workdir / "amqtt-passwd"
        self._users: dict[str, tuple[str, list[str], list[str]]] = {}  # hash, publish, subscribe
        self.proc: subprocess.Popen | None = None

    def _enrol(self, username: str, publish: list[str], subscribe: list[str],
               extra: tuple[tuple[str, list[str], list[str]], ...] = ()) -> BrokerConfig:
        if self.proc is not None:
            raise RuntimeError("amqtt cannot reload its users: enrol before start()")
        from pwdlib.hashers.argon2 import Argon2Hasher

        password = new_password()
        # The password is 256 random bits: argon2's cost only slows each login down.
        hashed = Argon2Hasher(time_cost=1, memory_cost=8192, parallelism=1).hash(password)
        self._users[username] = (hashed, publish, subscribe)
        # its extra connections (brokerauth.connection_username), same password; amqtt
        # cannot bind client ids to usernames, so this only lets them log in
        for purpose, pub, sub in extra:
            self._users[connection_username(username, purpose)] = (hashed, pub, sub)
        pw_file = write_secret(self.workdir / "broker-creds" /
                               (username.replace("/", "__") + ".password"), password)
        return BrokerConfig(host="127.0.0.1", port=self.port, username=username,
                            password_file=str(pw_file))

    def device(self, fleet: str, device: str) -> BrokerConfig:
        """Credentials of a device confined to its own topics."""
        base = f"{PREFIX}/{device_username(fleet, device)}"
        return self._enrol(device_username(fleet, device),
                           [f"{base}/{k}" for k in DEVICE_PUBLISHES],
                           [f"{base}/{k}" for k in DEVICE_SUBSCRIBES],
                           (("bundles", [f"{base}/bundle/req"], [f"{base}/bundle/chunk"]),))

    def coordinator(self, fleet: str, name: str = "coordinator") -> BrokerConfig:
        """Credentials of a coordinator of `fleet`."""
        return self._enrol(name, [f"{PREFIX}/{fleet}/+/cmd", f"{PREFIX}/{fleet}/+/ack"],
                           [f"{PREFIX}/{fleet}/+/#"],
                           (("bundles", [f"{PREFIX}/{fleet}/+/bundle/chunk"],
                             [f"{PREFIX}/{fleet}/+/bundle/req"]),))

    def start(self, own_group: bool = False) -> EmbeddedBroker:
        """Write the config and password file, start it and wait for the port; `own_group`:
        in its own process group (see Mosquitto.start)."""
        if not amqtt_available():
            raise RuntimeError(MISSING_BROKER)
        write_secret(self.passwd, "\n".join(f"{u}:{h}" for u, (h, _, _) in self._users.items()))
        pub = {u: p for u, (_, p, _) in self._users.items()}
        sub = {u: s for u, (_, _, s) in self._users.items()}
        # JSON is YAML: every name and topic is quoted safely
        self.conf.write_text(
            "listeners:\n  default:\n    type: tcp\n"
            f"    bind: 127.0.0.1:{self.port}\n"
            "plugins:\n  amqtt.plugins.authentication.AnonymousAuthPlugin:\n"
            "    allow_anonymous: false\n"
            "  amqtt.plugins.authentication.FileAuthPlugin:\n"
            f"    password_file: {json.dumps(str(self.passwd))}\n"
            "  amqtt.plugins.topic_checking.TopicAccessControlListPlugin:\n"
            f"    publish_acl: {json.dumps(pub)}\n    acl: {json.dumps(sub)}\n")
        # Through this interpreter, not the `amqtt` script: a venv's bin/ is often not on PATH
        # (`/opt/edgerun/venv/bin/edgerun demo`), but its packages are importable here.
        self.proc = subprocess.Popen([sys.executable, "-c", _AMQTT_MAIN, "-c", str(self.conf)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     process_group=0 if own_group else None)
        wait_port(self.port, 20)
        return self

    def stop(self) -> None:
        """Stop it."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def amqtt_available() -> bool:
    """True when the demo's fallback broker (the `[demo]` extra) can be imported."""
    try:
        import amqtt  # noqa: F401
    except ImportError:
        return False
    return True


def broker_available() -> bool:
    """True when the demo can start a broker: Mosquitto on PATH, or amqtt importable."""
    return bool(mosquitto_path()) or amqtt_available()


def make_broker(workdir: Path) -> Mosquitto | EmbeddedBroker:
    """Mosquitto when installed, else amqtt; both authenticated, not yet started."""
    if mosquitto_path():
        return Mosquitto(workdir)
    log.warning("mosquitto is not installed: the demo uses the pure-Python amqtt broker "
                "(password file and per-user topic lists; fine for a demo, not for a fleet)")
    return EmbeddedBroker(workdir)


def _clock(sim_t: float | None) -> str:
    if sim_t is None:
        return "--:--"
    h = (sim_t % 86400) / 3600
    return f"{int(h):02d}:{int(h % 1 * 60):02d}"


class PaceNotice:
    """One line when the simulation falls behind its speed (the host is too busy) and one
    when it is back, from health["simulated"] (runtime/device/simdevice.py)."""

    def __init__(self) -> None:
        self.slowed = False

    def seen(self, sim: dict) -> str | None:
        """The line to print for this health's pace, if it changed."""
        slowed = bool(sim.get("slowed"))
        if slowed == self.slowed:
            return None
        self.slowed = slowed
        target, got = sim.get("speed"), sim.get("speed_x")
        if slowed:
            return (f"  pace: this host is too busy for {target or 0:g}x: the simulation runs "
                    f"at {got or 0:.0f}x (slower, same decisions)")
        return f"  pace: back at {target or 0:g}x"


def live_line(view: dict, stored: int) -> str:
    """One line of the live view from a device's view in the coordinator."""
    h = view.get("health") or {}
    p = h.get("pipeline", {})
    lat = p.get("latency_ms", {})
    sim = h.get("simulated", {})
    temp, trip = h.get("temp_c"), h.get("passive_trip_c")
    rate = p.get("rate_hz") or 0.0
    return (f"{_clock(sim.get('t'))} amb {sim.get('ambient_c', float('nan')):5.1f}°C  "
            f"die {temp if temp is not None else float('nan'):5.1f}°C (trip {trip or 0:.0f})  "
            f"rung {h.get('rung', 0)}/{h.get('rungs', 0)} {h.get('choice', '-'):<44} "
            f"acc {h.get('accuracy', 0):.3f}  {h.get('power_w') or 0:4.2f} W  {rate:5.1f}/s  p95 "
            f"{lat.get('p95') or 0:6.2f} ms  stored {stored}")


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _on_stop_signals(flag: list[int]) -> dict[int, object]:
    """Make SIGINT (Ctrl-C), SIGTERM (kill, systemd) and SIGHUP (the terminal closed) append
    to `flag` (a plain list: a handler that takes a lock can deadlock), so the demo's loop
    stops and the stop runs to the end even through a second Ctrl-C. Returns the previous
    handlers; nothing is changed off the main thread (signals are delivered there only)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, lambda signum, _frame: flag.append(signum))
            for sig in STOP_SIGNALS}


def _device_keys(state: Path, device: str) -> Path:
    """The device's reply-signing key made before its first start, where its daemon looks
    (`state/device.key`), and its public half in a coordinator device_keys directory, so the
    first command's reply comes back verified. Returns that directory."""
    keys = state / "device-keys"
    generate_keypair(state / "device.key", state / "device.pub")
    keys.mkdir(exist_ok=True)
    shutil.copyfile(state / "device.pub", keys / f"{device}.pub")
    return keys


def outbox_backlog(path: Path) -> tuple[int, int]:
    """(results the device made, results not yet acked by the coordinator) of a stopped
    daemon's outbox."""
    from runtime.config.telemetry import OutboxConfig
    from runtime.telemetry.outbox import Outbox

    box = Outbox(OutboxConfig(path=str(path)))
    try:
        return box.last_seq(), box.stats()["results_held"]
    finally:
        box.close()


def _stop_child(proc: subprocess.Popen, what: str, log_file: Path) -> None:
    """SIGTERM and wait: the daemon drains its outbox to the coordinator and says goodbye; the
    coordinator commits what it took in and closes its store."""
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)
        if proc.returncode is None:
            say(f"the {what} did not stop within 30 s of SIGTERM: killed; see its log",
                  flush=True)
            proc.kill()
            proc.wait()
        elif proc.returncode != 0:
            say(f"the {what} exited with code {proc.returncode} on stop; its log ends:\n"
                  + log_file.read_text()[-2000:], flush=True)


class CoordinatorProcess:
    """`edgerun coordinator` in a process group of its own, and the API calls the demo makes
    of it (the fleet view, a device's events), with its API token."""

    def __init__(self, cfg_path: Path, log_file: Path, token_file: Path, http_port: int):
        self.cfg_path, self.log_file, self.token_file = cfg_path, log_file, token_file
        self.url = f"http://127.0.0.1:{http_port}"
        self.http_port = http_port
        self.proc: subprocess.Popen | None = None
        self._token = ""

    def start(self, timeout_s: float = 60.0) -> None:
        """Start it and wait until its API answers and it is subscribed to the fleet's
        topics; RuntimeError (with its log's end) when it exits or does not get there."""
        self.proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "coordinator",
                                      "--config", str(self.cfg_path)],
                                     stdout=self.log_file.open("w"), stderr=subprocess.STDOUT,
                                     process_group=0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:  # read again each time: the first read may catch the file half-written
                self._token = self.token_file.read_text().strip()
                if self.get("/api/v1/stats").get("connected"):
                    return
            except (OSError, ValueError):  # not listening yet, or the token not yet written
                pass
            time.sleep(0.1)
        raise RuntimeError("the coordinator did not start (code "
                           f"{self.proc.poll()}); its log ends:\n"
                           + self.log_file.read_text()[-2000:])

    def alive(self) -> bool:
        """Whether its process runs."""
        return self.proc is not None and self.proc.poll() is None

    def get(self, path: str) -> Any:
        """GET one API path, decoded (OSError when it cannot be reached)."""
        req = urllib.request.Request(self.url + path,
                                     headers={"Authorization": f"Bearer {self._token}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def fleet_view(self) -> list[dict]:
        """Every device's view (GET /api/v1/fleet)."""
        return self.get("/api/v1/fleet")

    def events(self, device: str) -> list[dict]:
        """The device's latest events, newest first (its detail view's)."""
        return self.get(f"/api/v1/devices/{device}")["events"]

    def stop(self) -> None:
        """SIGTERM and wait (see _stop_child)."""
        if self.proc is not None:
            _stop_child(self.proc, "coordinator", self.log_file)


def _goodbye_seen(coord: CoordinatorProcess, device: str,
                  timeout_s: float = 10.0) -> dict | None:
    """The device's view once the coordinator has taken in its goodbye (status no longer
    online), or its last view after `timeout_s`; None if it was never heard from."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            view = {v["device"]: v for v in coord.fleet_view()}.get(device)
        except (OSError, ValueError):  # the coordinator is gone: nothing more to learn
            return None
        if view is None or view["status"] != "online" or time.monotonic() > deadline:
            return view
        time.sleep(0.1)


def _new_events(events: list[dict], last: str | None) -> list[dict]:
    """The events (newest first) after the one printed last (its JSON), oldest first."""
    keys = [json.dumps(ev, sort_keys=True) for ev in events]
    fresh = events[:keys.index(last)] if last in keys else events
    return list(reversed(fresh))


def event_line(ev: dict) -> str | None:
    """The live view's line for one event: a rung change or one of SHOWN; None otherwise."""
    if ev["type"] == EventType.RUNG_CHANGED:
        return (f"  rung -> {ev.get('rung')}/{ev.get('rungs')}: "
                f"{ev['from'].split('@')[0]} -> {ev['to'].split('@')[0]} "
                f"({ev.get('reason', '')})")
    if ev["type"] in SHOWN:
        detail = ev.get("detail") or ev.get("reason") or ev.get("problems")
        return f"  {ev['type']}: {detail}"
    return None


def span(seconds: float) -> str:
    """Simulated time for the summary: `6h10m`, `12m`, `40s`."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m" if s >= 60 else f"{s}s"


def summary_lines(health: dict, rung_of: dict[str, int]) -> list[str]:
    """The demo's closing summary from the device's last health: the highest die
    temperature against the passive trip, and the simulated time on each rung (top rung
    first; `rung_of`: the rung number of each variant the live view saw, by variant id)."""
    sim = health.get("simulated") or {}
    elapsed, peak = sim.get("elapsed_s"), sim.get("die_max_c")
    if elapsed is None or peak is None:
        return ["summary: the device sent no simulated tally (an older daemon?)"]
    trip, rungs = health.get("passive_trip_c"), health.get("rungs", 0)
    against = (f"{trip - peak:.1f} °C under the {trip:.0f} °C trip" if peak < trip
               else f"{peak - trip:.1f} °C over the {trip:.0f} °C trip") \
        if trip is not None else "no passive trip known"
    out = [f"summary: {span(elapsed)} simulated (up to the last health); highest die "
           f"{peak:.1f} °C, {against}; {sim.get('critical_trips', 0)} critical trips, "
           f"{sim.get('rung_changes', 0)} rung changes"]
    runs = sorted((sim.get("rung_s") or {}).items(),
                  key=lambda kv: (-rung_of.get(kv[0], 0), kv[0]))
    for vid, secs in runs:
        if not vid:
            out.append(f"  no rung (paused): {span(secs)}")
            continue
        n = rung_of.get(vid)
        out.append(f"  rung {n if n is not None else '?'}/{rungs} {vid.split('@')[0]}: "
                   f"{span(secs)}")
    return out


def keep_last(folder: Path, pattern: str, keep: int) -> list[Path]:
    """Delete all but the newest `keep` files of `folder` matching `pattern` (by name: the
    names carry their time); returns those deleted."""
    old = sorted(folder.glob(pattern))[:-keep] if keep > 0 else sorted(folder.glob(pattern))
    for f in old:
        with contextlib.suppress(OSError):
            f.unlink()
    return old


class _Demo:
    """One demo's processes and files, started and stopped in order (see module docstring)."""

    DEVICE = "demo-box"

    def __init__(self, workdir: Path, terminated: list[int]):
        self.workdir, self.state = workdir, workdir / "state"
        self.state.mkdir(parents=True, exist_ok=True)
        self.terminated = terminated
        self.broker = make_broker(workdir)
        # Authenticated like a real fleet: each side logs in as itself and the broker's ACL
        # confines it (see docs/security.md); enrolled before start (amqtt cannot reload).
        self.device_login = self.broker.device("demo", self.DEVICE)
        self.coord_login = self.broker.coordinator("demo")
        self.coord: CoordinatorProcess | None = None
        self.daemon: subprocess.Popen | None = None
        self.daemon_log = workdir / "daemon.log"
        self.kept_log = user_cache("demo") / time.strftime("daemon-%Y%m%d-%H%M%S.log")
        self.rung_of: dict[str, int] = {}  # each variant's rung, as the live view saw them
        self.refusals = RefusalWatch(every_s=30.0)  # why the rung holds low, in wall seconds
        self.why_stop = "the demo ended"

    def start(self, device: str, scenario: str, speed: float, start_hour: float,
              rate: float) -> None:
        """The broker, the coordinator, then the daemon (unless a stop came meanwhile)."""
        self.broker.start(own_group=True)
        say(f"broker: {type(self.broker).__name__} on 127.0.0.1:{self.broker.port} "
              "(authenticated, ACL on)", flush=True)
        state = self.state
        generate_keypair(state / "command.pem", state / "command.pub")
        cfg_path = self.workdir / "edgerun.toml"
        cfg_path.write_text(DEMO_CONFIG.format(
            device=device, state=state, rate=f"{rate / speed:.6g}", scenario=scenario,
            speed=speed,
            profiles=bundled() / "reference-profiles.json", backends=REFERENCE_BACKENDS,
            start_hour=start_hour, port=self.broker.port, offered_share=OFFERED_SHARE,
            username=self.device_login.username,
            password_file=self.device_login.password_file))
        self._start_coordinator()
        url = self.coord.url  # type: ignore[union-attr]
        say(f"coordinator API: {url}/api/v1/fleet (try: edgerun fleet --api {url} "
              f"--token-file {state / 'api-token'} ls)", flush=True)
        say(f"dashboard: {url}/ (token: the content of {state / 'api-token'})", flush=True)
        say(f"daemon: edgerun serve --config {cfg_path} (log: {self.daemon_log}; kept "
              f"afterwards as {self.kept_log}, with the last {KEEP_LOGS} demos' logs)",
              flush=True)
        say(f"simulated {device}, scenario {scenario}, {speed:g}x from {start_hour:g}:00, "
              "in lockstep with the daemon's control loop (a busy host slows the simulation "
              "down, it does not change what the governor sees): the simulated camera offers "
              f"frames at {OFFERED_SHARE:.0%} of what the top rung can take on all cores (a "
              "line's fixed rate); the live view's frames/s is "
              "this host's real pipeline", flush=True)
        say("the simulated device's ladder: the bundled model's reference profiles (CI "
              "machine, scaled to the device profile), so the demo repeats; `edgerun profile "
              "inspection` measures this host", flush=True)
        if not self.terminated:  # a Ctrl-C during the start: nothing more to start
            self.daemon = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve",
                                            "--config", str(cfg_path)],
                                           stdout=self.daemon_log.open("w"),
                                           stderr=subprocess.STDOUT, process_group=0)

    def _start_coordinator(self) -> None:
        http_port = free_port()
        cfg_path = self.workdir / "coordinator.toml"
        cfg_path.write_text(COORDINATOR_CONFIG.format(
            state=self.state, device_keys=_device_keys(self.state, self.DEVICE),
            http_port=http_port, port=self.broker.port, username=self.coord_login.username,
            password_file=self.coord_login.password_file))
        self.coord = CoordinatorProcess(cfg_path, self.workdir / "coordinator.log",
                                        self.state / "api-token", http_port)
        self.coord.start()

    def watch(self, duration_s: float) -> int:
        """The live view, a line a second, until a stop signal, `duration_s` (when > 0) or a
        child's exit (1)."""
        started = time.monotonic()
        last: str | None = None
        pace = PaceNotice()
        coord = self.coord
        while self.daemon is not None and coord is not None and not self.terminated:
            time.sleep(1.0)
            if self.terminated:
                break
            if self.daemon.poll() is not None:
                self.why_stop = "the daemon exited"
                say(f"the daemon exited with code {self.daemon.returncode}; its log:\n"
                      + self.daemon_log.read_text()[-3000:], flush=True)
                return 1
            if not coord.alive():
                self.why_stop = "the coordinator exited"
                say(f"the coordinator exited with code {coord.proc.poll()}; its log:\n"
                      + coord.log_file.read_text()[-3000:], flush=True)
                return 1
            try:
                last = self._show(coord, pace, last)
            except (OSError, ValueError) as e:  # a slow answer: the next second tries again
                log.debug("live view: the coordinator API did not answer: %s", e)
            if duration_s and time.monotonic() - started > duration_s:
                self.why_stop = f"--duration {duration_s:g} s reached"
                break
        return 0

    def _show(self, coord: CoordinatorProcess, pace: PaceNotice, last: str | None
              ) -> str | None:
        """One second of the live view: the device's line, a pace notice, its new events.
        Returns the newest event shown (the next call's `last`)."""
        view = {v["device"]: v for v in coord.fleet_view()}.get(self.DEVICE)
        if not view or not view.get("health"):
            return last
        h = view["health"]
        if h.get("choice"):  # a rung change's event says it for sure (health may lag a tick)
            self.rung_of.setdefault(h["choice"], h.get("rung", 0))
        say(live_line(view, view["results_stored"]), flush=True)
        if (line := pace.seen(view["health"].get("simulated", {}))) is not None:
            say(line, flush=True)
        refused = (h.get("governor") or {}).get("refused") or ""
        if self.refusals.due(refused, time.monotonic()):  # a new reason, or every 30 s
            say(f"  not stepping up: {refused}", flush=True)
        events = coord.events(self.DEVICE)
        for ev in _new_events(events, last):
            if ev["type"] == EventType.RUNG_CHANGED and ev.get("to"):
                self.rung_of[ev["to"]] = ev.get("rung", 0)
            if (line := event_line(ev)) is not None:
                say(line, flush=True)
        return json.dumps(events[0], sort_keys=True) if events else last

    def stop(self, code: int) -> int:
        """Stop everything in order: the daemon first, while the coordinator and the broker
        are there to take its last results and its goodbye; then the coordinator; the broker
        last. Returns the demo's exit code (1 when a result was left unacked)."""
        # said whatever stops it (a signal, --duration, a child's exit), terminal or not
        why = (signal.Signals(self.terminated[0]).name if self.terminated else self.why_stop)
        say(f"\nstopping ({why}): the daemon, then the coordinator, then the broker...",
              flush=True)
        if self.daemon is not None:
            _stop_child(self.daemon, "daemon", self.daemon_log)
        if self.coord is not None and self.coord.alive():
            v = _goodbye_seen(self.coord, self.DEVICE)
            if v is not None:
                say(f"results stored by the coordinator: {v['results_stored']}; device "
                      f"{v['status']} ({v['reason'] or 'running'})", flush=True)
                if v.get("health"):
                    say("\n".join(summary_lines(v["health"], self.rung_of)), flush=True)
        if self.daemon is not None and (self.state / "outbox.db").exists():
            made, held = outbox_backlog(self.state / "outbox.db")
            say(f"device outbox: {made} results made, "
                  + ("every result acked" if held == 0 else
                     f"{held} not acked (kept in {self.state / 'outbox.db'})"), flush=True)
            code = code or int(held > 0)
        if self.coord is not None:
            self.coord.stop()
        self.broker.stop()
        if self.daemon is not None:
            with contextlib.suppress(OSError):
                self.kept_log.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(self.daemon_log, self.kept_log)
                gone = keep_last(self.kept_log.parent, "daemon-*.log", KEEP_LOGS)
                say(f"daemon log: {self.kept_log} (the last {KEEP_LOGS} demos' logs are "
                      f"kept in {self.kept_log.parent}"
                      + (f"; {len(gone)} older removed)" if gone else ")"), flush=True)
        return code


def run(duration_s: float = 0.0, device: str = "rpi5", scenario: str = "cabinet",
        speed: float = 480.0, start_hour: float = 10.0, rate: float = 100.0,
        workdir: Path | None = None) -> int:
    """Run the demo until Ctrl-C (or `duration_s` when > 0)."""
    if not broker_available():
        say(MISSING_BROKER, file=sys.stderr, flush=True)
        return 2
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="edgerun-demo-")
        workdir = Path(tmp.name)
    terminated: list[int] = []
    demo = _Demo(workdir, terminated)
    previous = _on_stop_signals(terminated)
    code = 0
    try:
        demo.start(device, scenario, speed, start_hour, rate)
        code = demo.watch(duration_s)
    finally:
        code = demo.stop(code)
        if tmp is not None:
            if code:
                say(f"(kept {workdir} for inspection)")
            else:
                tmp.cleanup()
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
    return code
