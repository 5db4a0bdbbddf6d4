"""The fleet's moving parts for tests: a coordinator in-process or as a child process, a device
that publishes through a real outbox (device_proc.py as a child), a webhook receiver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.service import Coordinator
from runtime.wire import commands
from runtime.wire.broker import Mosquitto, free_port, wait_port
from support.under_test import ROOT, child_env

DEVICE_PROC = str(Path(__file__).parents[1] / "support" / "device_proc.py")


def start_coordinator(tmp_path, broker: Mosquitto, **kw) -> Coordinator:
    """A started in-process Coordinator of fleet "test", connected to `broker`."""
    kw.setdefault("device_keys", str(tmp_path / "keys"))
    creds = broker.coordinator("test", kw.get("client_id", "coordinator"), keepalive_s=5)
    cfg = CoordinatorConfig(fleet="test", broker=creds,
                            store=str(tmp_path / "coord.db"), **kw)
    c = Coordinator(cfg)
    c.start()
    assert c.connected.wait(30)
    return c


class Device:
    """tests/support/device_proc.py as a child process."""

    def __init__(self, tmp_path, broker: Mosquitto, total, **kw):
        creds = broker.device("test", kw.get("device", "dev1"))
        # The device's reply-signing key (the publisher's default path, next to its outbox)
        # and its public half where the coordinator looks (coordinator.device_keys).
        if not (tmp_path / "device.key").exists():
            (tmp_path / "keys").mkdir(exist_ok=True)
            commands.generate_keypair(tmp_path / "device.key", tmp_path / "keys" / "dev1.pub")
        self.args = [sys.executable, DEVICE_PROC, "--outbox", str(tmp_path / "dev.db"),
                     "--port", str(broker.port), "--total", str(total),
                     "--username", creds.username, "--password-file", creds.password_file]
        for k, v in kw.items():
            self.args += [f"--{k.replace('_', '-')}", str(v)]
        self.log = (tmp_path / "device.out").open("a")
        self.proc: subprocess.Popen | None = None

    def start(self) -> Device:
        self.proc = subprocess.Popen(self.args, stdout=self.log, stderr=subprocess.STDOUT)
        return self

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def term(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(15)


def assert_exactly_once(coord: Coordinator, total: int, device="dev1"):
    """The coordinator stored seqs 1..total of one stream from `device`, each once, in order."""
    rows = coord.store.result_seqs(device)
    streams = {s for s, _ in rows}
    assert len(streams) == 1
    seqs = [q for _, q in rows]
    assert seqs == list(range(1, total + 1))
    ordered = [r["seq"] for r in coord.store.results(device, 0, total + 10)]
    assert sorted(ordered) == seqs


def read_lines(path: Path) -> list[str]:
    """The lines of `path`, none if it does not exist yet."""
    return path.read_text().splitlines() if path.exists() else []


class CoordinatorProc:
    """`python -m runtime.cli coordinator` with its own config (one host's coordinator)."""

    def __init__(self, tmp: Path, name: str, broker_port: int, store: str,
                 fleet: str = "bench", **extra: str):
        self.name, self.http = name, free_port()
        self.token_file = tmp / f"{name}.token"
        lines = ["[coordinator]", f'fleet = "{fleet}"', f'store = "{store}"',
                 f'client_id = "{name}"', f"http_port = {self.http}",
                 f'api_token_file = "{self.token_file}"', 'share_group = "coords"',
                 *(f"{k} = {v}" for k, v in extra.items()),
                 "[coordinator.broker]", 'host = "127.0.0.1"', f"port = {broker_port}"]
        self.conf = tmp / f"{name}.toml"
        self.conf.write_text("\n".join(lines) + "\n")
        self.log = (tmp / f"{name}.log").open("a")
        self.proc: subprocess.Popen | None = None

    def start(self) -> CoordinatorProc:
        self.proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "coordinator",
                                      "--config", str(self.conf)], cwd=ROOT,
                                     env=child_env(),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        wait_port(self.http, 60)
        return self

    def api(self, path: str, body: dict | None = None, timeout: float = 30) -> dict | list:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.http}{path}", method="POST" if body else "GET",
            data=json.dumps(body).encode() if body else None,
            headers={"Authorization": "Bearer " + self.token_file.read_text().strip(),
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def kill9(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def term(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


class Receiver:
    """A local HTTP server answering each POST from a script of statuses (the last repeats);
    status 0 = hold the request until `release` is set. Records (time, headers, body)."""

    def __init__(self, script: list[int], location: str = ""):
        self.script, self.location = list(script), location
        self.got: list[tuple[float, dict, bytes]] = []
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                n = len(outer.got)
                outer.got.append((time.monotonic(), dict(self.headers), body))
                status = outer.script[min(n, len(outer.script) - 1)]
                if status == 0:
                    outer.release.wait(30)
                    status = 200
                self.send_response(status)
                if outer.location:
                    self.send_header("Location", outer.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook?token=x"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self) -> list[dict]:
        return [json.loads(b) for _, _, b in self.got]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def outbox_count(tmp_path) -> int:
    """How many results the device process's outbox (tmp_path/dev.db) holds."""
    from support.daemon_harness import held_rows

    return len(held_rows(tmp_path / "dev.db"))


def key_of(tmp_path) -> str:
    """The path of a command-signing key in tmp_path, made on first use."""
    if not (tmp_path / "k.pem").exists():
        commands.generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    return str(tmp_path / "k.pem")
