"""`edgerun serve` and `edgerun check` on a camera URL that cannot be reached the way the
field gets it wrong: a host name that does not resolve (a typo, a camera not yet in the
DNS). `.invalid` never resolves (RFC 2606)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from support.daemon_harness import TESTS, Serve, events, write_config
from support.under_test import child_env
from support.waiting import wait

from models import bundled

pytestmark = pytest.mark.skipif(not (bundled() / "manifest.json").exists(),
                                reason="bundled model not built")
HOST = "cam-7.line.invalid"


@pytest.mark.parametrize("decoder", ["pyav", "opencv"])
def test_a_camera_host_that_does_not_resolve_is_named_as_such(tmp_path, tmp_path_factory,
                                                               decoder):
    """FFmpeg says 'Input/output error' (PyAV) or nothing (OpenCV) for a name the DNS does
    not know: the operator must read that it is the host name, not the camera."""
    pytest.importorskip("av") if decoder == "pyav" else None
    cfg = write_config(tmp_path, tmp_path_factory.mktemp("profiles"),
                       source=f'kind = "capture"\npath = "rtsp://op:pw@{HOST}:554/s1"\n'
                              f'decoder = "{decoder}"\nopen_timeout_s = 3')
    d = Serve(tmp_path, cfg)
    try:
        wait(lambda: "source failed" in d.text(), 60, "the source failing", d)
        assert d.stop() == 0
    finally:
        d.stop()
    want = f"the host name {HOST!r} does not resolve"
    assert want in d.text(), d.text()[-2000:]
    (failed,) = events(d.outbox, "source_failed")
    assert want in failed["error"]
    assert ":pw@" not in d.text()


def test_check_says_a_camera_host_does_not_resolve(tmp_path, tmp_path_factory):
    cfg = write_config(tmp_path, tmp_path_factory.mktemp("profiles"),
                       source=f'kind = "capture"\npath = "rtsp://{HOST}/s1"')
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(cfg)],
                         capture_output=True, text=True, timeout=120, env=child_env(TESTS))
    assert time.monotonic() - t0 < 60
    line = next(x for x in out.stderr.splitlines() if x.startswith("source main:"))
    assert f"note: the host name {HOST!r} does not resolve" in line, line
