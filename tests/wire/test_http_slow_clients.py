"""The HTTP server under slow clients (runtime/wire/httpserver.py), against the coordinator's
real API on loopback: trickled requests and bodies are cut at their deadline, idle keep-alive
connections at the idle timeout, one address past its connection limit is refused at once, and
an operator's authorized requests are answered during a slowloris of 300 sockets.

The slow sockets come from other loopback addresses (127.0.0.2...) than the operator's
127.0.0.1, as they would from other hosts; every socket is closed by the test."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import urllib.request

import pytest

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.api import MAX_PER_CLIENT, serve
from runtime.coordinator.service import Coordinator

TIMEOUT_S = 1.0  # idle cut; a request is due whole within 3 x this


@pytest.fixture
def api(tmp_path):
    coord = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db")))
    server = serve(coord, "127.0.0.1", 0, token="t" * 32, timeout_s=TIMEOUT_S)
    yield server, server.server_address[1], "t" * 32, coord
    server.shutdown()
    coord.stop()


def _get(port: int, token: str, path: str = "/api/v1/stats") -> tuple[int, float]:
    t0 = time.monotonic()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        json.loads(r.read())
        return r.status, time.monotonic() - t0


def _connect(port: int, source: str) -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    return s


def _closed_by_server(s: socket.socket, within_s: float) -> float | None:
    """Seconds until the server closed `s` (recv b"" or a reset), None if not within."""
    t0 = time.monotonic()
    s.settimeout(within_s)
    try:
        while s.recv(4096):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    except TimeoutError:
        return None
    return time.monotonic() - t0


def test_a_trickled_body_is_cut_at_its_deadline(api):
    """Headers in time, then the body one byte at a time within the idle timeout: cut when
    the request deadline (3 x timeout, plus time for 20 bytes at 64 KiB/s) passes."""
    _, port, token, _ = api
    s = _connect(port, "127.0.0.1")
    try:
        s.sendall(b"POST /api/v1/devices/d/commands HTTP/1.1\r\nHost: x\r\n"
                  + f"Authorization: Bearer {token}\r\nContent-Length: 20\r\n\r\n".encode())
        t0, cut = time.monotonic(), False
        for _ in range(20):
            try:
                s.sendall(b" ")
            except OSError:
                cut = True
                break
            time.sleep(TIMEOUT_S / 2)  # a byte well within the idle timeout each time
        took = _closed_by_server(s, 5) if not cut else time.monotonic() - t0
        assert took is not None and time.monotonic() - t0 < 3 * TIMEOUT_S + 1.5
    finally:
        s.close()


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(api):
    _, port, token, _ = api
    s = _connect(port, "127.0.0.1")
    try:
        s.sendall(f"GET /api/v1/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}"
                  "\r\n\r\n".encode())
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        took = _closed_by_server(s, 5)
        assert took is not None and took < TIMEOUT_S + 1.5
    finally:
        s.close()


def test_one_address_past_its_limit_is_refused_at_once_others_are_not(api):
    server, port, token, _ = api
    held = [_connect(port, "127.0.0.2") for _ in range(MAX_PER_CLIENT)]
    extra = []
    try:
        # wait until the server counted them all (accepts are asynchronous)
        deadline = time.monotonic() + 5
        while server.limits.open_by_client.get("127.0.0.2", 0) < MAX_PER_CLIENT:
            assert time.monotonic() < deadline, server.limits.open_by_client
            time.sleep(0.01)
        extra = [_connect(port, "127.0.0.2") for _ in range(5)]
        for s in extra:
            took = _closed_by_server(s, 2)
            assert took is not None and took < 1.0  # closed at once, not at the deadline
        assert server.limits.refused_busy >= 5
        assert _get(port, token)[0] == 200  # another address is served meanwhile
    finally:
        for s in held + extra:
            s.close()


def test_the_operator_is_answered_during_a_slowloris_of_300_sockets(api, tmp_path):
    """300 sockets from 10 addresses each send half a request line and then a byte every
    TIMEOUT_S / 3 (never idle long enough to be cut for silence): the operator's 12 requests
    and a device's bundle download (with the bundle's own token) are all answered, fast,
    while they are held, and every slow socket is cut by the request deadline."""
    from support.model_dirs import model_dir

    from runtime.ota.bundle import make
    from runtime.wire.commands import generate_keypair, load_private_key

    server, port, token, coord = api
    generate_keypair(tmp_path / "pub.pem", tmp_path / "pub.pub")
    make(model_dir(tmp_path / "m"), load_private_key(tmp_path / "pub.pem"),
         tmp_path / "b.edgerun", "1")
    blob = (tmp_path / "b.edgerun").read_bytes()
    with (tmp_path / "b.edgerun").open("rb") as f:
        held = coord.shelf.receive(f, len(blob))
    sources = [f"127.0.0.{i}" for i in range(2, 12)]
    slow = [_connect(port, sources[i % len(sources)]) for i in range(300)]
    stop = threading.Event()

    def trickle() -> None:
        for s in slow:
            s.sendall(b"GET /api/v1/fl")
        while not stop.wait(TIMEOUT_S / 3):
            for s in slow:
                with contextlib.suppress(OSError):  # cut by the server: what should happen
                    s.sendall(b"e")

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 5
        while sum(server.limits.open_by_client.get(a, 0) for a in sources) < 300:
            assert time.monotonic() < deadline, server.limits.open_by_client
            time.sleep(0.01)
        t_attack = time.monotonic()
        answers = [_get(port, token) for _ in range(12)]
        req = urllib.request.Request(f"http://127.0.0.1:{port}/api/v1/bundles/{held.id}",
                                     headers={"Authorization": f"Bearer {held.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200 and r.read() == blob
        during = time.monotonic() - t_attack
        assert during < 3 * TIMEOUT_S, "the operator's requests outlasted the slow sockets"
        assert [a[0] for a in answers] == [200] * 12
        assert max(a[1] for a in answers) < 1.0, answers
        # and every slow socket is cut at the request deadline, trickling or not
        cut = [_closed_by_server(s, 3 * TIMEOUT_S + 3) for s in slow]
        assert all(c is not None for c in cut)
        assert server.limits.cut_slow >= 300
    finally:
        stop.set()
        t.join(5)
        for s in slow:
            s.close()


def test_keep_alive_and_pipelined_requests_are_served_whole(api):
    """The deadline restarts after each answer, and a pipelined request that arrived whole
    is not given one: three requests on one connection, two of them in one packet."""
    _, port, token, _ = api
    one = (f"GET /api/v1/stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}"
           "\r\n\r\n").encode()
    s = _connect(port, "127.0.0.1")
    try:
        s.sendall(one)
        got = b""
        while got.count(b"HTTP/1.1 200") < 1:
            got += s.recv(65536)
        s.sendall(one + one)
        s.settimeout(5)
        while got.count(b"HTTP/1.1 200") < 3:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
    finally:
        s.close()
