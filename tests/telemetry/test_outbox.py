"""The durable outbox: seq, retention, eviction, crash safety."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.daemon_harness import result_seqs

from runtime.config.telemetry import OutboxConfig
from runtime.telemetry.outbox import Outbox


def _box(tmp_path, **kw) -> Outbox:
    return Outbox(OutboxConfig(path=str(tmp_path / "o.db"), **kw))


def test_seq_is_monotonic_and_survives_reopen(tmp_path):
    box = _box(tmp_path)
    assert box.append_many([{"a": 1}, {"a": 2}]) == [1, 2]
    stream, boot = box.stream, box.boot
    assert box.ack(2) == 2  # everything acked: the table is empty
    box.close()
    box = _box(tmp_path)
    assert box.append({"a": 3}) == 3  # not reused after a restart with an empty table
    assert box.stream == stream and box.boot != boot
    assert box.floor() == 3 and box.last_seq() == 3


def test_pending_carries_seq_and_ack_drops_prefix(tmp_path):
    box = _box(tmp_path)
    box.append_many([{"i": i} for i in range(5)])
    pend = box.pending(0, 3)
    assert [p.seq for p in pend] == [1, 2, 3]
    assert pend[0].json == f'{{"seq":1,"i":0,"boot":"{box.boot}"}}'  # the producing boot
    assert box.ack(2) == 2
    assert box.floor() == 3
    assert [p.seq for p in box.pending(0, 10)] == [3, 4, 5]
    assert box.stats()["results_held"] == 3


def test_eviction_past_byte_cap_is_counted_and_reported(tmp_path):
    events = []
    box = Outbox(OutboxConfig(path=str(tmp_path / "o.db"), max_bytes=65536), events.append)
    big = "x" * 1000
    for _ in range(100):
        box.append({"blob": big})
    stats = box.stats()
    assert stats["bytes"] <= 65536
    assert stats["evicted_total"] > 0 and events
    assert events[0]["type"] == "outbox_evicting"
    assert box.floor() == stats["oldest_seq"] > 1  # the floor tells the coordinator to skip
    assert box.last_seq() == 100
    box.close()
    assert _box(tmp_path).evicted_total == stats["evicted_total"]  # persistent counter


def test_health_keeps_only_latest_n(tmp_path):
    box = _box(tmp_path, health_keep=3)
    for i in range(10):
        box.put("health", {"i": i})
    box.put("event", {"type": "x"})
    rows = box.others(100)
    assert [r[1] for r in rows] == ["health"] * 3 + ["event"]
    assert '"i":9' in rows[2][2]
    box.remove([rows[0][0]])
    assert len(box.others(100)) == 3


def test_command_ids_are_remembered_until_expiry(tmp_path):
    box = _box(tmp_path)
    assert box.remember_command("abc", time.time() + 60)
    assert not box.remember_command("abc", time.time() + 60)
    box.close()
    box = _box(tmp_path)
    assert not box.remember_command("abc", time.time() + 60)  # replay across a restart
    assert box.remember_command("old", time.time() - 1)
    assert box.remember_command("new", time.time() + 1)  # purges expired ids
    assert box.remember_command("old", time.time() + 1)


def test_corrupt_file_is_moved_aside_not_fatal(tmp_path):
    path = tmp_path / "o.db"
    path.write_bytes(b"this is not sqlite" * 100)
    box = Outbox(OutboxConfig(path=str(path)))
    assert box.append({"a": 1}) == 1
    event = box.take_startup_event()
    assert event and event["type"] == "outbox_corrupt"
    assert any(p.name.startswith("o.db.corrupt-") for p in tmp_path.iterdir())


def test_replay_record_and_evicted_total_survive_a_corrupt_outbox(tmp_path):
    """Finding 15: a corrupt outbox moved aside must not reset replay protection or the
    eviction counter."""
    path = tmp_path / "o.db"
    box = Outbox(OutboxConfig(path=str(path), max_bytes=65536))
    for _ in range(100):
        box.append({"pad": "x" * 1000})
    evicted = box.evicted_total
    assert evicted > 0
    assert box.remember_command("captured-cmd-1", time.time() + 3600)
    box.close()
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    path.write_bytes(b"this is not sqlite" * 100)
    box = Outbox(OutboxConfig(path=str(path), max_bytes=65536))
    assert box.take_startup_event()["type"] == "outbox_corrupt"
    assert not box.remember_command("captured-cmd-1", time.time() + 3600)  # still a replay
    assert box.evicted_total == evicted and box.stats()["evicted_total"] == evicted
    assert box.commands_not_before == 0.0  # nothing was lost: no horizon
    box.close()


def test_lost_replay_record_refuses_commands_issued_before(tmp_path):
    path = tmp_path / "o.db"
    box = Outbox(OutboxConfig(path=str(path)))
    box.remember_command("captured-cmd-1", time.time() + 3600)
    box.close()
    Path(str(path) + ".keep.json").write_text("{not json")
    t0 = time.time()
    box = Outbox(OutboxConfig(path=str(path)))
    assert box.take_startup_event()["type"] == "replay_record_lost"
    assert box.commands_not_before >= t0  # the captured command was issued before: refused
    box.close()
    assert Outbox(OutboxConfig(path=str(path))).commands_not_before == box.commands_not_before


_WRITER = """
import sys, time
sys.path.insert(0, {root!r})
from runtime.config.telemetry import OutboxConfig
from runtime.telemetry.outbox import Outbox
box = Outbox(OutboxConfig(path={path!r}, fsync={fsync!r}))
while True:
    seqs = box.append_many([{{"t": time.time(), "pad": "y" * 200}}] * 3)
    print(seqs[-1], flush=True)
"""


@pytest.mark.parametrize("fsync", ["normal", "full"])
def test_kill_9_at_any_point_loses_no_appended_message(tmp_path, fsync):
    path = str(tmp_path / "o.db")
    root = str(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    confirmed = 0
    for round_ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER.format(root=root, path=path,
                                                                      fsync=fsync)],
                                stdout=subprocess.PIPE, text=True)
        lines = []
        deadline = time.monotonic() + 0.3 + round_ * 0.07
        while time.monotonic() < deadline:
            lines.append(proc.stdout.readline())
        os.kill(proc.pid, signal.SIGKILL)
        rest = proc.stdout.read()
        proc.wait()
        printed = [int(x) for x in [*lines, *rest.splitlines()] if x.strip()]
        confirmed = max([confirmed, *printed])
        db = sqlite3.connect(path)
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        db.close()
        seqs = result_seqs(Path(path))  # the database's and the result log's
        assert seqs == list(range(1, len(seqs) + 1)), "a gap or a duplicate after kill -9"
        assert len(seqs) >= confirmed, "an append that returned was lost"
        assert len(seqs) % 3 == 0, "a transaction was half applied"


def test_text_no_coordinator_admits_is_made_valid_before_it_is_stored(tmp_path):
    """A lone surrogate in a result (a frame named after a file whose name was not UTF-8,
    a label or source name from anywhere) was stored as a `\\udcff` escape: the coordinator
    refused every retry of it (not valid Unicode text), so the stream's floor never moved
    and everything after it waited behind it. The outbox stores valid text, whatever a
    producer hands it; ordinary text, escapes and all, is stored as it was."""
    from runtime.wire import safejson

    box = _box(tmp_path)
    box.append_many([{"ref": "bad\udcff.png", "label": "ok"}, {"ref": "caf\u00e9 \\ud800"}])
    box.put("event", {"type": "bad_frame", "ref": "x\ud800y", "n": ["\udfff"]})
    bodies = [p.json for p in box.pending(0, 10)] + [body for _, _, body in box.others(10)]
    docs = [safejson.loads(b) for b in bodies]  # raised JsonRejected: lone surrogate
    assert docs[0]["ref"] == "bad\\udcff.png" and docs[0]["label"] == "ok"
    assert docs[1]["ref"] == "caf\u00e9 \\ud800"  # a backslash in the text stays a backslash
    assert docs[2]["ref"] == "x\\ud800y" and docs[2]["n"] == ["\\udfff"]


def test_a_non_finite_number_is_stored_as_null_not_a_dead_writer(tmp_path, caplog):
    """json.dumps(allow_nan=False) raised on a NaN in health (the box's energy after its
    meter went away) and the daemon died writing it. The message is stored with null there,
    and the log names the field: it is still a bug to write NaN."""
    import json
    import logging

    ob = Outbox(OutboxConfig(path=str(tmp_path / "o.db")))
    with caplog.at_level(logging.ERROR, logger="edgerun.outbox"):
        ob.put("health", {"t": 1.0, "box_energy": {"box_mj": float("nan"),
                                                  "stages_mj": [1.0, float("inf")]}})
        seq = ob.append({"t": 2.0, "score": float("-inf"), "label": "ok"})
    (_, kind, body), = ob.others(10)
    assert kind == "health"
    assert json.loads(body)["box_energy"] == {"box_mj": None, "stages_mj": [1.0, None]}
    (stored,) = ob.pending(seq - 1, 10)
    assert json.loads(stored.json)["score"] is None
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "/box_energy/box_mj" in text and "/box_energy/stages_mj/1" in text
    ob.close()


def test_listeners_hear_every_change_after_it_is_visible(tmp_path):
    """The publisher's connection sleeps until told (runtime/wire/mqtt.py): every append and
    put calls the listeners, after `changes` moved and the rows can be read."""
    box = _box(tmp_path)
    seen: list[tuple[int, int]] = []
    box.listen(lambda: seen.append((box.changes, len(box.pending(0, 100)))))
    box.append({"label": "ok"})
    box.append_many([{"label": "a"}, {"label": "b"}])
    box.put("health", {"t": 1.0})
    assert [n for n, _ in seen] == [1, 2, 3]
    assert [rows for _, rows in seen] == [1, 3, 3]
    box.close()


def test_a_result_the_coordinator_would_refuse_is_made_deliverable(tmp_path, caplog):
    """The coordinator acks a stream only up to its first missing seq, and quarantines a whole
    results message whose item fails the schema: one such result, re-sent for ever, wedged
    the stream (seen: a clock stepped to 1970 stamped a frame t = -7.9e-05; the coordinator
    refused `results/0/t: -7.8819e-05 is less than the minimum of 0`, and the backlog grew
    for as long as the daemon ran). So results are brought into the schema when appended: a
    time out of [0, T_MAX] clamped (the clock was wrong anyway; its `clk` stamp places it),
    a name longer than the schema's 256 characters (a custom model's label) cut, each said."""
    import json
    import logging

    from runtime.wire import payloads

    box = _box(tmp_path)
    long = "a label from a labels file with one very long line " * 8
    items = [{"t": -7.8819e-05, "label": "ok", "score": 0.9},
             {"t": 2e10, "label": "ok", "score": 0.9},
             {"t": 1796630967.0, "label": long, "model": "m" * 300, "variant": "v" * 300,
              "score": 0.5},
             {"t": 1796630967.5, "label": "ok", "score": 0.9}]
    with caplog.at_level(logging.ERROR, logger="edgerun.outbox"):
        seqs = box.append_many(items)
    sent = [json.loads(p.json) for p in box.pending(0, 10)]
    for one in sent:  # each as the coordinator admits it (the publisher batches them)
        payloads.check("result", {"v": 1, "stream": box.stream, "boot": box.boot,
                                  "floor": seqs[0], "results": [one]})
    assert [r["t"] for r in sent] == [0.0, payloads.T_MAX, 1796630967.0, 1796630967.5]
    assert sent[2]["label"] == long[:256] and len(sent[2]["model"]) == 256
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "/t '-7.8819e-05'; sent as /t '0.0'" in said[0], said  # once a minute
    box.close()
