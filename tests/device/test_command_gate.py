"""One verdict per command: a correctly signed command with an argument out of its range gets
exactly one reply from a real `edgerun serve`, `refused`, and changes nothing it keeps."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from support.daemon_harness import Serve, write_broker_config
from support.waiting import wait

from models import bundled
from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.service import Coordinator
from runtime.wire import commands, payloads

# one valid set of arguments per command, and the out-of-range values of each argument
VALID: dict[str, dict] = {
    "set_latency_target": {"ms": 50.0}, "set_accuracy_floor": {"value": 0.5},
    "set_rate": {"fps": 5.0}, "choose_model": {"name": "other"},
    "deploy": {"name": "m", "version": "1.0", "url": "https://h/b", "size": 10,
               "sha256": "0" * 64, "token": "t"},
    "reprofile": {}, "rebirth": {}, "ping": {}}
BAD: dict[tuple[str, str], list] = {
    ("set_latency_target", "ms"): [0.0, -1, 60_001, 1e300, True, "5", None],
    ("set_accuracy_floor", "value"): [-0.1, 1.5, False, "1"],
    ("set_rate", "fps"): [-1, -0.001, 1000.5, True, "5", None, [5]],
    ("choose_model", "name"): ["", "a/b", ".hidden", "x" * 129, 5],
    ("deploy", "name"): ["a/b", ""], ("deploy", "version"): ["", "1 0", "../x"],
    ("deploy", "url"): ["ftp://h/b", "h/b", "https://" + "h" * 1024],
    ("deploy", "size"): [0, -1, 1.5, True, (1 << 40) + 1],
    ("deploy", "sha256"): ["0" * 63, "G" * 64, "A" * 64],
    ("deploy", "token"): ["t" * 257, 5],
}


def cases() -> list[tuple[str, dict, str]]:
    """(command, arguments, the argument named in the refusal): every out-of-range value of
    every argument, each command's missing arguments, an unknown argument to each."""
    out = [(name, {**VALID[name], arg: v}, arg) for (name, arg), vs in BAD.items() for v in vs]
    out += [(name, {k: v for k, v in VALID[name].items() if k != arg}, arg)
            for name in VALID for arg in VALID[name]]
    out += [(name, {**VALID[name], "extra": 1}, "extra") for name in VALID]
    return out


def test_the_table_covers_every_command_and_argument():
    assert set(VALID) == set(commands.COMMANDS)
    assert {(n, a) for n, spec in commands.COMMANDS.items() for a in spec} == set(BAD)


@pytest.mark.parametrize("name,args,arg", cases())
def test_verify_refuses_each_out_of_range_argument_naming_it(name, args, arg):
    key = commands.Ed25519PrivateKey.generate()
    trusted = {commands.key_id(key.public_key()): key.public_key()}
    env = commands.sign(key, "d", name, args, now=1000.0)
    with pytest.raises(commands.CommandRefused, match=arg):
        commands.verify(env, "d", trusted, 1000.0, 5.0, lambda i, e: True)


serve_only = pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                                reason="bundled model not built")


@serve_only
def test_out_of_range_commands_get_one_refusal_each_and_change_nothing(
        tmp_path, broker, profile_cache):
    """Every command with an argument out of its range (commands.out_of_range), signed and
    published raw to the device's command topic: one reply each, `refused`, naming the
    argument; a ping after each proves no second reply was on its way (replies to one
    publisher's commands come back in order); the kept settings are unchanged."""
    commands.generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    key = commands.load_private_key(tmp_path / "k.pem")
    coord = Coordinator(CoordinatorConfig(fleet="sys", broker=broker.coordinator("sys"),
                                          store=str(tmp_path / "coord.db")))
    coord.start()
    cfg = write_broker_config(tmp_path, broker, profile_cache)
    cfg.write_text(cfg.read_text().replace(
        '[telemetry]\n', f'[telemetry]\ntrusted_keys = ["{tmp_path / "k.pub"}"]\n'))
    d = Serve(tmp_path, cfg)
    replies: list[dict] = []
    raw = broker.coordinator("sys", "raw")
    cli = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2)
    cli.username_pw_set(raw.username, Path(raw.password_file).read_text().strip())
    cli.on_message = lambda c, u, m: replies.append(json.loads(m.payload))
    subacks: list[int] = []
    cli.on_subscribe = lambda c, u, mid, codes, p: subacks.append(mid)
    try:
        wait(lambda: coord.store.counts().get("box1", 0) >= 5, 120, "results", d)
        state = tmp_path / "state"
        kept = {p.name: p.read_bytes() for p in state.glob("*.json")
                if p.name in ("settings.json", "control.json")}
        cli.connect("127.0.0.1", broker.port)
        _, mid = cli.subscribe(payloads.topic("sys", "box1", "cmd/reply"), 1)
        cli.loop_start()
        wait(lambda: mid in subacks, 30, "the SUBACK of cmd/reply")
        for name, args, arg in cases():
            env = commands.sign(key, "box1", name, args)
            ping = commands.sign(key, "box1", "ping")
            for e in (env, ping):
                cli.publish(payloads.topic("sys", "box1", "cmd"),
                            payloads.encode("cmd", e), qos=1).wait_for_publish(10)
            wait(lambda ping=ping: any(r["id"] == ping["id"] for r in replies), 30,
                 f"the ping after {name} {args}", d)
            mine = [r for r in replies if r["id"] == env["id"]]
            assert [r["status"] for r in mine] == ["refused"], (name, args, mine)
            # the device answers refused commands at most 10 a second (a flood of bad commands
            # is not answered in kind: publisher.py's bucket, burst 20); a fast host sent these
            # faster and lost replies to the bucket, as it should
            time.sleep(0.12)
            assert arg in mine[0]["reason"], mine
        now = {p.name: p.read_bytes() for p in state.glob("*.json")
               if p.name in ("settings.json", "control.json")}
        assert now == kept
        assert d.proc.poll() is None
    finally:
        cli.loop_stop()
        cli.disconnect()
        assert d.stop() == 0
        coord.stop()
        shutil.rmtree(tmp_path / "profiles", ignore_errors=True)


@pytest.fixture
def api(tmp_path):
    """A coordinator that may command (a signing key) and knows device d, with its API."""
    from runtime.coordinator.api import serve
    from runtime.coordinator.store import Inbound, Store

    commands.generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    store = Store(tmp_path / "c.db")
    store.ingest([Inbound("d", "state", {"v": 1, "online": True, "boot": "b", "t": 1.0})])
    store.close()
    coord = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db"),
                                          signing_key=str(tmp_path / "k.pem")))
    assert "d" in coord.views
    server = serve(coord, "127.0.0.1", 0, timeout_s=0.5)
    token = (tmp_path / "api-token").read_text().strip()
    yield server.server_address[1], token
    server.shutdown()
    coord.stop()


@pytest.mark.parametrize("name,args,arg", cases())
def test_the_api_answers_400_naming_the_argument_every_device_would_refuse(api, name, args,
                                                                            arg):
    """The coordinator holds commands to the devices' own gate (commands.check_args): what
    every device refuses is never signed, and the API says which argument (it used to sign
    and send `set_rate fps=-1`, and answer with the device's refusal or a 504)."""
    import urllib.error
    import urllib.request

    port, token = api
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/devices/d/commands", method="POST",
        data=json.dumps({"cmd": name, "args": args, "wait_s": 0}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 400
    assert arg in json.loads(e.value.read())["error"]
