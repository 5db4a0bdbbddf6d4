"""Signed commands and payload schemas: pure tables."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from runtime.wire import commands, payloads

NOW = 1_800_000_000.0
KEY = Ed25519PrivateKey.generate()
OTHER = Ed25519PrivateKey.generate()
TRUSTED = {commands.key_id(KEY.public_key()): KEY.public_key()}


def _env(**over):
    env = commands.sign(KEY, "dev1", "set_latency_target", {"ms": 25}, ttl_s=60, now=NOW)
    env.update(over)
    return env


def _resign(env, key=KEY):
    env = {k: v for k, v in env.items() if k != "sig"}
    import base64

    env["sig"] = base64.b64encode(key.sign(commands.canonical(env))).decode()
    return env


def _verify(env, seen=None):
    seen = set() if seen is None else seen

    def remember(cid, exp):
        if cid in seen:
            return False
        seen.add(cid)
        return True

    payloads.check("cmd", env)
    return commands.verify(env, "dev1", TRUSTED, NOW, 300, remember)


def test_valid_command_is_typed():
    cmd = _verify(_env())
    assert cmd.name == "set_latency_target" and cmd.args == {"ms": 25.0}


@pytest.mark.parametrize("env, reason", [
    (_env(args={"ms": 30}), "bad signature"),  # tampered after signing
    (_env(device="dev2"), "addressed to device"),
    (_resign(_env(device="dev2")), "addressed to device"),
    (_resign(_env(), OTHER) | {"key_id": commands.key_id(OTHER.public_key())},
     "unknown signing key"),
    (_resign(_env(key_id=commands.key_id(KEY.public_key())), OTHER), "bad signature"),
    (_resign(_env(expires_at=NOW - 5)), "expired"),
    (_resign(_env(issued_at=NOW + 3600, expires_at=NOW + 3700)), "future"),
    (_resign(_env(cmd="format_disk")), "unknown command"),
    (_resign(_env(args={"ms": -1})), "expected a number"),
    (_resign(_env(args={"ms": True})), "expected a number"),
    (_resign(_env(args={})), "missing argument"),
    (_resign(_env(args={"ms": 5, "x": 1})), "unknown argument"),
    (_resign(_env(cmd="choose_model", args={"name": "../etc"})), "model name"),
    (_env(sig="!!!notbase64"), "bad signature"),
])
def test_refusals(env, reason):
    with pytest.raises(commands.CommandRefused, match=reason):
        _verify(env)


@pytest.mark.parametrize("name, args, refused", [
    # each argument's edges: one in, the next out (the coordinator's API answers 400 for
    # exactly what every device would refuse, so both sides must agree on them)
    ("choose_model", {"name": "m" * 128}, None),
    ("choose_model", {"name": "m" * 129}, "model name"),
    ("choose_model", {"name": ".."}, "model name"),  # no '/', yet the models' parent
    ("choose_model", {"name": ".hidden"}, "model name"),
    ("deploy", {"name": "m", "version": "1", "url": "https://h/" + "x" * 1014, "size": 1,
                "sha256": "0" * 64, "token": "t" * 256}, None),
    ("deploy", {"name": "m", "version": "1", "url": "https://h/" + "x" * 1015, "size": 1,
                "sha256": "0" * 64, "token": ""}, "url: expected an http"),
    ("deploy", {"name": "m", "version": "1", "url": "https://h/b", "size": 1,
                "sha256": "0" * 64, "token": "t" * 257}, "token: expected a download token"),
    ("deploy", {"name": "m", "version": "1", "url": "https://h/b", "size": 0,
                "sha256": "0" * 64, "token": ""}, "size: expected a size"),
    ("deploy", {"name": "m", "version": "1", "url": "https://h/b", "size": True,
                "sha256": "0" * 64, "token": ""}, "size: expected a size"),
    ("set_rate", {"fps": True}, "fps: expected a number"),
    # arguments not an object (the coordinator's API passes a request body's through): a
    # refusal, not a TypeError (a 500) from indexing a list or a string by name
    ("set_rate", ["fps"], "arguments must be an object"),
    ("set_rate", "fps", "arguments must be an object"),
    ("ping", [], "arguments must be an object"),
])
def test_check_args_edges(name, args, refused):
    if refused is None:
        assert commands.check_args(name, args).keys() == set(args)
    else:
        with pytest.raises(commands.CommandRefused, match=refused):
            commands.check_args(name, args)


def test_a_deploy_token_is_masked_for_logs():
    """The download token is a credential: logs and events get '***', the rest as given."""
    args = {"name": "m", "url": "https://h/b", "token": "s3cret"}
    assert commands.loggable(args) == {"name": "m", "url": "https://h/b", "token": "***"}
    assert args["token"] == "s3cret"  # the command itself keeps it


def test_a_configured_device_key_is_used_not_the_default(tmp_path):
    """`[telemetry] device_key` names the key the coordinator holds the public half of: a
    device that made (or used) its default one instead would sign replies no one verifies."""
    kid = commands.generate_keypair(tmp_path / "mine.pem", tmp_path / "mine.pub")
    default = tmp_path / "state" / "device.key"
    key = commands.device_key(str(tmp_path / "mine.pem"), default)
    assert commands.key_id(key.public_key()) == kid and not default.exists()
    made = commands.device_key("", default)  # none configured: the default, made once
    assert default.exists() and default.with_suffix(".pub").exists()
    assert commands.key_id(commands.device_key("", default).public_key()) == \
        commands.key_id(made.public_key())
    with pytest.raises(ValueError, match="absent.pem"):  # configured must exist
        commands.device_key(str(tmp_path / "absent.pem"), default)


def test_replay_is_refused_but_refused_command_does_not_burn_id():
    seen: set = set()
    env = _env()
    _verify(env, seen)
    with pytest.raises(commands.CommandRefused, match="replayed"):
        _verify(env, seen)
    bad = _resign(_env(args={"ms": -1}))
    with pytest.raises(commands.CommandRefused):
        _verify(bad, seen)
    assert bad["id"] not in seen


@pytest.mark.parametrize("raw, where", [
    (b"{not json", "not JSON"),
    (json.dumps({k: v for k, v in _env().items() if k != "sig"}).encode(), "sig"),
    (json.dumps(_env() | {"extra": 1}).encode(), "extra"),
    (b"x" * 10000, "exceeds"),
])
def test_malformed_envelopes(raw, where):
    with pytest.raises(payloads.PayloadError, match=where):
        payloads.decode("cmd", raw, max_bytes=8192)


@pytest.mark.parametrize("name, parsed", [
    ("edgerun/v1/f/d/result", ("f", "d", "result")),
    ("edgerun/v1/f/d/cmd/reply", ("f", "d", "cmd/reply")),
    ("edgerun/v1/f/d/other", None),
    ("edgerun/v2/f/d/result", None),
    ("edgerun/v1/f", None),
])
def test_topics(name, parsed):
    assert payloads.parse_topic(name) == parsed


def test_result_schema_names_the_field():
    with pytest.raises(payloads.PayloadError, match="results/0"):
        payloads.check("result", {"v": 1, "stream": "s", "boot": "b", "floor": 1,
                                  "results": [{"seq": "one", "t": 1}]})


def test_key_files_round_trip(tmp_path):
    kid = commands.generate_keypair(tmp_path / "k.pem", tmp_path / "k.pub")
    assert (tmp_path / "k.pem").stat().st_mode & 0o077 == 0
    assert list(commands.load_public_keys([str(tmp_path / "k.pub")])) == [kid]
    assert commands.key_id(commands.load_private_key(tmp_path / "k.pem").public_key()) == kid
    (tmp_path / "bad.pub").write_text("nope")
    with pytest.raises(ValueError, match="bad.pub"):
        commands.load_public_keys([str(tmp_path / "bad.pub")])


def test_key_files_appear_whole_and_no_temp_is_left(tmp_path):
    for overwrite in (True, False):
        where = tmp_path / str(overwrite)
        commands.generate_keypair(where / "k.pem", where / "k.pub", overwrite=overwrite)
        assert sorted(p.name for p in where.iterdir()) == ["k.pem", "k.pub"]
    with pytest.raises(FileExistsError):  # exclusive: an existing pair is never replaced
        commands.generate_keypair(where / "k2.pem", where / "k.pub", overwrite=False)
    assert sorted(p.name for p in where.iterdir()) == ["k.pem", "k.pub"]


def test_a_device_key_read_half_copied_is_read_again(tmp_path):
    """A key file seen mid-copy (empty) and then whole with the same mtime (the clock's
    granularity) was cached as unusable: every reply of that device stayed unverified."""
    import os

    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator

    commands.generate_keypair(tmp_path / "d.pem", tmp_path / "d.pub")
    keys = tmp_path / "keys"
    keys.mkdir()
    coord = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db"),
                                          device_keys=str(keys)))
    try:
        (keys / "box1.pub").write_bytes(b"")
        os.utime(keys / "box1.pub", ns=(1_000_000_000, 1_000_000_000))
        assert coord.commander.device_key("box1") is None
        (keys / "box1.pub").write_bytes((tmp_path / "d.pub").read_bytes())
        os.utime(keys / "box1.pub", ns=(1_000_000_000, 1_000_000_000))
        assert coord.commander.device_key("box1") is not None
    finally:
        coord.stop()


@pytest.mark.parametrize("configured, events, want", [
    ("5", [], "5"),
    ("5", ["failed"], "3.1.1"),  # a 3.1.1-only broker refused v5
    ("5", ["failed", "failed"], "5"),  # ... or it was just down: keep alternating
    ("5", ["failed", "succeeded", "failed"], "3.1.1"),  # once it worked, it sticks
    ("3.1.1", ["failed", "failed"], "3.1.1"),  # asked for 3.1.1: never tries 5
])
def test_protocol_probe(configured, events, want):
    from runtime.wire.mqtt import ProtocolProbe

    probe = ProtocolProbe(configured)
    for e in events:
        getattr(probe, e)()
    assert probe.current == want
