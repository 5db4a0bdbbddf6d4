"""A fleet for the OTA tests: Mosquitto, a coordinator with its API, and `edgerun serve`
devices whose configs trust the coordinator's command key and a publisher key."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.api import serve
from runtime.coordinator.service import Coordinator
from runtime.wire.broker import Mosquitto
from runtime.wire.commands import generate_keypair
from support.daemon_harness import Serve, write_config
from support.waiting import wait

FLEET = "t"  # daemon_harness.write_config's fleet
TOKEN = "a" * 32


class Fleet:
    """Broker + coordinator (+ API) in `tmp_path`; `device()` starts a daemon."""

    def __init__(self, tmp_path: Path, cache: Path):
        self.tmp, self.cache = tmp_path, cache
        (tmp_path / "broker").mkdir()
        self.broker = Mosquitto(tmp_path / "broker").start()
        generate_keypair(tmp_path / "command.pem", tmp_path / "command.pub")
        generate_keypair(tmp_path / "publisher.pem", tmp_path / "publisher.pub")
        (tmp_path / "device-keys").mkdir()
        self.coord = Coordinator(CoordinatorConfig(
            fleet=FLEET, broker=self.broker.coordinator(FLEET),
            store=str(tmp_path / "coord" / "c.db"), signing_key=str(tmp_path / "command.pem"),
            device_keys=str(tmp_path / "device-keys"), stale_after_s=5, offline_after_s=10))
        self.coord.start()
        assert self.coord.connected.wait(30)
        self.api = serve(self.coord, "127.0.0.1", 0, token=TOKEN)
        self.devices: dict[str, Serve] = {}

    def config(self, name: str, model: Path, models: str = "", latency_ms: float = 100.0
               ) -> Path:
        """A device config: its own dir, broker login, trusted command and publisher keys."""
        where = self.tmp / name
        where.mkdir(exist_ok=True)
        creds = self.broker.device(FLEET, name)
        cfg = write_config(where, self.cache, latency_ms=latency_ms, extra=f"""
[telemetry.broker]
host = "127.0.0.1"
port = {self.broker.port}
keepalive_s = 5
username = "{creds.username}"
password_file = "{creds.password_file}"
[model]
path = "{model}"
[models]
publisher_keys = ["{self.tmp / 'publisher.pub'}"]
{models}
""")
        text = cfg.read_text().replace('device = "box1"', f'device = "{name}"').replace(
            "[telemetry]\n", f'[telemetry]\ntrusted_keys = ["{self.tmp / "command.pub"}"]\n'
            "ack_timeout_s = 1.0\n")
        cfg.write_text(text)
        return cfg

    def device(self, name: str, cfg: Path, env: dict | None = None) -> Serve:
        """Start a daemon and wait until the coordinator knows it and its key."""
        d = Serve(self.tmp / name, cfg, env=env)
        self.devices[name] = d
        wait(lambda: (self.tmp / name / "state" / "device.pub").exists(), 60, "device key", d)
        tmp = self.tmp / "device-keys" / f".{name}.pub.tmp"  # the coordinator reads it whole
        shutil.copy(self.tmp / name / "state" / "device.pub", tmp)
        tmp.replace(self.tmp / "device-keys" / f"{name}.pub")
        wait(lambda: name in self.coord.views, 60, f"{name} seen by the coordinator", d)
        return d

    def upload(self, bundle: Path) -> str:
        """Hand a bundle to the coordinator; its id."""
        with bundle.open("rb") as f:
            return self.coord.shelf.receive(f, bundle.stat().st_size).id

    def events(self, device: str, type_: str) -> list[dict]:
        """Events of `type_` the coordinator stored for `device` (newest first)."""
        return [e for e in self.coord.store.events(device, 500) if e["type"] == type_]

    def wait_event(self, device: str, type_: str, timeout_s: float = 90) -> dict:
        """The first `type_` event of `device`, waiting for it."""
        wait(lambda: self.events(device, type_), timeout_s, f"{type_} from {device}",
             self.devices.get(device))
        return self.events(device, type_)[-1]

    def health(self, device: str) -> dict:
        """The newest health the coordinator holds for `device`."""
        return self.coord.store.latest_health().get(device, {})

    def close(self) -> None:
        """Stop the devices (each must exit 0), the API, the coordinator and the broker."""
        codes = {}
        try:
            for name, d in self.devices.items():
                codes[name] = d.stop()
        finally:
            self.api.shutdown()
            self.coord.stop()
            self.broker.stop()
            time.sleep(0.1)
        assert all(c == 0 for c in codes.values()), codes
