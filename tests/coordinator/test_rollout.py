"""Rollouts: the pure split/advance decisions, bundle distribution over the coordinator's API
(Range, tokens, caps), and a staged rollout over real daemons where a failing canary halts the
rest and a device that comes back with another model is sent its desired one again."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support.daemon_harness import Serve
from support.model_dirs import PROBATION, constant_dir, inspection_dir, model_dir
from support.under_test import child_env
from support.waiting import wait
from support.web import http_get

from models import bundled
from runtime.coordinator.rollout import FAILED, PASSED, SENT, WAITING, advance, split
from runtime.ota.bundle import make
from runtime.ota.download import DownloadError, fetch
from runtime.ota.model_store import ModelStore
from runtime.wire.commands import generate_keypair, load_private_key

ROOT = Path(__file__).parents[2]

# -- pure decisions ---------------------------------------------------------------------------


@pytest.mark.parametrize("n, pct, canary", [
    (10, 10, 1), (10, 15, 2), (3, 34, 2), (3, 33, 1), (1, 10, 1), (5, 0, 5), (5, 100, 5),
    (200, 1, 2),
])
def test_split(n, pct, canary):
    devices = [f"d{i:03d}" for i in range(n)]
    c, rest = split(list(reversed(devices)), pct)
    assert len(c) == canary and c + rest == devices  # sorted, so the choice repeats


def _r(state, canary, rest):
    return {"state": state, "canary": list(canary), "rest": list(rest),
            "devices": {**{d: {"state": s, "reason": "agreement 5%"} for d, s in canary.items()},
                        **{d: {"state": s} for d, s in rest.items()}}}


@pytest.mark.parametrize("r, state, send", [
    (_r("canary", {"a": SENT}, {"b": WAITING}), "canary", ()),
    (_r("canary", {"a": PASSED}, {"b": WAITING, "c": WAITING}), "rolling", ("b", "c")),
    (_r("canary", {"a": FAILED}, {"b": WAITING}), "halted", ()),
    (_r("canary", {"a": PASSED, "x": FAILED}, {"b": WAITING}), "halted", ()),
    (_r("canary", {"a": PASSED}, {}), "done", ()),
    (_r("rolling", {"a": PASSED}, {"b": PASSED, "c": SENT}), "rolling", ()),
    (_r("rolling", {"a": PASSED}, {"b": PASSED, "c": FAILED}), "done", ()),
    (_r("halted", {"a": FAILED}, {"b": WAITING}), "halted", ()),
])
def test_advance(r, state, send):
    s = advance(r)
    assert (s.state, s.send) == (state, send)
    if state == "halted" and r["state"] != "halted":
        assert "canary failed: " in s.reason and "agreement 5%" in s.reason


# -- distribution over the API ----------------------------------------------------------------

@pytest.fixture
def api(tmp_path):
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.api import serve
    from runtime.coordinator.service import Coordinator

    c = Coordinator(CoordinatorConfig(store=str(tmp_path / "coord" / "c.db"),
                                      max_bundle_mb=1.0))
    server = serve(c, "127.0.0.1", 0, token="t" * 24)
    generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    make(model_dir(tmp_path / "src"), load_private_key(tmp_path / "k.pem"),
         tmp_path / "b.edgerun", "1")
    with (tmp_path / "b.edgerun").open("rb") as f:
        held = c.shelf.receive(f, (tmp_path / "b.edgerun").stat().st_size)
    yield c, held, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    c.store.close()
    c.shelf.close()


def test_range_requests_resume_a_download(tmp_path, api):
    _c, held, base = api
    url = f"{base}/api/v1/bundles/{held.id}"
    data = (tmp_path / "b.edgerun").read_bytes()
    status, headers, body = http_get(url, held.token, "bytes=1000-")
    assert status == 206 and body == data[1000:]
    assert headers["Content-Range"] == f"bytes 1000-{len(data) - 1}/{len(data)}"
    assert http_get(url, held.token, "bytes=10-19")[2] == data[10:20]
    assert http_get(url, held.token, f"bytes={len(data)}-")[0] == 416
    assert http_get(url, held.token, "bytes=0-1,5-6")[0] == 416  # one range only
    # a device resumes its partial file and ends with the same bytes
    dest = tmp_path / "dl" / "b.edgerun"
    dest.parent.mkdir()
    (dest.parent / "b.edgerun.part").write_bytes(data[:7000])
    fetch(url, dest, held.size, held.token, sha256=held.sha256)
    assert dest.read_bytes() == data


def test_download_tokens_are_scoped_to_their_bundle(tmp_path, api):
    _c, held, base = api
    assert http_get(f"{base}/api/v1/bundles/{held.id}", "wrong")[0] == 401
    assert http_get(f"{base}/api/v1/bundles/nope@1", held.token)[0] == 401  # says nothing
    assert http_get(f"{base}/api/v1/fleet", held.token)[0] == 401  # not an API token
    assert http_get(f"{base}/api/v1/bundles/{held.id}", "t" * 24)[0] == 200  # the operator may
    listed = http_get(f"{base}/api/v1/bundles", "t" * 24)[2]
    assert held.token not in listed.decode()


def test_size_cap_and_free_space_are_checked_before_downloading(tmp_path, api):
    _c, held, base = api
    url = f"{base}/api/v1/bundles/{held.id}"
    with pytest.raises(DownloadError, match="over the cap"):
        fetch(url, tmp_path / "x", held.size, held.token, max_bytes=held.size - 1)
    with pytest.raises(DownloadError, match="free in"):
        fetch(url, tmp_path / "x", held.size, held.token, min_free_bytes=1 << 60)
    assert not (tmp_path / "x.part").exists()
    # a server sending more than the signed command declared is cut off
    with pytest.raises(DownloadError, match="more than the declared"):
        fetch(url, tmp_path / "y", held.size - 100, held.token)


def test_upload_over_the_cap_is_refused_before_reading_it(tmp_path, api):
    import http.client

    _c, _held, base = api
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("PUT", "/api/v1/bundles")
    conn.putheader("Authorization", "Bearer " + "t" * 24)
    conn.putheader("Content-Length", str(2 << 20))  # over max_bundle_mb = 1; body never sent
    conn.endheaders()
    resp = conn.getresponse()
    assert resp.status == 413 and "max_bundle_mb" in json.loads(resp.read())["error"]
    conn.close()


# -- a staged rollout over real daemons -------------------------------------------------------

pytestmark_daemons = pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                                        reason="bundled model not built")


def _cli(fleet, *args: str) -> subprocess.CompletedProcess:
    from support.ota_harness import TOKEN

    (fleet.tmp / "api-token").write_text(TOKEN)
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", "fleet", *args, "--api",
         f"http://127.0.0.1:{fleet.api.server_address[1]}", "--token-file",
         str(fleet.tmp / "api-token")], capture_output=True, text=True, timeout=600,
        env=child_env())


@pytestmark_daemons
@pytest.mark.slow  # three daemons, two rollouts, a re-imaged device: ~100 s
def test_failing_canary_halts_the_group_then_a_good_rollout_completes(tmp_path, fleet):
    key = load_private_key(tmp_path / "publisher.pem")
    v1 = inspection_dir(tmp_path / "models" / "inspection")
    make(constant_dir(tmp_path / "src-c"), key, tmp_path / "constant-1.edgerun", "1")
    make(inspection_dir(tmp_path / "src2"), key, tmp_path / "inspection-2.edgerun", "2")
    names = ("box1", "box2", "box3")
    for n in names:
        fleet.device(n, fleet.config(n, v1, PROBATION))
    out = _cli(fleet, "group", "line1", *names)
    assert out.returncode == 0 and "line1: box1, box2, box3" in out.stdout, out.stderr

    bad = _cli(fleet, "deploy", str(tmp_path / "constant-1.edgerun"), "--to", "line1",
               "--canary", "33%", "--wait", "120")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "canary box1" in bad.stdout and "HALTED" in bad.stdout
    assert "agrees with the old model" in bad.stdout
    r = fleet.coord.rollouts.list()[0]
    assert r["state"] == "halted" and r["canary"] == ["box1"]
    for n in ("box2", "box3"):  # never sent the failing model
        assert r["devices"][n]["state"] == WAITING
        assert not fleet.events(n, "model_swapped")
        assert "model" not in fleet.coord.rollouts.desired(n)
    assert "model" not in fleet.coord.rollouts.desired("box1")  # back to what it was

    good = _cli(fleet, "deploy", str(tmp_path / "inspection-2.edgerun"), "--to", "line1",
                "--canary", "33%", "--wait", "180")
    assert good.returncode == 0 and "DONE" in good.stdout, good.stdout + good.stderr
    for n in names:
        wait(lambda n=n: fleet.health(n).get("model_version") == "inspection@2", 30,
             f"{n} on inspection@2", fleet.devices[n])
    (tmp_path / "rollout-output.txt").write_text(bad.stdout + "\n" + good.stdout)

    # box3 comes back with something else (re-imaged: its model store is gone): the
    # coordinator sends its desired model again
    assert fleet.devices["box3"].stop() == 0
    import shutil
    shutil.rmtree(tmp_path / "box3" / "state" / "models")
    fleet.devices["box3"] = Serve(tmp_path / "box3", fleet.config("box3", v1, PROBATION))
    wait(lambda: len(fleet.events("box3", "model_swapped")) >= 2, 120,
         "desired model re-sent to box3", fleet.devices["box3"])
    wait(lambda: ModelStore(tmp_path / "box3" / "state").serving()[0] == "inspection@2", 30,
         "box3 serving inspection@2 again", fleet.devices["box3"])


def test_api_refuses_bad_rollout_requests(tmp_path, api):
    _c, held, base = api

    def post(path, body):
        req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(),
                                     method="POST", headers={"Authorization": "Bearer " +
                                                             "t" * 24})
        try:
            with urllib.request.urlopen(req) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    assert post("/api/v1/rollouts", {"bundle": held.id, "to": "empty"})[0] == 400
    assert post("/api/v1/rollouts", {"bundle": "nope@1", "to": "all"})[0] == 400
    assert post("/api/v1/rollouts", {"bundle": held.id, "to": "g", "canary_pct": 120})[0] \
        == 400
    assert post("/api/v1/groups", {"group": "all", "devices": ["a"]})[0] == 400
    assert post("/api/v1/groups", {"group": "g", "devices": ["a/b"]})[0] == 400
    assert post("/api/v1/groups", {"group": "g", "devices": ["a", "b"]}) == (
        200, {"g": ["a", "b"]})


def test_rollouts_persist_and_a_silent_canary_halts_after_the_timeout(store_url):
    """Rollouts on both store backends and a recording `send`: state survives a new instance (the
    coordinator restarting), a canary that never reports fails at the timeout and halts."""
    from runtime.coordinator.rollout import Rollouts
    from runtime.coordinator.store import Store

    sent = []
    args = {"name": "m", "version": "2", "url": "http://x/api/v1/bundles/m@2", "size": 1,
            "sha256": "0" * 64, "token": "t"}

    def make_rollouts():
        return Rollouts(Store(store_url), lambda d, c, a: sent.append((d, c)),
                        lambda b: args, lambda: ["a", "b", "c"], timeout_s=100)

    r1 = make_rollouts()
    r1.set_group("g", ["a", "b", "c"])
    r = r1.start("m@2", "g", 10)
    assert r["canary"] == ["a"] and sent == [("a", "deploy")]
    r1._store.close()
    r2 = make_rollouts()  # the coordinator restarted: rollout and desired state are there
    assert r2.get(r["id"])["state"] == "canary"
    assert r2.desired("a")["model"] == args and "model" not in r2.desired("b")
    r2.tick(time.time() + 50)
    assert r2.get(r["id"])["state"] == "canary"
    r2.tick(time.time() + 101)
    got = r2.get(r["id"])
    assert got["state"] == "halted" and "no verdict within 100 s" in got["reason"]
    assert sent == [("a", "deploy")]  # b and c never sent
    # a device coming back with another model is sent its desired one again, and settings
    r2.record_setting("b", "set_latency_target", {"ms": 20})
    r2.on_online("b", "")
    assert sent[-1] == ("b", "set_latency_target")
    r2._set_desired("c", {"model": args})
    r2.on_online("c", "m@1")
    assert ("c", "deploy") in sent
    sent.clear()
    r2.on_online("c", "m@2")  # already there: nothing to send
    assert sent == []


@pytest.mark.parametrize("ev, ends", [
    ({"version": "m@2", "reason": "model m@2 deployed", "error": "x"}, True),
    ({"version": "m@20", "reason": "model m@20 deployed", "error": "x"}, False),  # not m@2's
    ({"version": "m@2", "busy": True, "error": "another model install is running"}, False),
    ({"version": "m@1", "reason": "model m@1 chosen"}, False),
    # a device of an older release: no version field, the reason's text decides
    ({"reason": "model m@2 deployed", "error": "x"}, True),
    ({"reason": "model m@2 deployed", "error": "another model install is running"}, False),
])
def test_a_failed_deploy_event_ends_only_its_own_version(ev, ends):
    """model_deploy_failed is matched by its `version` field (a substring of the reason
    text took m@20's failure for m@2's); older devices' events by the reason text."""
    from runtime.coordinator.rollout import _failed_deploy_of

    assert _failed_deploy_of(ev, "m@2") is ends
