"""Broker credentials from config: username/password file and TLS (CA, client cert/key)."""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from runtime.config.telemetry import BrokerConfig, OutboxConfig, TelemetryConfig, TlsConfig
from runtime.telemetry.outbox import Outbox
from runtime.telemetry.publisher import Publisher
from runtime.wire.broker import Mosquitto


def _publisher(tmp_path: Path, broker: BrokerConfig) -> tuple[Publisher, Outbox]:
    cfg = TelemetryConfig(fleet="auth", device="d1", broker=broker,
                          outbox=OutboxConfig(path=str(tmp_path / "o.db")))
    outbox = Outbox(cfg.outbox)
    pub = Publisher(cfg, outbox)
    pub.start()
    return pub, outbox


def _connected(pub: Publisher, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pub.stats.connected:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not shutil.which("mosquitto_passwd"), reason="mosquitto_passwd missing")
def test_username_password_file(tmp_path):
    pw = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-b", "-c", str(pw), "dev", "s3cret"], check=True)
    b = Mosquitto(tmp_path, extra=f"password_file {pw}", auth=False).start()
    b.conf.write_text(b.conf.read_text().replace("allow_anonymous true", "allow_anonymous false"))
    b.stop()
    b.start()
    try:
        (tmp_path / "good").write_text("s3cret\n")
        (tmp_path / "bad").write_text("wrong\n")
        bad, _ = _publisher(tmp_path / "b", BrokerConfig(
            host="127.0.0.1", port=b.port, username="dev", password_file=str(tmp_path / "bad")))
        assert not _connected(bad, 2.0)
        assert "refused" in bad.stats.last_error, bad.stats.last_error
        bad.stop()
        good, _ = _publisher(tmp_path / "g", BrokerConfig(
            host="127.0.0.1", port=b.port, username="dev", password_file=str(tmp_path / "good")))
        assert _connected(good, 10.0)
        good.stop()
    finally:
        b.stop()


def _cert(subject: str, issuer_key, issuer_name, key, ca: bool, san: str | None = None):
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer_name).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if san:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(san))]),
            critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, obj) -> str:
    if isinstance(obj, x509.Certificate):
        path.write_bytes(obj.public_bytes(serialization.Encoding.PEM))
    else:
        path.write_bytes(obj.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(path)


def test_tls_with_client_certificate(tmp_path):
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgerun test CA")])
    ca = _cert("edgerun test CA", ca_key, ca_name, ca_key, ca=True)
    srv_key, cli_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(
        ec.SECP256R1())
    srv = _cert("127.0.0.1", ca_key, ca_name, srv_key, ca=False, san="127.0.0.1")
    cli = _cert("d1", ca_key, ca_name, cli_key, ca=False)
    files = {n: _write(tmp_path / f"{n}.pem", o) for n, o in
             (("ca", ca), ("srv", srv), ("srvkey", srv_key), ("cli", cli), ("clikey", cli_key))}
    b = Mosquitto(tmp_path, extra=(f"cafile {files['ca']}\ncertfile {files['srv']}\n"
                                   f"keyfile {files['srvkey']}\nrequire_certificate true\n"
                                   "use_identity_as_username true")).start()
    try:
        no_cert, _ = _publisher(tmp_path / "n", BrokerConfig(
            host="127.0.0.1", port=b.port, tls=TlsConfig(ca=files["ca"])))
        assert not _connected(no_cert, 2.0)  # the broker requires a client certificate
        no_cert.stop()
        pub, _ = _publisher(tmp_path / "c", BrokerConfig(
            host="127.0.0.1", port=b.port,
            tls=TlsConfig(ca=files["ca"], cert=files["cli"], key=files["clikey"])))
        assert _connected(pub, 10.0), pub.stats.last_error
        pub.stop()
    finally:
        b.stop()
