"""runtime.coordinator.api_client's raising call and upload against a real local HTTP server
(stdlib, in a thread, answering fixed statuses), and the CLI's exits built on them."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from support.under_test import child_env

from runtime.coordinator.api_client import ApiError, _call, _upload, call, upload

TOKEN = "t0ken"


class _Fixed(BaseHTTPRequestHandler):
    """`/status/CODE[/raw]`: answers CODE with {"error": ...} ({"created": CODE} below 300;
    with /raw, a body that is not JSON); `/echo`: 200 with what was asked; PUT
    /api/v1/bundles: the upload's size and sha256, or 413 when the file starts with
    b"too big"."""

    def log_message(self, *args) -> None:  # quiet: pytest shows what the test asserts
        pass

    def _answer(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _serve(self) -> None:
        sent = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        parts = self.path.strip("/").split("/")
        if self.command == "PUT" and self.path == "/api/v1/bundles":
            if sent.startswith(b"too big"):
                self._answer(413, b'{"error": "bundle over max_bundle_mb"}')
            else:
                self._answer(200, json.dumps({"size": len(sent), "sha256": hashlib.sha256(
                    sent).hexdigest(), "auth": self.headers["Authorization"]}).encode())
        elif parts[0] == "status":
            code = int(parts[1])
            raw = len(parts) > 2 and parts[2] == "raw"
            self._answer(code, b"<html>oops</html>" if raw else json.dumps(
                {"created": code} if code < 300 else {"error": f"refused with {code}"}).encode())
        else:  # echo
            self._answer(200, json.dumps({
                "method": self.command, "path": self.path,
                "auth": self.headers["Authorization"],
                "type": self.headers["Content-Type"],
                "body": json.loads(sent) if sent else None}).encode())

    do_GET = do_POST = do_PUT = do_DELETE = _serve


@pytest.fixture(scope="module")
def api() -> Iterator[str]:
    """The base URL of a fixed-answer server (it keeps no state, so the module's tests share
    it), shut down and closed after them."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fixed)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(10)


@pytest.fixture
def refused() -> Iterator[str]:
    """A base URL whose port is bound but not listening: a connect there is refused (the
    socket is held for the test, so no other process can take the port meanwhile)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    yield f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()


@pytest.mark.parametrize("path, body, method, want", [
    ("/echo", None, "", {"method": "GET", "path": "/echo", "auth": f"Bearer {TOKEN}",
                         "type": "application/json", "body": None}),
    ("/echo", {"a": [1, 2]}, "", {"method": "POST", "path": "/echo",
                                  "auth": f"Bearer {TOKEN}", "type": "application/json",
                                  "body": {"a": [1, 2]}}),
    ("/echo/x", None, "DELETE", {"method": "DELETE", "path": "/echo/x",
                                 "auth": f"Bearer {TOKEN}", "type": "application/json",
                                 "body": None}),
    ("/status/201", {"a": 1}, "PUT", {"created": 201}),
])
def test_a_2xx_answer_is_returned_parsed(api, path, body, method, want):
    assert call(api, path, body, token=TOKEN, method=method) == want


@pytest.mark.parametrize("path, method, status, reason", [
    ("/status/400", "POST", 400, "refused with 400"),
    ("/status/401", "GET", 401, "refused with 401"),
    ("/status/404", "DELETE", 404, "refused with 404"),
    ("/status/409", "GET", 409, "refused with 409"),
    ("/status/500", "GET", 500, "refused with 500"),
    ("/status/503", "GET", 503, "refused with 503"),
    # a body that is not the API's JSON: the HTTP reason phrase stands in
    ("/status/500/raw", "GET", 500, "Internal Server Error"),
    ("/status/404/raw", "GET", 404, "Not Found"),
])
def test_a_4xx_or_5xx_raises_api_error_with_status_route_and_reason(api, path, method, status,
                                                                     reason):
    body = {"x": 1} if method == "POST" else None
    with pytest.raises(ApiError) as got:
        call(api, path, body, token=TOKEN, method=method)
    e = got.value
    assert (e.status, e.route, e.reason, e.api) == (status, f"{method} {path}", reason, api)
    assert str(e) == f"{method} {path}: HTTP {status}: {reason}"


def test_a_refused_connection_raises_api_error_naming_the_url(refused):
    with pytest.raises(ApiError) as got:
        call(refused, "/api/v1/fleet", token=TOKEN)
    e = got.value
    assert e.status is None and e.route == "GET /api/v1/fleet" and e.api == refused
    assert "Connection refused" in e.reason
    assert str(e) == f"GET /api/v1/fleet: cannot reach the coordinator at {refused}: {e.reason}"


def test_upload_returns_the_record_or_raises(api, refused, tmp_path):
    bundle = tmp_path / "m.edgerun"
    bundle.write_bytes(b"x" * 70_000)
    held = upload(api, bundle, TOKEN)
    assert held == {"size": 70_000, "sha256": hashlib.sha256(b"x" * 70_000).hexdigest(),
                    "auth": f"Bearer {TOKEN}"}
    bundle.write_bytes(b"too big" + b"x" * 1000)
    with pytest.raises(ApiError) as got:
        upload(api, bundle, TOKEN)
    assert (got.value.status, got.value.route, got.value.reason) == (
        413, "PUT /api/v1/bundles", "bundle over max_bundle_mb")
    with pytest.raises(ApiError) as got:
        upload(refused, bundle, TOKEN)
    assert got.value.status is None and "Connection refused" in got.value.reason
    with pytest.raises(FileNotFoundError):  # the file, not the API: OSError as it is
        upload(api, tmp_path / "missing.edgerun", TOKEN)


def test_the_cli_wrappers_exit_with_the_messages_they_always_printed(api, refused, tmp_path):
    """`edgerun fleet ...` turns ApiError into SystemExit with the words it printed before
    ApiError existed (exit status 1, the message on stderr)."""
    with pytest.raises(SystemExit) as got:
        _call(api, "/status/409", token=TOKEN)
    assert got.value.code == "edgerun fleet: refused with 409 (HTTP 409)"
    with pytest.raises(SystemExit) as got:
        _call(refused, "/api/v1/fleet", token=TOKEN)
    assert got.value.code == (f"edgerun fleet: cannot reach the coordinator at {refused}: "
                              "[Errno 111] Connection refused")
    bundle = tmp_path / "m.edgerun"
    bundle.write_bytes(b"too big")
    with pytest.raises(SystemExit) as got:
        _upload(api, bundle, TOKEN)
    assert got.value.code == "edgerun fleet deploy: bundle over max_bundle_mb (HTTP 413)"
    with pytest.raises(SystemExit) as got:
        _upload(refused, bundle, TOKEN)
    assert got.value.code == (f"edgerun fleet deploy: {bundle}: <urlopen error [Errno 111] "
                              "Connection refused>")
    with pytest.raises(SystemExit) as got:
        _upload(api, tmp_path / "missing", TOKEN)
    assert got.value.code == (f"edgerun fleet deploy: {tmp_path / 'missing'}: [Errno 2] No "
                              f"such file or directory: '{tmp_path / 'missing'}'")


def test_fleet_cli_exits_1_with_the_reason_on_stderr(api, tmp_path):
    token = tmp_path / "tok"
    token.write_text(TOKEN + "\n")
    out = subprocess.run([sys.executable, "-m", "runtime.cli", "fleet", "show", "status",
                          "--api", api + "/status/404", "--token-file", str(token)],
                         capture_output=True, text=True, timeout=120, env=child_env(),
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 1, out
    assert out.stderr.strip() == "edgerun fleet: refused with 404 (HTTP 404)"


class _RestartingRollouts(BaseHTTPRequestHandler):
    """A coordinator restarted while `fleet deploy --wait` follows a rollout: POST
    /api/v1/rollouts starts one (canary); the next `DROPS` GETs of it get no answer (the
    connection closed unanswered, as by a coordinator going down); after them it is halted."""

    DROPS = 2
    gets = 0

    def log_message(self, *args) -> None:
        pass

    def _answer(self, body: object) -> None:
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer({"id": "r1", "version": "m@2", "group": "g", "canary": ["d1"],
                      "rest": [], "state": "canary", "devices": {"d1": {"state": "sent"}}})

    def do_GET(self) -> None:
        if self.path == "/api/v1/fleet":  # fleet deploy's look at the canary: all online
            self._answer([])
            return
        type(self).gets += 1
        if type(self).gets <= self.DROPS:
            self.close_connection = True  # no answer at all: the client's read fails
            return
        self._answer({"id": "r1", "version": "m@2", "group": "g", "state": "halted",
                      "reason": "canary failed: d1: rolled back",
                      "devices": {"d1": {"state": "failed", "reason": "rolled back"}}})


def test_deploy_wait_follows_a_rollout_through_a_coordinator_restart(capsys):
    """Found 2026-12-07 (outside run): `fleet deploy --wait 240` exited 1 with `cannot reach
    the coordinator` the moment the coordinator restarted mid-rollout, while the rollout went
    on there (and halted a minute later): exit 1 is documented as "halted". The wait now
    keeps following until --wait ends, saying once that the coordinator did not answer."""
    import argparse

    from runtime.coordinator.api_client import deploy

    server = ThreadingHTTPServer(("127.0.0.1", 0), _RestartingRollouts)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        args = argparse.Namespace(bundle="m@2", canary="100%", to="g", wait=60.0, json=False)
        code = deploy(args, f"http://127.0.0.1:{server.server_address[1]}", TOKEN)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    out = capsys.readouterr()
    assert code == 1
    assert "HALTED" in out.out and "d1: failed: rolled back" in out.out
    assert out.err.count("did not answer") == 1
    assert "following it" in out.err


class _OfflineCanary(BaseHTTPRequestHandler):
    """A coordinator whose canary device is offline, another one asleep."""

    def log_message(self, *args) -> None:
        pass

    def _answer(self, body: object) -> None:
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer({"id": "r2", "version": "m@5", "group": "g", "canary": ["d1", "d2", "d3"],
                      "rest": [], "state": "canary",
                      "devices": {d: {"state": "sent"} for d in ("d1", "d2", "d3")}})

    def do_GET(self) -> None:
        self._answer([
            {"device": "d1", "status": "offline", "last_seen": 1_796_678_118.0},
            {"device": "d2", "status": "asleep", "wake_at": 1_796_678_718.0},
            {"device": "d3", "status": "online", "last_seen": 1_796_678_118.0}])


def test_deploy_says_which_canary_devices_are_away(capsys):
    """Outside run 2026-12-07: `fleet deploy ... --to g1 --wait 20` with its only canary
    stopped printed `CANARY  sent 1` and exited 0; nothing said the device was offline and
    would get the model only when it came back (the coordinator re-sends a returning device
    its desired model)."""
    import argparse

    from runtime.coordinator.api_client import deploy

    server = ThreadingHTTPServer(("127.0.0.1", 0), _OfflineCanary)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        args = argparse.Namespace(bundle="m@5", canary="100%", to="g", wait=0.0, json=False)
        assert deploy(args, f"http://127.0.0.1:{server.server_address[1]}", TOKEN) == 0
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    out = capsys.readouterr().out
    assert "d1: offline (last seen" in out and "when d1 is back" in out, out
    assert "d2: asleep until" in out and "at its wake" in out, out
    assert "d3:" not in out, out
