"""A state disk filled while what the outbox keeps there is all acked (runtime/telemetry/
outbox.py). Found in a field run (2026-12-07): a daemon on an RTSP camera, its state on a 3 MB
tmpfs; the disk filled, space returned, and 4 minutes later the outbox's own files (its
result log, every line acked, under `log_restart_bytes`, and the WAL of the flush) took the
disk again. With the broker up and every result acked, the outbox held new results in memory
and retried every 5 s for good: nothing it retries frees a byte, and the acked log it could
start again waits for a flush that cannot write. 800 results held after 90 s, the
coordinator's count stood still; at memory_max_bytes results are refused (lost).

The disk is real: a small tmpfs (root only; skipped elsewhere, saying so)."""

from __future__ import annotations

import subprocess
import time

import pytest

from runtime.config.telemetry import OutboxConfig
from runtime.telemetry.outbox import Outbox


@pytest.fixture
def small_disk(tmp_path):
    import os

    path = tmp_path / "disk"
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs (a real full disk) needs root")
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(path)],
                         capture_output=True, text=True)
    if got.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()}")
    yield path
    subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(path) -> None:
    """Take every free byte (unbuffered, big blocks then small)."""
    with (path / "filler").open("ab", buffering=0) as f:
        for size in (1 << 20, 64 << 10, 4096, 512, 1):
            block = b"\0" * size
            try:
                while f.write(block):
                    pass
            except OSError:
                pass


def test_a_disk_full_of_the_outboxs_acked_log_is_given_back(small_disk):
    ob = Outbox(OutboxConfig(path=str(small_disk / "outbox.db"), retry_s=0.1))
    try:
        body = {"t": 1.0, "label": "ok", "score": 0.5, "pad": "x" * 250}
        while (small_disk / "outbox.db.log").stat().st_size < 800_000:  # under 1 MiB:
            seqs = ob.append_many([body] * 50)  # the log is not started again by its size
            ob.ack(seqs[-1])  # the coordinator stores each batch at once
        _fill(small_disk)  # another writer (a journal, a core dump) takes the rest
        n = 0
        while not ob.stats()["disk_full"]:
            seqs = ob.append_many([body])
            n += 1
            assert n < 100_000, "the full disk never refused a write"
        ob.ack(ob.last_seq())  # everything on disk is acked: the log holds nothing needed
        deadline = time.monotonic() + 5
        while not ob.retry():
            assert time.monotonic() < deadline, (
                f"still holding in memory with every result on disk acked: {ob.stats()}")
            time.sleep(0.1)
        assert ob.append_many([body]) and not ob.stats()["disk_full"]
    finally:
        ob.close()
