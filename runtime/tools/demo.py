"""`edgerun demo`: broker + coordinator + daemon on the bundled model, with a live view.

Everything a new user needs, started by one command: a local MQTT broker (Mosquitto when it
is installed, otherwise the pure-Python amqtt broker of the `[demo]` extra), the coordinator
(in this process), and
`edgerun serve` as a child process running the bundled inspection model on the synthetic
conveyor, on a simulated Raspberry Pi 5 in a cabinet that gets the midday sun (time accelerated).
The live view prints one line per second from what the coordinator received; watch the rung
step down as the die heats towards its trip point and back up as it cools. Ctrl-C stops it all.

Processes: the broker and the daemon run in their own process groups and the coordinator in
this process, so a Ctrl-C (SIGINT to the terminal's foreground group) reaches only this
process, which stops them in order: the daemon (its outbox drained to the coordinator), the
coordinator, the broker. SIGTERM and SIGHUP (a closed terminal) stop it the same way.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from models import bundled
from runtime.config.coordinator import CoordinatorConfig
from runtime.config.telemetry import BrokerConfig
from runtime.coordinator.service import Coordinator
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

# the events the demo prints besides a rung change: what the governor and sensors decide
SHOWN = (EventType.GOVERNOR, EventType.SENSOR_INVALID, EventType.SENSOR_HOLD,
         EventType.REPROFILE, EventType.PHYSICS_BOUNDED, EventType.GOVERNOR_DISABLED)

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
rate_hz = 0                    # the simulated camera offers frames as fast as the top rung runs

[simulator]
enabled = true
scenario = "{scenario}"
speed = {speed}
start_hour = {start_hour}
profiles = "{profiles}"        # the bundled model's reference profiles: the demo repeats

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


def _stop_daemon(daemon: subprocess.Popen, daemon_log: Path) -> None:
    """SIGTERM and wait: the daemon drains its outbox to the coordinator and says goodbye."""
    if daemon.poll() is None:
        daemon.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            daemon.wait(30)
        if daemon.returncode is None:
            print("the daemon did not stop within 30 s of SIGTERM: killed; see its log",
                  flush=True)
            daemon.kill()
            daemon.wait()
        elif daemon.returncode != 0:
            print(f"the daemon exited with code {daemon.returncode} on stop; its log ends:\n"
                  + daemon_log.read_text()[-2000:], flush=True)


def _goodbye_seen(coord: Coordinator, device: str, timeout_s: float = 10.0) -> dict | None:
    """The device's view once the coordinator has taken in its goodbye (status no longer
    online), or its last view after `timeout_s`; None if it was never heard from."""
    deadline = time.monotonic() + timeout_s
    while True:
        view = {v["device"]: v for v in coord.fleet_view()}.get(device)
        if view is None or view["status"] != "online" or time.monotonic() > deadline:
            return view
        time.sleep(0.1)


def run(duration_s: float = 0.0, device: str = "rpi5", scenario: str = "cabinet",
        speed: float = 480.0, start_hour: float = 10.0, rate: float = 100.0,
        workdir: Path | None = None) -> int:
    """Run the demo until Ctrl-C (or `duration_s` when > 0)."""
    if not broker_available():
        print(MISSING_BROKER, file=sys.stderr, flush=True)
        return 2
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="edgerun-demo-")
        workdir = Path(tmp.name)
    state = workdir / "state"
    state.mkdir(parents=True, exist_ok=True)
    broker = make_broker(workdir)
    # Authenticated like a real fleet: each side logs in as itself and the broker's ACL
    # confines it (see docs/security.md); enrolled before start (amqtt cannot reload).
    device_login = broker.device("demo", "demo-box")
    coord_login = broker.coordinator("demo")
    terminated: list[int] = []
    previous = _on_stop_signals(terminated)
    coord: Coordinator | None = None
    api = None
    daemon: subprocess.Popen | None = None
    daemon_log = workdir / "daemon.log"
    kept_log = (Path("~/.cache/edgerun/demo").expanduser()
                / time.strftime("daemon-%Y%m%d-%H%M%S.log"))
    code = 0
    try:
        broker.start(own_group=True)
        print(f"broker: {type(broker).__name__} on 127.0.0.1:{broker.port} (authenticated, "
              "ACL on)", flush=True)
        generate_keypair(state / "command.pem", state / "command.pub")
        cfg_path = workdir / "edgerun.toml"
        cfg_path.write_text(DEMO_CONFIG.format(
            device=device, state=state, rate=f"{rate / speed:.6g}", scenario=scenario,
            speed=speed,
            profiles=bundled() / "reference-profiles.json", backends=REFERENCE_BACKENDS,
            start_hour=start_hour, port=broker.port, username=device_login.username,
            password_file=device_login.password_file))
        coord = Coordinator(CoordinatorConfig(
            fleet="demo", broker=coord_login,
            store=str(state / "coordinator.db"), signing_key=str(state / "command.pem"),
            device_keys=str(_device_keys(state, "demo-box")),
            stale_after_s=5, offline_after_s=15))
        coord.start()
        from runtime.coordinator.api import serve

        api = serve(coord, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{api.server_address[1]}"
        print(f"coordinator API: {url}/api/v1/fleet (try: edgerun fleet --api {url} "
              f"--token-file {state / 'api-token'} ls)", flush=True)
        print(f"dashboard: {url}/ (token: the content of {state / 'api-token'})", flush=True)
        print(f"daemon: edgerun serve --config {cfg_path} (log: {daemon_log}; kept afterwards "
              f"as {kept_log})", flush=True)
        print(f"simulated {device}, scenario {scenario}, {speed:g}x from {start_hour:g}:00, "
              "in lockstep with the daemon's control loop (a busy host slows the simulation "
              "down, it does not change what the governor sees): the simulated camera offers "
              "frames as fast as the top rung runs on all cores; the live view's frames/s is "
              "this host's real pipeline", flush=True)
        print("the simulated device's ladder: the bundled model's reference profiles (CI "
              "machine, scaled to the device profile), so the demo repeats; `edgerun profile "
              "models/inspection` measures this host", flush=True)
        if not terminated:  # a Ctrl-C during the start: nothing more to start
            daemon = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve",
                                       "--config", str(cfg_path)],
                                      stdout=daemon_log.open("w"), stderr=subprocess.STDOUT,
                                      process_group=0)
        started = time.monotonic()
        seen_events = 0
        pace = PaceNotice()
        while daemon is not None and not terminated:
            time.sleep(1.0)
            if terminated:
                break
            if daemon.poll() is not None:
                print(f"the daemon exited with code {daemon.returncode}; its log:\n"
                      + daemon_log.read_text()[-3000:], flush=True)
                code = 1
                break
            views = {v["device"]: v for v in coord.fleet_view()}
            view = views.get("demo-box")
            if view and view.get("health"):
                print(live_line(view, view["results_stored"]), flush=True)
                if (line := pace.seen(view["health"].get("simulated", {}))) is not None:
                    print(line, flush=True)
                events = coord.store.events("demo-box", 200)
                for ev in reversed(events[: max(0, len(events) - seen_events)]):
                    if ev["type"] == EventType.RUNG_CHANGED:
                        print(f"  rung -> {ev.get('rung')}/{ev.get('rungs')}: "
                              f"{ev['from'].split('@')[0]} -> {ev['to'].split('@')[0]} "
                              f"({ev.get('reason', '')})", flush=True)
                    elif ev["type"] in SHOWN:
                        detail = ev.get("detail") or ev.get("reason") or ev.get("problems")
                        print(f"  {ev['type']}: {detail}", flush=True)
                seen_events = len(events)
            if duration_s and time.monotonic() - started > duration_s:
                break
    finally:
        if terminated:
            print("\nstopping: the daemon, then the coordinator, then the broker...", flush=True)
        # In order: the daemon first, while the coordinator and the broker are there to take
        # its last results and its goodbye; then the coordinator; the broker last.
        if daemon is not None:
            _stop_daemon(daemon, daemon_log)
        if coord is not None:
            v = _goodbye_seen(coord, "demo-box")
            if v is not None:
                print(f"results stored by the coordinator: {v['results_stored']}; device "
                      f"{v['status']} ({v['reason'] or 'running'})", flush=True)
            if daemon is not None and (state / "outbox.db").exists():
                made, held = outbox_backlog(state / "outbox.db")
                print(f"device outbox: {made} results made, "
                      + ("every result acked" if held == 0 else
                         f"{held} not acked (kept in {state / 'outbox.db'})"), flush=True)
                code = code or int(held > 0)
        if api is not None:
            api.shutdown()
        if coord is not None:
            coord.stop()
        broker.stop()
        if daemon is not None:
            with contextlib.suppress(OSError):
                kept_log.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(daemon_log, kept_log)
                print(f"daemon log: {kept_log}", flush=True)
        if tmp is not None:
            if code:
                print(f"(kept {workdir} for inspection)")
            else:
                tmp.cleanup()
        for sig, handler in previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
    return code
