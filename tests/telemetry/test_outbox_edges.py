"""The outbox at its edges (runtime/telemetry/outbox.py): a result exactly at the schema's
bounds, health waiting exactly spill_after_s, and a corrupt database whose result log still
holds results the database held too."""

from __future__ import annotations

import errno
import json
import logging
import sqlite3

import pytest

from runtime.config.telemetry import OutboxConfig
from runtime.telemetry import resultlog
from runtime.telemetry.outbox import SHORT_MAX, Outbox
from runtime.wire.payloads import T_MAX


@pytest.mark.parametrize("t", [0, T_MAX])
def test_a_result_exactly_at_the_schema_s_bounds_is_stored_as_it_is(tmp_path, caplog, t):
    """t = 0 and t = T_MAX, a label of exactly 256 characters: the coordinator admits them,
    so nothing is changed and no error is logged."""
    box = Outbox(OutboxConfig(path=str(tmp_path / "o.db")))
    r = {"t": t, "label": "l" * SHORT_MAX, "score": 0.5}
    with caplog.at_level(logging.ERROR, logger="edgerun.outbox"):
        box.append(r)
    (sent,) = box.pending(0, 10)
    got = json.loads(sent.json)
    assert (got["t"], got["label"]) == (r["t"], r["label"]) and type(got["t"]) is type(t)
    assert not caplog.records, [x.getMessage() for x in caplog.records]
    box.close()


@pytest.mark.parametrize(("waited_s", "on_disk"), [(59.9, 0), (60.0, 2)])
def test_health_unsent_for_spill_after_s_goes_to_the_database(tmp_path, waited_s, on_disk):
    """Health waits in memory; the oldest unsent for exactly spill_after_s (60 s) takes the
    waiting ones into the database with the next."""
    now = [0.0]
    path = tmp_path / "o.db"
    box = Outbox(OutboxConfig(path=str(path)), clock=lambda: now[0])
    box.put("health", {"n": 1})
    now[0] = waited_s
    box.put("health", {"n": 2})
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT COUNT(*) FROM other").fetchone()[0] == on_disk
    finally:
        db.close()
    assert [json.loads(b)["n"] for _, _, b in box.others(10)] == [1, 2]
    box.close()


def test_a_corrupt_database_takes_back_the_results_its_log_still_held(tmp_path, monkeypatch):
    """A disk that refused to start the log again after each spill (the log then keeps the
    results the database took too), then a bad sector in the database: the log's results
    are all that is left of them, and every one is sent again (the coordinator stores each
    once), even those at or below the database's last seq."""
    from test_outbox_open import _corrupt_a_results_page

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    path = tmp_path / "outbox.db"
    box = Outbox(OutboxConfig(path=str(path), spill_bytes=4096))
    with monkeypatch.context() as m:
        m.setattr(resultlog, "write_atomic", full)  # the log's restart: a new file, refused
        box.append_many([{"blob": "x" * 100} for _ in range(200)])  # spilled, log kept
    assert [q for q, _ in resultlog.read(path.with_name("outbox.db.log")).results] == list(
        range(1, 201))
    assert box.append_many([{"i": i} for i in range(5)]) == [201, 202, 203, 204, 205]
    box.close()
    _corrupt_a_results_page(path)
    box = Outbox(OutboxConfig(path=str(path)))
    assert box.take_startup_event()["stream"] == "kept"
    assert [p.seq for p in box.pending(0, 500)] == list(range(1, 206))
    box.close()


def test_a_database_cut_to_zero_bytes_beside_its_wal_is_said_not_silently_emptied(tmp_path):
    """A power cut can leave the database at 0 bytes while its WAL (the writes since the last
    checkpoint) survives. SQLite does not read that WAL: a zero-page database's WAL is stale
    to it and is deleted. So the outbox must treat it as an emptied one (moved aside, the
    WAL with it, `outbox_corrupt`), as it does a 0-byte database alone."""
    import shutil

    live, cut = tmp_path / "live", tmp_path / "cut"
    live.mkdir()
    cut.mkdir()
    box = Outbox(OutboxConfig(path=str(live / "o.db"), spill_after_s=0))
    box.append_many([{"i": i} for i in range(5)])  # in the database's WAL, not checkpointed
    for name in ("o.db", "o.db-wal", "o.db.log", "o.db.keep.json"):  # kill -9's files
        if (live / name).exists():
            shutil.copy(live / name, cut / name)
    box.close()
    (cut / "o.db").write_bytes(b"")  # the power cut
    assert (cut / "o.db-wal").stat().st_size > 0
    box = Outbox(OutboxConfig(path=str(cut / "o.db")))
    try:
        event = box.take_startup_event()
        assert event is not None and event["type"] == "outbox_corrupt", event
        assert (tmp_path / "cut" / (event["path"].rsplit("/", 1)[1] + "-wal")).exists()
    finally:
        box.close()
