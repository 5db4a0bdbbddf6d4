"""`edgerun demo`: broker + coordinator + daemon on the bundled model, with a live view.

Everything a new user needs, started by one command: a local MQTT broker (Mosquitto when it
is installed, otherwise the pure-Python amqtt broker), the coordinator (in this process), and
`edgerun serve` as a child process running the bundled inspection model on the synthetic
conveyor, on a simulated Raspberry Pi 5 in a cabinet that gets the midday sun (time accelerated).
The live view prints one line per second from what the coordinator received; watch the rung
step down as the die heats towards its trip point and back up as it cools. Ctrl-C stops it all.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from runtime.coordinator.config import CoordinatorConfig
from runtime.coordinator.service import Coordinator
from runtime.telemetry.broker import Mosquitto, free_port, wait_port
from runtime.telemetry.commands import generate_keypair
from runtime.telemetry.config import BrokerConfig

log = logging.getLogger("edgerun.demo")

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

[backends]
enabled = ["onnxruntime", "openvino"]
threads = [1]

[backends.onnxruntime]
spinning = [false]
include_default = false

[backends.openvino]
precision_hints = ["f32"]

[source]
kind = "synthetic"
rate_hz = {rate}

[governor]
policy = "step_wise"
tick_s = 0.25
rate_hz = {rate}

[simulator]
enabled = true
scenario = "{scenario}"
speed = {speed}
start_hour = {start_hour}

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

[telemetry.outbox]
path = "{state}/outbox.db"
"""


class EmbeddedBroker:
    """amqtt in a child process, for machines without Mosquitto (pure pip install)."""

    def __init__(self, workdir: Path):
        self.port = free_port()
        self.conf = workdir / "amqtt.yaml"
        self.conf.write_text("listeners:\n  default:\n    type: tcp\n"
                             f"    bind: 127.0.0.1:{self.port}\n"
                             "plugins:\n  amqtt.plugins.authentication.AnonymousAuthPlugin:\n"
                             "    allow_anonymous: true\n")
        self.proc: subprocess.Popen | None = None

    def start(self) -> EmbeddedBroker:
        """Start it and wait for the port."""
        exe = shutil.which("amqtt")
        if exe is None:
            raise RuntimeError("no MQTT broker: install mosquitto (apt install mosquitto) or "
                               "amqtt (pip install amqtt), or configure telemetry.broker.host")
        self.proc = subprocess.Popen([exe, "-c", str(self.conf)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_port(self.port, 20)
        return self

    def stop(self) -> None:
        """Stop it."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def start_broker(workdir: Path):
    """Mosquitto when installed, else amqtt."""
    if shutil.which("mosquitto"):
        return Mosquitto(workdir).start()
    return EmbeddedBroker(workdir).start()


def _clock(sim_t: float | None) -> str:
    if sim_t is None:
        return "--:--"
    h = (sim_t % 86400) / 3600
    return f"{int(h):02d}:{int(h % 1 * 60):02d}"


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
            f"acc {h.get('accuracy', 0):.3f}  {rate:5.1f}/s  p95 "
            f"{lat.get('p95') or 0:6.2f} ms  stored {stored}")


def run(duration_s: float = 0.0, device: str = "rpi5", scenario: str = "sun",
        speed: float = 300.0, start_hour: float = 9.0, rate: float = 100.0,
        workdir: Path | None = None) -> int:
    """Run the demo until Ctrl-C (or `duration_s` when > 0)."""
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="edgerun-demo-")
        workdir = Path(tmp.name)
    state = workdir / "state"
    state.mkdir(parents=True, exist_ok=True)
    cache = Path("~/.cache/edgerun/demo-profiles").expanduser()  # reused across demo runs
    cache.mkdir(parents=True, exist_ok=True)
    broker = start_broker(workdir)
    print(f"broker: {type(broker).__name__} on 127.0.0.1:{broker.port}", flush=True)
    generate_keypair(state / "command.pem", state / "command.pub")
    cfg_path = workdir / "edgerun.toml"
    cfg_path.write_text(DEMO_CONFIG.format(device=device, state=state, rate=rate,
                                           scenario=scenario, speed=speed, start_hour=start_hour,
                                           port=broker.port).replace(f"{state}/profiles",
                                                                     str(cache)))
    coord = Coordinator(CoordinatorConfig(
        fleet="demo", broker=BrokerConfig(host="127.0.0.1", port=broker.port),
        store=str(state / "coordinator.db"), signing_key=str(state / "command.pem"),
        stale_after_s=5, offline_after_s=15))
    coord.start()
    from runtime.coordinator.api import serve

    api = serve(coord, "127.0.0.1", 0)
    print(f"coordinator API: http://127.0.0.1:{api.server_address[1]}/api/v1/fleet", flush=True)
    daemon_log = workdir / "daemon.log"
    print(f"daemon: edgerun serve --config {cfg_path} (log: {daemon_log})", flush=True)
    print("first run profiles every variant of the bundled model (cached afterwards)...",
          flush=True)
    daemon = subprocess.Popen([sys.executable, "-m", "runtime.cli", "serve", "--config",
                               str(cfg_path)], stdout=daemon_log.open("w"),
                              stderr=subprocess.STDOUT)
    stop = threading.Event()
    started = time.monotonic()
    seen_events = 0
    code = 0
    try:
        while not stop.wait(1.0):
            if daemon.poll() is not None:
                print(f"the daemon exited with code {daemon.returncode}; its log:\n"
                      + daemon_log.read_text()[-3000:], flush=True)
                code = 1
                break
            views = {v["device"]: v for v in coord.fleet_view()}
            view = views.get("demo-box")
            if view and view.get("health"):
                print(live_line(view, view["results_stored"]), flush=True)
                events = coord.store.events("demo-box", 200)
                for ev in reversed(events[: max(0, len(events) - seen_events)]):
                    if ev["type"] == "rung_changed":
                        print(f"  rung changed: {ev['from'].split('@')[0]} -> "
                              f"{ev['to'].split('@')[0]} ({ev.get('reason', '')})", flush=True)
                    elif ev["type"] in ("governor", "sensor_invalid", "reprofile"):
                        detail = ev.get("detail") or ev.get("reason") or ev.get("problems")
                        print(f"  {ev['type']}: {detail}", flush=True)
                seen_events = len(events)
            if duration_s and time.monotonic() - started > duration_s:
                break
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
    finally:
        if daemon.poll() is None:
            daemon.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.wait(30)
        time.sleep(1.0)
        views = {v["device"]: v for v in coord.fleet_view()}
        if "demo-box" in views:
            v = views["demo-box"]
            print(f"results stored by the coordinator: {v['results_stored']}; device "
                  f"{v['status']} ({v['reason'] or 'running'})", flush=True)
        api.shutdown()
        coord.stop()
        broker.stop()
        if tmp is not None:
            if code:
                print(f"(kept {workdir} for inspection)")
            else:
                tmp.cleanup()
    return code
