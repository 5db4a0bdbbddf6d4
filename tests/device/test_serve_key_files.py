"""`edgerun serve` as a real process whose config names broker credential files that cannot
be used: missing, a directory, not text, not a certificate. The daemon serves on (results
kept in the outbox) and says which key and file is wrong, not that the broker is
unreachable (which sent an operator to debug the network)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.daemon_harness import Serve, result_seqs, write_config
from support.waiting import wait

from models import bundled

pytestmark = pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                                reason="bundled model not built")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("profiles")


def _bad(tmp_path: Path, case: str) -> tuple[str, Path, str]:
    """The broker settings for `case`, the file they name wrongly and that file's key."""
    text = tmp_path / "password.txt"
    text.write_text("secret\n")
    if case == "password-missing":
        return f'password_file = "{tmp_path / "nope"}"', tmp_path / "nope", "password_file"
    if case == "password-directory":
        (tmp_path / "pw").mkdir()
        return f'password_file = "{tmp_path / "pw"}"', tmp_path / "pw", "password_file"
    if case == "password-binary":
        (tmp_path / "pw.bin").write_bytes(b"\xff\xfe\x00secret\xd0\n")
        return f'password_file = "{tmp_path / "pw.bin"}"', tmp_path / "pw.bin", "password_file"
    ca = tmp_path / "ca.pem"
    if case == "ca-garbage":
        ca.write_text("not a certificate\n")
    return (f'password_file = "{text}"\n[telemetry.broker.tls]\nca = "{ca}"', ca, "tls.ca")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", ["password-missing", "password-directory", "password-binary",
                                  "ca-missing", "ca-garbage"])
def test_an_unusable_credential_file_is_named_and_the_daemon_serves_on(tmp_path, cache, case):
    settings, path, key = _bad(tmp_path, case)
    # port 1: nothing listens; the credentials are read before any connection is tried
    cfg = write_config(tmp_path, cache, extra=(
        f'[telemetry.broker]\nhost = "127.0.0.1"\nport = 1\nusername = "box1"\n{settings}\n'))
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: d.ready() and f"{key} {path}" in d.text(), 120,
             f"a line naming {key} {path}", d)
        start = len(result_seqs(d.outbox))
        wait(lambda: len(result_seqs(d.outbox)) > start + 10, 60, "results kept meanwhile", d)
        line = next(ln for ln in d.text().splitlines() if f"{key} {path}" in ln)
        assert "unreachable" not in line, line
        assert d.stop() == 0
        assert "Traceback" not in d.text(), d.text()[-3000:]
    finally:
        d.stop()
