"""A second `edgerun serve` on the outbox a running one uses (an operator trying the config by
hand while the service runs, two units, or two configs that leave `[telemetry.outbox] path` at
its default). Found in a field run (2026-12-07): the second started beside the first on the
same state directory and outbox; both handed out seqs of the one stream from their own
counters (the second's first ack was "for seq 18636, beyond the highest we sent (18611)"),
the coordinator kept one result per seq, and every result the second made in its 40 s was
lost without a word; the two took over each other's broker session 45 times. The second must
refuse to start, naming the first."""

from __future__ import annotations

import os

from support.daemon_harness import Serve, write_config
from support.waiting import wait


def test_a_second_serve_on_the_same_outbox_refuses_to_start(tmp_path):
    cfg = write_config(tmp_path, tmp_path / "cache")
    first = Serve(tmp_path, cfg)
    try:
        wait(first.ready, 120, "the first daemon ready", first)
        (tmp_path / "second").mkdir()
        second = Serve(tmp_path / "second", cfg)  # the same config: the same outbox
        try:
            code = second.proc.wait(120)
        finally:
            second.stop()
        said = second.text()
        assert code == 2, said[-3000:]
        assert f"another edgerun serve (pid {first.proc.pid})" in said, said[-3000:]
        assert str(tmp_path / "state" / "outbox.db") in said and "Traceback" not in said
        assert first.proc.poll() is None, "the first daemon did not outlive the second's try"
    finally:
        assert first.stop() == 0, first.text()[-3000:]
    # the first's stop gave the outbox back: a daemon starts on it again
    again = Serve(tmp_path, cfg)
    try:
        wait(again.ready, 120, "a daemon after the first stopped", again)
    finally:
        assert again.stop() == 0
    assert os.path.exists(tmp_path / "state" / "outbox.db")
