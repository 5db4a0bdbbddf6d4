"""Power cuts against the result log, the approach of ALICE (OSDI '14): record what a real
process writes and syncs (`strace -f`), rebuild every disk state a cut could leave, open each.

The writer appends results one at a time with fsync = "full" and prints `durable N` once each
append has returned; it acks some on the way. A cut after any recorded syscall leaves the log
as it was at the last fdatasync plus any prefix of what was written since (a torn append;
reordered pages within one appended file are not modelled). Each state must open, hold every
result reported durable and not acked, give no seq twice and never give a reported seq again.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.under_test import child_env

from runtime.config.telemetry import OutboxConfig
from runtime.telemetry import resultlog
from runtime.telemetry.outbox import Outbox

WRITER = """
import sys
from runtime.config.telemetry import OutboxConfig
from runtime.telemetry.outbox import Outbox
box = Outbox(OutboxConfig(path=sys.argv[1], fsync="full"))
for i in range(12):
    seq = box.append({"i": i, "pad": "x" * 40})
    print(f"durable {seq}", flush=True)
    if seq % 4 == 0:
        box.ack(seq - 2)
box.close()
"""

CALL = re.compile(r'^\d+\s+(write|fdatasync|fsync)\((\d+)<([^>]*)>(?:, "((?:[^"\\]|\\.)*)")?')


def _unhex(s: str) -> bytes:
    return bytes(int(h, 16) for h in re.findall(r"\\x([0-9a-f]{2})", s))


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_every_cut_of_the_log_opens_and_keeps_what_was_reported_durable(tmp_path):
    work = tmp_path / "run"
    work.mkdir()
    db = work / "o.db"
    trace = tmp_path / "trace"
    r = subprocess.run(["strace", "-f", "-y", "-xx", "-s", "100000", "-o", str(trace),
                        "-e", "trace=write,fdatasync,fsync", sys.executable, "-c", WRITER,
                        str(db)], capture_output=True, text=True, timeout=120, env=child_env())
    if r.returncode and "ptrace" in r.stderr:
        pytest.skip(f"strace cannot trace here: {r.stderr.strip()[:200]}")
    assert r.returncode == 0, r.stderr[-2000:]
    # the recorded events, in order: bytes appended to the log, its syncs, what was printed
    events: list[tuple[str, object]] = []
    for line in trace.read_text().splitlines():
        m = CALL.match(line)
        if not m:
            continue
        call, fd, path, data = m.groups()
        path = _unhex(path).decode(errors="replace")  # -xx escapes the names too
        if path.endswith("o.db.log"):
            events.append(("sync", None) if call != "write" else ("append", _unhex(data)))
        elif fd == "1" and call == "write":
            events.append(("say", _unhex(data).decode()))
    assert sum(1 for k, _ in events if k == "sync") >= 12, "the appends were not synced"
    states = 0
    synced = b""
    written = b""
    durable = 0
    for k, v in events:
        if k == "append":
            written += v  # type: ignore[operator]
        elif k == "sync":
            synced = written
        else:
            for n in re.findall(r"durable (\d+)", v):  # type: ignore[arg-type]
                durable = max(durable, int(n))
        tail = written[len(synced):]
        for cut in sorted({0, len(tail) // 2, len(tail) - 1, len(tail)} - {-1}):
            states += 1
            _check_state(tmp_path / "state", db, synced + tail[:cut], durable)
    assert states > 50


def _check_state(where: Path, db: Path, log: bytes, durable: int) -> None:
    """Open the outbox from this disk state: every result reported durable and not acked is
    there, once, and no seq is given again."""
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir()
    shutil.copy(db, where / "o.db")  # results never reach the database here (no spill)
    (where / "o.db.log").write_bytes(log)
    box = Outbox(OutboxConfig(path=str(where / "o.db"), fsync="full"))
    try:
        seqs = [p.seq for p in box.pending(0, 1000)]
        assert seqs == sorted(set(seqs)), f"a seq twice: {seqs}"
        floor = resultlog.read(where / "o.db.log").acked
        # acks are unsynced: an acked result may come back (sent again, stored once at the
        # coordinator), but every one reported durable above the recorded ack is there, and
        # none at or below it
        assert set(range(floor + 1, durable + 1)) <= set(seqs), (seqs, floor, durable)
        assert all(q > floor for q in seqs)
        assert box.last_seq() >= durable
        new = box.append({"after": "cut"})
        assert new > durable  # no reported seq is given again
    finally:
        box.close()
    box = Outbox(OutboxConfig(path=str(where / "o.db"), fsync="full"))
    try:  # what was appended after the cut is read back (not lost behind a torn record)
        assert new in [p.seq for p in box.pending(0, 1000)]
    finally:
        box.close()
