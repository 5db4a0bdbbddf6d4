"""The coordinator's HTTP API as a hostile client sees it (finding 7) and cursor paging across
interleaved streams (finding 8). A real server on a real socket; no broker needed."""

from __future__ import annotations

import json
import os
import socket
import stat
import time
import urllib.error
import urllib.request

import pytest

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.api import ensure_token, serve
from runtime.coordinator.service import Coordinator
from runtime.coordinator.store import Inbound


def _batch(stream: str, seqs, floor: int = 1, body: str = "") -> dict:
    return {"v": 1, "stream": stream, "boot": "b1", "floor": floor,
            "results": [{"seq": s, "t": time.time(), "label": "ok", "score": 0.5,
                         **({"blob": body} if body else {})} for s in seqs]}


@pytest.fixture
def api(tmp_path):
    coord = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db")))
    server = serve(coord, "127.0.0.1", 0, timeout_s=0.5)
    token = (tmp_path / "api-token").read_text().strip()
    yield coord, server.server_address[1], token
    server.shutdown()
    coord.stop()


def _get(port: int, path: str, token: str | None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _raw(port: int, request: bytes, timeout: float = 3.0) -> bytes:
    """Send raw bytes, return everything the server answers until it closes or goes quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(request)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except TimeoutError:
            pass
        return out


def test_token_file_is_made_0600_and_a_readable_one_is_refused(tmp_path, api):
    assert stat.S_IMODE((tmp_path / "api-token").stat().st_mode) == 0o600
    loose = tmp_path / "loose"
    loose.write_text("x" * 43)
    os.chmod(loose, 0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        ensure_token(loose)
    assert ensure_token(tmp_path / "api-token") == api[2]  # stable across restarts


def test_no_or_wrong_token_is_401(api):
    _, port, token = api
    assert _get(port, "/api/v1/fleet", None)[0] == 401
    assert _get(port, "/api/v1/fleet", token + "x")[0] == 401
    assert _get(port, "/api/v1/stats", token)[0] == 200
    # a POST without a token is refused before its body is even looked at
    answer = _raw(port, b"POST /api/v1/devices/d/commands HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Length: 200000000\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401")


@pytest.mark.parametrize("length, status", [
    (b"-1", b"400"), (b"1e3", b"400"), (b"0x10", b"400"), (b"99999999999999999999", b"400"),
    (b"209715200", b"413"), (None, b"411")])
def test_content_length_is_strict_and_checked_before_reading(api, length, status):
    _, port, token = api
    head = (b"POST /api/v1/devices/d/commands HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {token}\r\n".encode()
            + (b"Content-Length: " + length + b"\r\n" if length is not None else b"") + b"\r\n")
    t0 = time.monotonic()
    answer = _raw(port, head + b"{")  # the body is never sent in full
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
    assert b'"error"' in answer and time.monotonic() - t0 < 2.0


def test_chunked_body_is_refused(api):
    _, port, token = api
    answer = _raw(port, b"POST /api/v1/devices/d/commands HTTP/1.1\r\nHost: x\r\n"
                        + f"Authorization: Bearer {token}\r\n".encode()
                        + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 411")


def test_idle_and_trickling_connections_are_closed_after_the_timeout(api):
    _, port, _ = api
    for first in (b"", b"GET /api/v1/fl"):  # silent; half a request line
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(first)
            t0 = time.monotonic()
            assert s.recv(100) == b""  # closed by the server (timeout_s = 0.5)
            assert time.monotonic() - t0 < 3.0


def test_a_request_trickled_byte_by_byte_is_cut_off_at_the_request_deadline(api):
    _, port, _ = api
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        t0 = time.monotonic()
        closed = False
        for byte in b"GET /api/v1/fleet HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 200:
            try:
                s.sendall(bytes([byte]))
                time.sleep(0.1)  # each read succeeds well within timeout_s = 0.5
            except OSError:
                closed = True
                break
            if time.monotonic() - t0 > 6:
                break
        if not closed:
            s.settimeout(3)
            closed = s.recv(100) == b""
        assert closed and time.monotonic() - t0 < 4.0  # deadline: 3 x timeout_s


@pytest.mark.parametrize("query", ["limit=1e23", "limit=-1", "limit=0", "limit=10001",
                                   "limit=abc", "limit=", "limit=1&limit=2", "after=5",
                                   "cursor=nocolon", "cursor=s:-1", "cursor=s:1e9", "x=1"])
def test_bad_query_parameters_are_400_with_a_message(api, query):
    coord, port, token = api
    coord.store.ingest([Inbound("d", "result", _batch("s", range(1, 4)))])
    status, body = _get(port, f"/api/v1/devices/d/results?{query}", token)
    assert status == 400 and body["error"], body


def test_cursor_paging_over_interleaved_streams_returns_every_row_exactly_once(api):
    coord, port, token = api
    # two streams of one device stored interleaved (a device whose outbox was reset while
    # the old stream was still being re-sent), plus another device that must not leak in
    expected = set()
    for i in range(0, 600, 50):
        for stream in ("b-new", "a-old"):
            seqs = range(i + 1, i + 51)
            coord.store.ingest([Inbound("d", "result", _batch(stream, seqs))])
            expected |= {(stream, s) for s in seqs}
    coord.store.ingest([Inbound("other", "result", _batch("a-old", range(1, 100)))])
    got, cursor, pages = [], None, 0
    while True:
        q = "limit=97" + (f"&cursor={cursor}" if cursor else "")
        status, body = _get(port, f"/api/v1/devices/d/results?{q}", token)
        assert status == 200, body
        if not body["results"]:
            break
        got += [(r["stream"], r["seq"]) for r in body["results"]]
        cursor, pages = body["next"], pages + 1
    assert len(got) == len(set(got)) == len(expected) == 1200
    assert set(got) == expected and pages == 13
    # the cursor keeps working for a client that polls for more
    coord.store.ingest([Inbound("d", "result", _batch("b-new", [601]))])
    status, body = _get(port, f"/api/v1/devices/d/results?cursor={cursor}", token)
    assert [(r["stream"], r["seq"]) for r in body["results"]] == [("b-new", 601)]
    assert _get(port, "/api/v1/devices/d/results?limit=10000", token)[0] == 200


def test_bad_command_bodies_are_400_not_a_dead_thread(api):
    _, port, token = api
    for body in (b"[" * 8000, b'{"cmd": "ping", "args": []}', b'{"cmd": "ping", "wait_s": 1e9}',
                 b"\xff\xfe"):
        head = (b"POST /api/v1/devices/d/commands HTTP/1.1\r\nHost: x\r\n"
                + f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n"
                  "Connection: close\r\n\r\n".encode())
        answer = _raw(port, head + body)
        assert answer.split(b" ")[1] in (b"400", b"404"), answer[:200]
    assert _get(port, "/api/v1/stats", token)[0] == 200


@pytest.mark.parametrize("body, why", [
    (b'{"cmd": "set_rate", "args": {"hz": NaN}}', "NaN is not a JSON number"),
    (b'{"cmd": "ping", "args": {"s": "\\ud800"}}', "lone surrogate"),
    (b'{"cmd": "ping", "args": {"n": ' + b"9" * 400 + b"}}", "out of range"),
    (b'{"cmd": "ping", "args": {"x": 1e999}}', "overflows a double"),
    (b'{"cmd": "ping", "args": ' + b'{"a": ' * 40 + b"1" + b"}" * 41, "nested deeper"),
])
def test_a_command_body_no_device_would_accept_is_400_naming_why(api, body, why):
    """Bodies json.loads takes but no device does (the device parses with runtime/wire/
    safejson): a lone surrogate or a 400-digit integer in args was signed and sent, the
    device dropped it unparsed, and the operator waited wait_s for a 504 that did not say
    why. Now refused at the API with the reason, before any device is looked up."""
    _, port, token = api
    head = (b"POST /api/v1/devices/d/commands HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n"
              "Connection: close\r\n\r\n".encode())
    answer = _raw(port, head + body)
    assert answer.split(b" ")[1] == b"400", answer[:300]
    assert why in json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]


def test_fleet_cli_finds_api_and_token_from_the_coordinator_config(tmp_path, capsys):
    from runtime import config as config_mod
    from runtime.cli import main
    from runtime.wire.broker import free_port

    port = free_port()
    conf = tmp_path / "coordinator.toml"
    conf.write_text(f'[coordinator]\nfleet = "f"\nstore = "{tmp_path / "db" / "c.db"}"\n'
                    f'http_port = {port}\napi_token_file = "{tmp_path / "tok"}"\n')
    coord = Coordinator(config_mod.load(conf).coordinator)
    server = serve(coord, "127.0.0.1", port)
    try:
        assert main(["fleet", "--config", str(conf), "--json", "ls"]) == 0
        assert json.loads(capsys.readouterr().out) == []
        # the same options after the action (issue 14, item 8)
        assert main(["fleet", "ls", "--config", str(conf), "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == []
        assert main(["fleet", "ls", "--config", str(conf)]) == 0
        assert not capsys.readouterr().out.startswith("[")  # the table, not JSON
        with pytest.raises(SystemExit, match="cannot read the API token"):
            main(["fleet", "--api", f"http://127.0.0.1:{port}", "--token-file",
                  str(tmp_path / "missing"), "ls"])
        (tmp_path / "wrong").write_text("not-the-token-at-all\n")
        with pytest.raises(SystemExit, match="HTTP 401"):
            main(["fleet", "--api", f"http://127.0.0.1:{port}", "--token-file",
                  str(tmp_path / "wrong"), "ls"])
    finally:
        server.shutdown()
        coord.stop()


def test_a_store_that_cannot_be_read_is_a_503_naming_it_not_a_500(api, caplog):
    """With the PostgreSQL store down (the attack run: a real coordinator, the server stopped
    for 40 s), every API request and every /metrics scrape answered 500 "internal error;
    see the log" after 30 s, and the log had a traceback for each (24 in 40 s). A store
    that cannot be read now is a 503 saying so, logged once a minute."""
    import logging
    import sqlite3

    coord, port, token = api

    def down(*a, **k):
        raise sqlite3.OperationalError("disk I/O error")

    coord.store.counts = down
    with caplog.at_level(logging.ERROR, logger="edgerun"):
        for _ in range(3):
            status, body = _get(port, "/api/v1/fleet", token)
            assert status == 503, body
            assert "store" in body["error"] and "disk I/O error" in body["error"]
    said = [r for r in caplog.records if "disk I/O error" in r.getMessage()]
    assert len(said) == 1 and not said[0].exc_info
