"""`edgerun fleet enroll` against a real Mosquitto: the credential works after a reload, the
written config section loads, the key pair matches, and the device is confined by the ACL."""

from __future__ import annotations

import shutil
import stat
import subprocess
import time

import pytest

from runtime import config as config_mod
from runtime.cli import main
from runtime.wire import commands
from runtime.wire.broker import Mosquitto, can_login


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
        # revocation: the broker drops the user at the next reload, even while connected
        assert main(["fleet", "revoke", "dev1", "--fleet", "f1", "--broker-dir",
                     str(b.auth.dir)]) == 0
        assert "f1/dev1" not in b.auth.passwd.read_text()
        b.reload()  # returns once the broker has reloaded: the revocation is in force
        assert not can_login(b.port, "f1/dev1", password)
        assert main(["fleet", "revoke", "dev1", "--fleet", "f1", "--broker-dir",
                     str(b.auth.dir)]) == 1
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


def test_an_enrolment_that_begins_a_broker_directory_says_so(tmp_path, capsys):
    """A mistyped --broker-dir begins a directory no broker reads: the credential printed
    would never log in. The first enrolment there says so and where the broker must read it;
    the next ones, into a directory with enrolled identities, do not."""
    keys, broker_dir = tmp_path / "keys", tmp_path / "brokre"
    argv = ["--broker-dir", str(broker_dir), "--device-keys", str(keys)]
    assert main(["fleet", "enroll", "dev1", "--out", str(tmp_path / "o1"), *argv]) == 0
    err = capsys.readouterr().err
    assert "held no enrolled identity" in err and f"password_file {broker_dir}/passwd" in err
    assert main(["fleet", "enroll", "dev2", "--out", str(tmp_path / "o2"), *argv]) == 0
    assert "held no enrolled identity" not in capsys.readouterr().err


@pytest.mark.skipif(not shutil.which("openssl"), reason="openssl missing")
def test_security_md_walkthrough_tls_enrol_reload_then_results_flow(tmp_path):
    """docs/security.md steps 1-5 on loopback: fleet CA and broker certificate with openssl,
    a TLS listener using the enrolled password/ACL files, enrol, reload, and a coordinator and
    a device configured from what enrol wrote exchange results and acks over TLS."""
    from dataclasses import replace

    from runtime.config.telemetry import OutboxConfig, TlsConfig
    from runtime.coordinator.service import Coordinator
    from runtime.telemetry.outbox import Outbox
    from runtime.telemetry.publisher import Publisher
    from runtime.wire.broker import free_port

    pki = tmp_path / "pki"
    pki.mkdir()

    def ossl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=pki, check=True, capture_output=True)

    ossl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-days", "3650", "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=edgerun fleet CA")
    ossl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", "broker.key", "-out", "broker.csr", "-subj", "/CN=127.0.0.1")
    (pki / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    ossl("x509", "-req", "-in", "broker.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-CAcreateserial", "-days", "825", "-extfile", "san.ext", "-out", "broker.crt")
    tls_port = free_port()
    b = Mosquitto(tmp_path, extra=(f"listener {tls_port} 127.0.0.1\ncafile {pki / 'ca.crt'}\n"
                                   f"certfile {pki / 'broker.crt'}\n"
                                   f"keyfile {pki / 'broker.key'}\ntls_version tlsv1.2")).start()
    try:
        enrol = tmp_path / "enrol"
        common = ["--broker-dir", str(b.auth.dir), "--port", str(tls_port)]
        assert main(["fleet", "enroll", "coordinator", "--role", "coordinator", "--fleet", "F",
                     "--out", str(enrol / "coordinator"), "--device-keys",
                     str(enrol / "device-keys"), *common]) == 0
        assert main(["fleet", "enroll", "D", "--fleet", "F", "--out", str(enrol / "D"),
                     "--device-keys", str(enrol / "device-keys"), *common]) == 0
        b.reload()
        tls = TlsConfig(ca=str(pki / "ca.crt"))
        ccfg = config_mod.load(enrol / "coordinator" / "coordinator.toml").coordinator
        ccfg = replace(ccfg, store=str(tmp_path / "c.db"),
                       broker=replace(ccfg.broker, tls=tls))
        dcfg = config_mod.load(enrol / "D" / "telemetry.toml").telemetry
        dcfg = replace(dcfg, broker=replace(dcfg.broker, tls=tls),
                       outbox=OutboxConfig(path=str(tmp_path / "o.db")))
        coord = Coordinator(ccfg)
        coord.start()
        outbox = Outbox(dcfg.outbox)
        pub = Publisher(dcfg, outbox)
        pub.start()
        try:
            for _ in range(20):
                outbox.append({"t": time.time(), "label": "ok", "score": 0.5})
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and coord.store.counts().get("D", 0) < 20:
                time.sleep(0.1)
            assert coord.store.counts().get("D") == 20
            assert list(coord.store.acks().values()) == [20]  # acks flow back over TLS
        finally:
            pub.stop()
            outbox.close()
            coord.stop()
        log = (tmp_path / "mosquitto.log").read_text()
        assert "u'F/D'" in log and "u'coordinator'" in log
    finally:
        b.stop()
