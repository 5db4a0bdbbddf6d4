"""`edgerun fleet enroll` against a real Mosquitto: the credential works after a reload, the
written config section loads, the key pair matches, and the device is confined by the ACL."""

from __future__ import annotations

import stat

from runtime import config as config_mod
from runtime.cli import main
from runtime.telemetry import commands
from runtime.telemetry.broker import Mosquitto, can_login


def test_enroll_device_then_coordinator_log_in_with_what_was_written(tmp_path, capsys):
    b = Mosquitto(tmp_path).start()
    try:
        commands.generate_keypair(tmp_path / "cmd.pem", tmp_path / "cmd.pub")
        out, keys = tmp_path / "dev1-files", tmp_path / "device-keys"
        assert main(["fleet", "enroll", "dev1", "--fleet", "f1", "--broker-dir",
                     str(b.auth.dir), "--out", str(out), "--device-keys", str(keys),
                     "--port", str(b.port), "--command-key", str(tmp_path / "cmd.pub")]) == 0
        printed = capsys.readouterr().out
        assert "systemctl reload mosquitto" in printed and "f1/dev1" in printed
        for secret in ("broker.password", "device.key"):
            assert stat.S_IMODE((out / secret).stat().st_mode) == 0o600
        cfg = config_mod.load(out / "telemetry.toml").telemetry
        assert (cfg.fleet, cfg.device, cfg.broker.username) == ("f1", "dev1", "f1/dev1")
        assert cfg.broker.port == b.port
        password = (out / "broker.password").read_text().strip()
        assert not can_login(b.port, "f1/dev1", password)  # not before the broker reloads
        b.reload("f1/dev1", password)
        assert can_login(b.port, "f1/dev1", password)
        # the private key on the device and the public key at the coordinator are one pair
        key = commands.load_private_key(cfg.device_key)
        pub = commands.load_public_keys([str(keys / "dev1.pub")])
        assert list(pub) == [commands.key_id(key.public_key())]
        assert list(commands.load_public_keys(list(cfg.trusted_keys))) == [
            commands.key_id(commands.load_private_key(tmp_path / "cmd.pem").public_key())]

        cout = tmp_path / "coord-files"
        assert main(["fleet", "enroll", "coord-a", "--role", "coordinator", "--fleet", "f1",
                     "--broker-dir", str(b.auth.dir), "--out", str(cout),
                     "--device-keys", str(keys), "--port", str(b.port)]) == 0
        ccfg = config_mod.load(cout / "coordinator.toml").coordinator
        assert ccfg.broker.username == "coord-a" and ccfg.device_keys == str(keys)
        cpw = (cout / "broker.password").read_text().strip()
        b.reload("coord-a", cpw)
        assert can_login(b.port, "f1/dev1", password)  # enrolling others keeps dev1 valid
        assert "topic write edgerun/v1/f1/+/cmd" in b.auth.acl.read_text()
    finally:
        b.stop()


def test_enroll_refuses_bad_names_and_missing_key_dir(tmp_path, capsys):
    assert main(["fleet", "enroll", "dev/1", "--broker-dir", str(tmp_path / "b"),
                 "--out", str(tmp_path / "o"), "--device-keys", str(tmp_path / "k")]) == 2
    assert "device must be" in capsys.readouterr().err
    assert main(["fleet", "enroll", "dev1", "--broker-dir", str(tmp_path / "b"),
                 "--out", str(tmp_path / "o")]) == 2
    assert "--device-keys" in capsys.readouterr().err
    assert not (tmp_path / "b" / "passwd").exists()  # nothing half-written
