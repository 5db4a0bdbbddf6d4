"""Every log line reaches journald at its priority (issue 14, item 7): `<N>` prefixes on the
journal stream systemd names in $JOURNAL_STREAM, plain text anywhere else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.daemon_harness import Serve, write_config
from support.under_test import child_env
from support.waiting import wait

from models import bundled
from runtime import journal

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import logging, sys
from runtime import journal
journal.setup(logging.DEBUG)
log = logging.getLogger("edgerun.t")
log.debug("a debug line")
log.info("an info line")
log.warning("a warning line")
log.error("an error line")
log.critical("a critical line")
try:
    1 / 0
except ZeroDivisionError:
    log.exception("a failure with a traceback")
"""


def _stream_id(path: Path) -> str:
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


def _run(tmp_path: Path, journal_stream: str | None) -> list[str]:
    """SCRIPT's stderr lines, stderr being a file and JOURNAL_STREAM as given."""
    err = tmp_path / "stderr.txt"
    err.write_text("")
    env = {k: v for k, v in child_env().items() if k != "JOURNAL_STREAM"}
    if journal_stream is not None:
        env["JOURNAL_STREAM"] = journal_stream.replace("SELF", _stream_id(err))
    with err.open("w") as f:
        subprocess.run([sys.executable, "-c", SCRIPT], stderr=f, env=env, check=True,
                       timeout=60)
    return err.read_text().splitlines()


def test_priority_of_each_level():
    assert [journal.priority(x) for x in (50, 40, 30, 20, 10, 25, 5)] == [2, 3, 4, 6, 7, 6, 7]


def test_prefixes_on_the_journal_stream(tmp_path):
    lines = _run(tmp_path, "SELF")
    assert lines[:5] == ["<7>DEBUG edgerun.t: a debug line", "<6>INFO edgerun.t: an info line",
                         "<4>WARNING edgerun.t: a warning line",
                         "<3>ERROR edgerun.t: an error line",
                         "<2>CRITICAL edgerun.t: a critical line"]
    # a traceback is one record over many lines: journald reads each line's own prefix
    tb = lines[5:]
    assert tb[0] == "<3>ERROR edgerun.t: a failure with a traceback"
    assert len(tb) > 3 and all(line.startswith("<3>") for line in tb), tb
    assert tb[-1] == "<3>ZeroDivisionError: division by zero"


@pytest.mark.parametrize("value", [None, "", "1:2", "garbage", "SELF:9"])
def test_plain_text_when_stderr_is_not_the_journal(tmp_path, value):
    # unset, empty, another stream (a child that inherited the variable), or malformed
    lines = _run(tmp_path, value)
    assert lines[1] == "INFO edgerun.t: an info line"
    assert lines[2] == "WARNING edgerun.t: a warning line"
    assert not any(line.startswith("<") for line in lines)


def test_a_refused_config_is_an_error_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon]\nqueue_size = 0\n")
    err = tmp_path / "stderr.txt"
    err.write_text("")
    env = child_env(JOURNAL_STREAM=_stream_id(err))
    with err.open("w") as f:
        rc = subprocess.run([sys.executable, "-m", "runtime.cli", "check", str(bad)],
                            stderr=f, stdout=subprocess.DEVNULL, env=env, timeout=60).returncode
    assert rc == 2
    text = err.read_text()
    assert text.startswith("<3>edgerun: ") and "queue_size" in text, text


@pytest.mark.skipif(not (bundled() / "manifest.json").exists(), reason="bundled model not built")
def test_serve_files_its_warnings_as_warnings(tmp_path):
    # A source that cannot open: `serve` keeps running and warns, start-up lines are info.
    log = tmp_path / "daemon.log"
    log.write_text("")
    cfg = write_config(tmp_path, tmp_path / "cache",
                       source=f'kind = "folder"\npath = "{tmp_path / "missing"}"')
    d = Serve(tmp_path, cfg, env={"JOURNAL_STREAM": _stream_id(log)})
    try:
        wait(lambda: "source failed" in d.text(), 120, "a source warning", d)
    finally:
        assert d.stop() == 0
    lines = d.text().splitlines()
    warn = [x for x in lines if "source failed" in x]
    assert warn and all(x.startswith("<4>WARNING edgerun.pipeline: ") for x in warn), warn
    assert any(x.startswith("<6>INFO edgerun.daemon: ready in") for x in lines), lines
    assert all(x.startswith("<") for x in lines), [x for x in lines if not x.startswith("<")]
