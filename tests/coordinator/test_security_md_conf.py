"""docs/security.md step 2's mosquitto.conf, run by Mosquitto as written (paths and port moved
to a temp dir). Found in a field run (2026-12-07): the page set `use_username_as_clientid`
and `set_tcp_nodelay` above the first `listener` line, and Mosquitto opened a default plain
listener on 0.0.0.0:1883 and [::]:1883 for them, the open port the page warns against."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from runtime.wire.broker import free_port, mosquitto_path, wait_port
from runtime.wire.brokerauth import BrokerAuth

DOC = Path(__file__).parents[2] / "docs" / "security.md"

pytestmark = [pytest.mark.skipif(not mosquitto_path(), reason="mosquitto is not installed"),
              pytest.mark.skipif(not shutil.which("openssl"), reason="openssl missing")]


def _doc_conf() -> str:
    """The fenced block under '### 2. mosquitto.conf'."""
    text = DOC.read_text()
    step = text[text.index("### 2. mosquitto.conf"):]
    return re.search(r"```\n(.*?)```", step, re.S).group(1)


def test_the_documented_mosquitto_conf_opens_only_its_own_listener(tmp_path):
    pki = tmp_path / "pki"
    pki.mkdir()

    def ossl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=pki, check=True, capture_output=True)

    ossl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-days", "3650", "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=test CA")
    ossl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
         "-keyout", "broker.key", "-out", "broker.csr", "-subj", "/CN=127.0.0.1")
    (pki / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    ossl("x509", "-req", "-in", "broker.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
         "-CAcreateserial", "-days", "825", "-extfile", "san.ext", "-out", "broker.crt")
    auth = BrokerAuth(tmp_path / "edgerun")
    auth.ensure()
    for name in ("ca.crt", "broker.crt", "broker.key"):
        shutil.copy(pki / name, auth.dir / name)
    port = free_port()
    conf = _doc_conf().replace("/etc/mosquitto/edgerun", str(auth.dir)) \
        .replace("listener 8883", f"listener {port} 127.0.0.1")
    assert "listener 1883" not in conf and f"listener {port}" in conf
    # as root, mosquitto would drop to its own user, who cannot read a private temp dir
    user = "user root\n" if os.geteuid() == 0 else ""
    (tmp_path / "mosquitto.conf").write_text(user + conf)
    log = tmp_path / "mosquitto.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([mosquitto_path(), "-c", str(tmp_path / "mosquitto.conf"),
                                 "-v"], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_port(port)
        time.sleep(0.3)  # every listener is opened before the first accepts
        opened = re.findall(r"Opening ipv[46] listen socket on port (\d+)", log.read_text())
    finally:
        proc.terminate()
        proc.wait(10)
    assert opened == [str(port)], log.read_text()
