"""`edgerun coordinator` started with its clock at 2100 (a corrupt RTC, a bad time server at
boot) under libfaketime: the first retention pass judged the fleet's whole history by that
clock and deleted it (every acked result "older than 90 days", every health and event). The
monotonic guard of retention's clock holds only jumps made while running. Now no age is judged
by a clock outside 2025..2100: nothing is deleted by age, and a line says why."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.daemon_toml import coordinator_toml
from support.under_test import child_env

from runtime.coordinator.retention import age_clock_plausible
from runtime.coordinator.store import Inbound, Store
from runtime.wire import clock

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SHIM = Path(__file__).parents[1] / "support" / "faketime_shim"


@pytest.mark.parametrize("t, plausible", [
    (1_796_600_000.0, True),  # December 2026
    (clock.FLOOR_T, True), (clock.CEILING_T, True),
    (clock.FLOOR_T - 1, False), (0.0, False),  # 1970
    (clock.CEILING_T + 1, False), (4_115_491_200.0, False),  # June 2100
])
def test_ages_are_judged_only_by_a_plausible_clock(t, plausible):
    assert age_clock_plausible(t) is plausible


def _rows(path: Path) -> tuple[int, int, int]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return tuple(db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]  # type: ignore
                     for t in ("results", "health", "events"))


@pytest.mark.timeout(120)
@pytest.mark.skipif(not LIBFAKETIME.exists(),
                    reason=f"libfaketime is not installed ({LIBFAKETIME}: Debian's faketime)")
def test_a_coordinator_started_in_2100_deletes_nothing_by_age(tmp_path, broker):
    store = tmp_path / "coord.db"
    s = Store(store)
    now = time.time()
    s.ingest([Inbound("dev1", "result", {"v": 1, "stream": "s1", "boot": "b1", "floor": 1,
                                         "results": [{"seq": q, "t": now, "label": "ok"}
                                                     for q in range(1, 301)]})]
             + [Inbound("dev1", "health", {"v": 1, "t": now - 60 * i, "boot": "b1"})
                for i in range(20)]
             + [Inbound("dev1", "event", {"v": 1, "t": now - i, "type": "note", "n": i})
                for i in range(10)])
    s.close()
    before = _rows(store)
    assert before == (300, 20, 10)
    cfg = tmp_path / "coord.toml"
    cfg.write_text(coordinator_toml(broker.coordinator("t"), fleet="t", store=store,
                                    http_port=0, retention_interval_s=1,
                                    retention_wake_s=0.1))
    fake = tmp_path / "faketime"
    fake.write_text("@2100-06-01 00:00:00\n")
    log = tmp_path / "coord.log"
    with log.open("w") as out:
        p = subprocess.Popen(
            [sys.executable, "-m", "runtime.cli", "coordinator", "--config", str(cfg)],
            stdout=out, stderr=subprocess.STDOUT, env=child_env(
                SHIM, LD_PRELOAD=str(LIBFAKETIME), FAKETIME_TIMESTAMP_FILE=str(fake),
                FAKETIME_CACHE_DURATION="1", FAKETIME_DONT_FAKE_MONOTONIC="1"))
    try:
        deadline = time.monotonic() + 60
        # a retention pass has judged the clock (either way), then three more (one a second)
        while not any(w in log.read_text() for w in ("not deleted by age", "deleted")):
            assert p.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        time.sleep(3)
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0, log.read_text()[-3000:]
    finally:
        if p.poll() is None:
            p.kill()
    text = log.read_text()
    assert _rows(store) == before, text[-3000:]
    assert "after 2100" in text and "not deleted by age" in text, text[-3000:]


def test_results_received_while_the_clock_read_1970_are_not_deleted_by_age(tmp_path,
                                                                          monkeypatch):
    """A coordinator whose clock read 1970 stamped what it stored `received` 1970; once its
    clock was right (the next start), the first retention pass deleted them all as 56 years
    old (the real process did: 200 results, tests cannot run it cheaply twice under
    libfaketime). Rows received at an implausible time are no age's to judge: they stay
    until the size cap takes them; rows received 100 days ago still go."""
    import types

    from runtime.coordinator import ingest

    store = Store(tmp_path / "coord.db")

    def batch(stream: str, received: float) -> None:
        monkeypatch.setattr(ingest, "time", types.SimpleNamespace(time=lambda: received))
        store.ingest([Inbound("dev1", "result", {
            "v": 1, "stream": stream, "boot": "b1", "floor": 1,
            "results": [{"seq": q, "t": time.time(), "label": "ok"} for q in range(1, 51)]})])
        monkeypatch.undo()

    now = time.time()
    batch("in1970", 120.0)
    batch("in2100", clock.CEILING_T + 86400)
    batch("old", now - 100 * 86400)
    batch("new", now - 60)
    done = store.prune_results(90 * 86400, now=now)
    assert done["results_by_age"] == 50
    left = {s for s, _ in store.result_seqs("dev1")}
    assert left == {"in1970", "in2100", "new"}
    store.close()


@pytest.mark.parametrize("now, t, sync, admitted", [
    (1_796_600_000.0, 1_796_600_100.0, True, True),  # 100 s ahead: within future_skew_s
    (1_796_600_000.0, 1_796_601_000.0, True, False),  # 1000 s ahead of a right clock
    (1_796_600_000.0, 1_796_601_000.0, False, True),  # unsynced: a claim, placed later
    (120.0, 1_796_600_000.0, True, True),  # our clock reads 1970: it cannot say "ahead"
    (120.0, clock.CEILING_T + 1, True, False),  # but past 2100 is refused still
    (120.0, clock.CEILING_T + 1, False, False),
])
def test_a_coordinator_clock_at_1970_judges_no_stamp_ahead(now, t, sync, admitted):
    """A coordinator whose clock read 1970 quarantined every synced device's state, health
    and event as 'stamped 56 years ahead of the coordinator's clock' (the real process
    under libfaketime did): births lost, the fleet view empty, health history gone, and the
    blame on the devices. Its own clock is the one it cannot believe: only stamps past 2100
    are refused then."""
    import collections

    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.admission import Admission
    from runtime.coordinator.commander import Refused
    from runtime.wire import payloads

    a = Admission(CoordinatorConfig(fleet="f"), collections.Counter())
    body = payloads.encode("health", {"v": 1, "t": t, "boot": "b1",
                                      "clk": {"sync": sync, "kb": "k", "bt": 5.0}})
    try:
        a.admit("edgerun/v1/f/dev1/health", body, now)
    except Refused as e:
        assert not admitted, e
    else:
        assert admitted
