"""How the previous run ended, said at start (runtime/device/instance.py). Found in an outside
run (2026-12-07): seven kill -9s of `edgerun serve` and nothing the fleet received said that
a daemon had died without its stop; systemd's journal stays on the device."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
from support.daemon_harness import Serve, events, write_config
from support.under_test import child_env
from support.waiting import wait

from runtime.device import instance

BOOT = "0123456789ab"


@pytest.mark.parametrize("record,boot,said", [
    ("", BOOT, None),  # a new lock file: no run before
    ("stopped", BOOT, None),
    (f"4242 {BOOT}", BOOT, "killed"),  # running in this boot, and now we are here
    ("4242 ba9876543210", BOOT, "power"),  # running in a boot that ended without its stop
    ("4242\n", BOOT, None),  # an older version's bare pid: cannot tell
    ("42x2 0123456789ab", BOOT, None),  # damaged
    ("\x00" * 63 + "\n", BOOT, None),  # a block of zeros after a cut
    (f"4242 {BOOT}", "unknown", None),  # no boot id here: cannot tell killed from power
])
def test_previous_end_table(record, boot, said):
    assert instance.previous_end(record.ljust(63) + "\n", boot) == said


def test_the_record_is_written_in_place_and_read_back(tmp_path):
    path = tmp_path / "outbox.db.lock"
    path.write_text("4242\n")  # an older version's
    fd = instance.claim_outbox(tmp_path / "outbox.db")
    try:
        assert instance.take_over(fd, BOOT) is None
        assert path.read_text() == f"{os.getpid()} {BOOT}".ljust(63) + "\n"
        instance.mark_stopped(fd)
        assert path.read_text().split() == ["stopped"]
        assert instance.take_over(fd, BOOT) is None  # stopped: nothing to say
        assert instance.take_over(fd, BOOT) == "killed"  # still running from the line above
    finally:
        os.close(fd)


TAKE_OVER = """
import sys
from pathlib import Path
from runtime.device import instance
fd = instance.claim_outbox(Path(sys.argv[1]))
instance.take_over(fd, "0123456789ab")
print("running", flush=True)
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_the_running_record_is_on_the_disk_before_the_run_goes_on(tmp_path):
    """A power cut before the kernel wrote the running record back (up to ~35 s after the
    start: dirty_expire_centisecs plus the flusher's period) left the clean stop of the run
    before on the disk, and the next start said nothing of the cut: a device that loses power
    as its model loads (a supply sagging under the load) was never seen to. Traced: the
    record's pwrite, then a sync of the lock file, before the take-over returns."""
    trace = tmp_path / "trace"
    r = subprocess.run(["strace", "-f", "-y", "-o", str(trace), "-e",
                        "trace=pwrite64,fdatasync,fsync,write", sys.executable, "-c",
                        TAKE_OVER, str(tmp_path / "outbox.db")],
                       capture_output=True, text=True, timeout=120, env=child_env())
    if r.returncode and "ptrace" in r.stderr:
        pytest.skip(f"strace cannot trace here: {r.stderr.strip()[:200]}")
    assert r.returncode == 0 and "running" in r.stdout, r.stderr[-2000:]
    calls = [m.group(1) for line in trace.read_text().splitlines()
             if (m := re.search(r"(pwrite64|fdatasync|fsync)\(\d+<[^>]*outbox\.db\.lock>", line))
             or (m := re.search(r"(write)\(1<", line))]
    assert "pwrite64" in calls and "write" in calls, calls
    after = calls[calls.index("pwrite64"):calls.index("write")]
    assert {"fdatasync", "fsync"} & set(after), f"not synced before the run went on: {calls}"


def _unclean(d: Serve) -> list[dict]:
    return [e for e in events(d.outbox, "unclean_stop")]


def test_a_killed_run_is_said_at_the_next_start_and_a_clean_stop_is_not(tmp_path):
    cfg = write_config(tmp_path, tmp_path / "cache")
    first = Serve(tmp_path, cfg)
    try:
        wait(first.ready, 120, "the first daemon ready", first)
    finally:
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(30)
    second = Serve(tmp_path, cfg)
    try:
        wait(second.ready, 120, "a daemon after the kill", second)
        assert "the last run ended without its stop in this boot" in second.text()
        assert [e["how"] for e in _unclean(second)] == ["killed"]
    finally:
        assert second.stop() == 0, second.text()[-3000:]
    # a power cut in an earlier boot: the record of a run in another boot, as a cut leaves it
    lock = tmp_path / "state" / "outbox.db.lock"
    assert lock.read_text().split() == ["stopped"]
    third = Serve(tmp_path, cfg)
    try:
        wait(third.ready, 120, "a daemon after a clean stop", third)
        assert "the last run" not in third.text()
        assert len(_unclean(third)) == 1  # the first one's only
    finally:
        third.proc.send_signal(signal.SIGKILL)
        third.proc.wait(30)
    lock.write_text("4242 ba9876543210".ljust(63) + "\n")
    fourth = Serve(tmp_path, cfg)
    try:
        wait(fourth.ready, 120, "a daemon after a power cut", fourth)
        assert "cut off by a power loss or a reset" in fourth.text()
        assert [e["how"] for e in _unclean(fourth)] == ["killed", "power"]
    finally:
        assert fourth.stop() == 0


def test_a_start_that_fails_before_saying_leaves_it_for_the_next(tmp_path):
    """A power cut damages the state; the next start fails on it (here: a device profile that
    does not parse) before it has said how the run before ended; the operator fixes it, and
    the start after says it: the failed start put the record back."""
    cfg = write_config(tmp_path, tmp_path / "cache")
    lock = tmp_path / "state" / "outbox.db.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("4242 ba9876543210".ljust(63) + "\n")  # a run of an earlier boot
    bad = tmp_path / "bad.toml"
    bad.write_text("[power\n")
    broken = tmp_path / "broken.toml"
    broken.write_text(cfg.read_text().replace('profile = "generic-x86"', f'profile = "{bad}"'))
    assert broken.read_text() != cfg.read_text()
    failed = Serve(tmp_path, broken)
    try:
        assert failed.proc.wait(120) != 0, failed.text()[-3000:]
    finally:
        failed.stop()
    assert "ready in" not in failed.text()
    after = Serve(tmp_path, cfg)
    try:
        wait(after.ready, 120, "a daemon on the mended config", after)
        assert "cut off by a power loss or a reset" in after.text()
        assert [e["how"] for e in _unclean(after)] == ["power"]
    finally:
        assert after.stop() == 0
