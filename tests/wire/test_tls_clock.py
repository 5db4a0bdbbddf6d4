"""A broker certificate "not yet valid" before the clock is synced is logged with its cause:
a real TLS handshake against a certificate whose notBefore is tomorrow (runtime/wire/mqtt.py
clock_cause, runtime/wire/clock.py tls_time_cause)."""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import socket
import ssl
import threading

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from runtime.config.telemetry import BrokerConfig, TlsConfig
from runtime.wire import clock, mqtt
from runtime.wire.clock import Reading, Status

NOW = 1_790_000_000.0


@pytest.mark.parametrize("code, state, says", [
    (clock.CERT_NOT_YET_VALID, "unsynced", "not yet valid by this clock"),
    (clock.CERT_NOT_YET_VALID, "implausible", "not yet valid by this clock"),
    (clock.CERT_HAS_EXPIRED, "implausible", "expired by this clock"),
    (clock.CERT_NOT_YET_VALID, "synced", None),  # a synced clock: the certificate's fault
    (18, "unsynced", None),  # self-signed, not a matter of time
])
def test_tls_time_cause(code, state, says):
    why = clock.tls_time_cause(code, Status(state, "because"), NOW)
    assert (why is None) if says is None else (says in why and state in why)


def _cert(tmp_path, not_before: dt.datetime):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_before + dt.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(
                ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    crt, pem = tmp_path / "broker.crt", tmp_path / "broker.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


@pytest.fixture
def tls_server(tmp_path):
    """A TLS listener on loopback serving a certificate valid only from tomorrow."""
    crt, key = _cert(tmp_path, dt.datetime.now(dt.UTC) + dt.timedelta(days=1))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(10)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            # the client refuses our certificate: what the test wants
            with conn, contextlib.suppress(ssl.SSLError, OSError):
                ctx.wrap_socket(conn, server_side=True).close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield sock.getsockname()[1], crt
    stop.set()
    sock.close()
    t.join(10)


def _refusal(port: int, crt) -> BaseException:
    b = BrokerConfig(host="127.0.0.1", port=port, tls=TlsConfig(ca=str(crt)))
    client = mqtt.make_client(b, "tls-test", "3.1.1")
    with pytest.raises((OSError, ValueError)) as got:
        mqtt.connect(client, b, "3.1.1")
    return got.value


def test_not_yet_valid_before_sync_names_the_clock(tls_server, monkeypatch):
    port, crt = tls_server
    e = _refusal(port, crt)
    assert isinstance(e, ssl.SSLCertVerificationError)
    assert e.verify_code == clock.CERT_NOT_YET_VALID, e
    # the clock at the edge reads 1970 (a Pi without an RTC battery, before NTP)
    monkeypatch.setattr(clock, "read", lambda *a, **k: Reading(0.0, 5.0, "kb", False, False))
    why = mqtt.clock_cause(e)
    assert why and "not yet valid" in why and "1970-01-01" in why and "implausible" in why
    # synced: the certificate itself is at fault, nothing is blamed on the clock
    monkeypatch.setattr(clock, "read", lambda *a, **k: Reading(NOW, 5.0, "kb", True, True))
    assert mqtt.clock_cause(e) is None
