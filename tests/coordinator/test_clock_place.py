"""Placing what a device made before its clock was synced (runtime/coordinator/clock_place.py),
on both store backends: results stored with their claim are rewritten once a synced message
of the same kernel boot arrives; later messages are placed on arrival; old devices' payloads
without a stamp are stored as they are; the pool's byte count stays exact."""

from __future__ import annotations

from dataclasses import replace

import pytest

from runtime.coordinator.clock_place import CHUNK, MAX_BOOTS, RELOAD_S, Placer
from runtime.coordinator.quotas import EVENT_BYTES_SQL, HEALTH_BYTES_SQL, RESULT_BYTES_SQL
from runtime.coordinator.store import Inbound, Store

REAL = 1_790_000_000.0  # the real time when the device's boottime read 100 s
BEHIND = 7 * 86400.0  # the device's unsynced clock, a week behind
KB, KB2 = "kernel-boot-1", "kernel-boot-2"


def _clk(sync: bool, bt: float, kb: str = KB) -> dict:
    return {"sync": sync, "kb": kb, "bt": bt}


def _results(seqs: range, synced: bool = False, kb: str = KB, boot: str = "p1",
             stream: str = "s1") -> Inbound:
    """Results made at boottime 100 + seq; an unsynced clock claims a week earlier."""
    skew = 0.0 if synced else BEHIND
    return Inbound("d1", "result", {"v": 1, "stream": stream, "boot": boot, "floor": 1,
                                    "results": [{"seq": q, "t": REAL + q - skew, "label": "ok",
                                                 "clk": _clk(synced, 100.0 + q, kb)}
                                                for q in seqs]})


def _health(t: float, clk: dict | None) -> Inbound:
    msg = {"v": 1, "t": t, "boot": "p1"}
    if clk is not None:
        msg["clk"] = clk
    return Inbound("d1", "health", msg)


def _ingest(store: Store, placer: Placer, batch: list[Inbound]) -> None:
    placer.before_store(batch)
    store.ingest(batch)
    placer.settle()


def _pool_exact(store: Store) -> None:
    """The fair shares' byte counts still match the rows after bodies were rewritten."""
    for pool, sql in (("results", RESULT_BYTES_SQL), ("health", HEALTH_BYTES_SQL),
                      ("events", EVENT_BYTES_SQL)):
        (want,), = store.read(f"SELECT COALESCE(SUM({sql}), 0) FROM {pool} "
                              "WHERE device = 'd1'")
        got = store.read("SELECT bytes FROM pool_usage WHERE device = 'd1' AND pool = ?",
                         (pool,))
        assert int(got[0][0] if got else 0) == int(want), pool


def test_results_placed_when_the_sync_arrives_later(store_url):
    store = Store(store_url)
    try:
        placer = Placer(store)
        unsynced_health = _health(REAL + 5 - BEHIND, _clk(False, 105.0))
        unsynced_health.msg["temp_c"] = 41.5  # a timeline number (health_points)
        # unsynced: stored as claimed
        _ingest(store, placer, [_results(range(1, 6)), unsynced_health])
        rows = {r["seq"]: r for r in store.results("d1")}
        assert rows[3]["t"] == REAL + 3 - BEHIND and "claimed" not in rows[3]["clk"]
        assert sorted(store.read("SELECT device, boot, kb FROM clock_pending")) == [
            ("d1", "*" + KB, KB), ("d1", "p1", KB)]
        # the clock syncs: a health stamped synced at boottime 110 gives the offset
        _ingest(store, placer, [_health(REAL + 10, _clk(True, 110.0))])
        rows = {r["seq"]: r for r in store.results("d1")}
        for q in range(1, 6):
            assert rows[q]["t"] == pytest.approx(REAL + q, abs=1e-3)
            assert rows[q]["clk"]["claimed"] == REAL + q - BEHIND  # the claim kept beside it
        ts = sorted(t for (t,) in store.read("SELECT t FROM results WHERE device = 'd1'"))
        assert ts == pytest.approx([REAL + q for q in range(1, 6)], abs=1e-3)  # rows too
        assert store.read("SELECT device FROM clock_pending") == []
        assert placer.settled_total == 6  # five results and the health
        (h,) = [r for r in store.health_history("d1", REAL, REAL + 6, 10)]
        assert h["t"] == pytest.approx(REAL + 5, abs=1e-3)  # where `edgerun report` reads
        assert store.read("SELECT t, temp_c FROM health_points WHERE device = 'd1' AND "
                          "temp_c IS NOT NULL") == [(pytest.approx(REAL + 5, abs=1e-3), 41.5)]
        _pool_exact(store)
        # after the sync: an unsynced event and results of the same boot placed on arrival
        late = Inbound("d1", "event", {"v": 1, "t": REAL + 50 - BEHIND, "type": "x",
                                       "clk": _clk(False, 150.0)})
        _ingest(store, placer, [_results(range(6, 8)), late])
        rows = {r["seq"]: r for r in store.results("d1")}
        assert rows[7]["t"] == pytest.approx(REAL + 7, abs=1e-3)
        (ev,) = store.events("d1")
        assert ev["t"] == pytest.approx(REAL + 50, abs=1e-3)
        assert ev["clk"]["claimed"] == REAL + 50 - BEHIND
        _pool_exact(store)
    finally:
        store.close()


def test_offsets_and_pending_survive_a_restart_and_boots_are_kept_apart(store_url):
    store = Store(store_url)
    try:
        _ingest(store, Placer(store), [_results(range(1, 3)),
                                       _results(range(1, 3), kb=KB2, boot="p2", stream="s2")])
        placer = Placer(store)  # a restarted coordinator
        _ingest(store, placer, [_health(REAL + 10, _clk(True, 110.0))])  # KB's offset only
        rows = {(r["stream"], r["seq"]): r for r in store.results("d1")}
        assert rows["s1", 2]["t"] == pytest.approx(REAL + 2, abs=1e-3)
        assert rows["s2", 2]["t"] == REAL + 2 - BEHIND  # another kernel boot: not placed
        assert store.read("SELECT boot FROM clock_pending") == [("p2",)]
        assert set(Placer(store).offsets) == {("d1", KB)}
    finally:
        store.close()


def test_old_payloads_and_synced_ones_are_stored_as_they_are(store_url):
    store = Store(store_url)
    try:
        placer = Placer(store)
        old = Inbound("d1", "result", {"v": 1, "stream": "s1", "boot": "p1", "floor": 1,
                                       "results": [{"seq": 1, "t": REAL, "label": "ok"}]})
        _ingest(store, placer, [old, _results(range(2, 4), synced=True),
                                _health(REAL, None)])
        rows = {r["seq"]: r for r in store.results("d1")}
        assert rows[1]["t"] == REAL and "clk" not in rows[1]
        assert rows[3]["t"] == REAL + 3 and "claimed" not in rows[3]["clk"]
        assert store.read("SELECT device FROM clock_pending") == []
    finally:
        store.close()


def test_a_sync_in_the_same_batch_places_what_came_before_it(store_url):
    store = Store(store_url)
    try:
        placer = Placer(store)
        _ingest(store, placer, [_results(range(1, 4)), _results(range(4, 6), synced=True)])
        rows = {r["seq"]: r for r in store.results("d1")}
        assert [round(rows[q]["t"], 3) for q in range(1, 6)] == [REAL + q for q in range(1, 6)]
        assert store.read("SELECT device FROM clock_pending") == []
    finally:
        store.close()


def test_synced_traffic_writes_an_offset_once_not_every_batch(store_url):
    """A synced device's every batch gives its offset again; it is written when new or moved
    past MOVED_S (a step), not once a batch: one more write a batch would cost every device."""
    store = Store(store_url)
    try:
        placer = Placer(store)
        writes = []
        tx = store.transaction

        def counting():
            writes.append(1)
            return tx()

        store.transaction = counting  # type: ignore[method-assign]
        for k in range(5):
            _ingest(store, placer, [_results(range(1 + 2 * k, 3 + 2 * k), synced=True)])
        assert len(writes) == 1  # the first batch's offset
        skewed = _results(range(20, 21), synced=True)
        skewed.msg["results"][0]["t"] += 2.0  # the clock stepped 2 s
        _ingest(store, placer, [skewed])
        assert len(writes) == 2
        (off,), = store.read("SELECT off FROM clock_offsets")
        assert off == pytest.approx(REAL - 100.0 + 2.0)
    finally:
        store.close()


def test_a_device_inventing_boot_ids_keeps_at_most_max_boots_and_costs_no_other(store_url):
    """A new `kb` or `boot` per message was a clock_offsets or clock_pending row (and an
    entry in memory) each, uncounted; past MAX_BOOTS per device they are counted and not
    kept, and another device's offsets and placing go on."""
    store = Store(store_url)
    try:
        placer = Placer(store)
        n = MAX_BOOTS + 40
        batch = [_results(range(1, 2), synced=True, kb=f"kb{i}", boot=f"p{i}") for i in
                 range(n)] + [_results(range(2, 3), kb=f"x{i}", boot=f"q{i}") for i in range(n)]
        _ingest(store, placer, batch)
        (offs,), = store.read("SELECT COUNT(*) FROM clock_offsets WHERE device = 'd1'")
        (pend,), = store.read("SELECT COUNT(*) FROM clock_pending WHERE device = 'd1'")
        assert offs == MAX_BOOTS and pend == MAX_BOOTS
        assert len(placer.offsets) == MAX_BOOTS and len(placer.waiting) == MAX_BOOTS
        assert placer.refused_total == 80
        other = replace(_results(range(5, 6), synced=True), device="d2")
        late = replace(_results(range(6, 7)), device="d2")
        _ingest(store, placer, [other, late])
        assert ("d2", KB) in placer.offsets
        (t,), = store.read("SELECT t FROM results WHERE device = 'd2' AND seq = 6")
        assert t == pytest.approx(REAL + 6)  # placed: d1's flood cost d2 nothing
    finally:
        store.close()


def test_clock_rows_are_pruned_with_the_data_they_place(store_url):
    store = Store(store_url)
    try:
        now = [REAL]
        placer = Placer(store, keep_s=86400.0, wall=lambda: now[0])
        _ingest(store, placer, [_results(range(1, 3), synced=True),
                                _results(range(3, 4), kb=KB2, boot="p2")])
        assert store.read("SELECT COUNT(*) FROM clock_offsets") == [(1,)]
        assert store.read("SELECT COUNT(*) FROM clock_pending") == [(1,)]
        now[0] = REAL + 2 * 86400.0
        placer.prune(now[0])
        assert store.read("SELECT COUNT(*) FROM clock_offsets") == [(0,)]
        assert store.read("SELECT COUNT(*) FROM clock_pending") == [(0,)]
        assert not placer.offsets and not placer.waiting
    finally:
        store.close()


def test_settling_reads_a_budget_of_rows_a_call_and_the_rest_later(store_url):
    """Ingest waits for settle(): a boot with 3 chunks of results is placed over several
    calls of at most `budget` rows read each, not in one."""
    store = Store(store_url)
    try:
        placer = Placer(store)
        for k in range(3):
            _ingest(store, placer, [_results(range(1 + k * CHUNK, 1 + (k + 1) * CHUNK))])
        placer.before_store([b := _results(range(2000, 2001), synced=True)])
        store.ingest([b])
        calls = []
        while placer.waiting and len(calls) < 10:
            before = placer.read_total
            calls.append(placer.settle(budget=CHUNK))
            assert placer.read_total - before <= CHUNK + 1
        assert calls[0] <= CHUNK and sum(calls) == 3 * CHUNK and len(calls) >= 3
        (n,), = store.read("SELECT COUNT(*) FROM results WHERE body LIKE '%claimed%'")
        assert n == 3 * CHUNK
        _pool_exact(store)
    finally:
        store.close()


def test_settling_health_reads_the_claimed_range_not_the_device_history(store_url):
    """Unplaced health of a boot is found by the (device, t) index over its claimed times:
    a device's thousands of synced health rows (and another device's) are not read."""
    store = Store(store_url)
    try:
        placer = Placer(store)
        synced = [_health(REAL + i, _clk(True, 100.0 + i)) for i in range(1500)]
        other = [replace(_health(REAL - BEHIND + i, None), device="d2") for i in range(1500)]
        store.ingest(synced + other)
        early = [_health(REAL - BEHIND - 50 + i, _clk(False, 50.0 + i, KB2)) for i in range(3)]
        _ingest(store, placer, early)
        before = placer.read_total
        _ingest(store, placer, [_health(REAL + 2000, _clk(True, 2100.0, KB2))])
        assert store.read("SELECT COUNT(*) FROM health WHERE device = 'd1' AND body LIKE "
                          "'%claimed%'") == [(3,)]
        assert placer.read_total - before < 50  # not the 1500 + 1500 rows
    finally:
        store.close()


def test_another_coordinator_sharing_the_store_goes_on_within_reload_s(store_url):
    store = Store(store_url)
    try:
        mono = [0.0]
        a = Placer(store, mono=lambda: mono[0])
        b = Placer(store, mono=lambda: mono[0])
        _ingest(store, a, [_results(range(1, 3), synced=True)])
        assert ("d1", KB) not in b.offsets
        mono[0] += RELOAD_S
        b.settle()
        assert ("d1", KB) in b.offsets
        _ingest(store, b, [_results(range(3, 4))])  # placed on arrival by b
        (t,), = store.read("SELECT t FROM results WHERE seq = 3")
        assert t == pytest.approx(REAL + 3)
    finally:
        store.close()


def test_a_pending_table_of_an_older_version_gets_its_columns(store_url):
    store = Store(store_url)
    try:
        with store.transaction() as db:
            db.execute("CREATE TABLE clock_pending (device TEXT NOT NULL, boot TEXT NOT NULL, "
                       "kb TEXT NOT NULL, PRIMARY KEY (device, boot))")
        _ingest(store, Placer(store), [_results(range(1, 3))])
        placer = Placer(store)
        _ingest(store, placer, [_results(range(3, 4), synced=True)])
        (t,), = store.read("SELECT t FROM results WHERE seq = 1")
        assert t == pytest.approx(REAL + 1)
    finally:
        store.close()


@pytest.mark.parametrize("t, refused", [(REAL + 86400.0, False), (4.2e9, True), (9e9, True)])
def test_unsynced_times_past_2100_are_refused_at_admission(coord, t, refused):
    """`sync: false` let health skip future_skew_s up to the schema's 2286, stored for good
    (never old enough to prune); a claim past 2100 (clock.CEILING_T) is refused."""
    from runtime.coordinator.commander import Refused
    from runtime.wire import payloads

    c, _ = coord
    raw = payloads.encode("health", {"v": 1, "t": t, "boot": "p1",
                                     "clk": _clk(False, 5.0)})
    topic = payloads.topic("f", "d1", "health")
    if refused:
        with pytest.raises(Refused, match="past 2100"):
            c.admission.admit(topic, raw, REAL)
    else:
        assert c.admission.admit(topic, raw, REAL)[1] == "health"


def test_health_and_events_claimed_at_1970_wait_for_their_placing_not_the_prune(store_url):
    """A device booting at 1970 (no RTC, no network time yet) stamps its health and events
    with its claim, to be placed once its boot syncs. The hourly prune judged them by that
    claim: 56 years old, deleted at once, so by the time the clock synced there was
    nothing left to place (the device's health history and its events, critical ones
    included, gone within the hour they arrived). Now a claim before 2025 is not an age
    while its device's boot waits to be placed; the placed rows are then judged by their
    placed time, and a claim no boot can ever place (an old payload without `clk`, or a
    pending boot forgotten after the retention) goes at the next prune."""
    store = Store(store_url)
    try:
        placer = Placer(store)
        at_1970 = [_health(130.0, _clk(False, 130.0)),
                   Inbound("d1", "event", {"v": 1, "t": 140.0, "type": "thermal_trip",
                                           "clk": _clk(False, 140.0)})]
        at_1970[0].msg["temp_c"] = 41.5  # a timeline number (health_points)
        old_device = Inbound("d2", "health", {"v": 1, "t": 150.0, "boot": "p9"})  # no clk
        _ingest(store, placer, [*at_1970, old_device])
        store.prune(keep_health_s=7 * 86400.0, keep_events_s=30 * 86400.0, now=REAL)
        assert store.read("SELECT device, t FROM health ORDER BY device") == [("d1", 130.0)]
        assert store.read("SELECT device, t FROM events") == [("d1", 140.0)]
        # the clock syncs: what it made at 1970 lands where it belongs
        _ingest(store, placer, [_health(REAL + 200, _clk(True, 200.0))])
        placed = sorted(t for (t,) in store.read("SELECT t FROM health WHERE device = 'd1'"))
        assert placed == pytest.approx([REAL + 130, REAL + 200], abs=1e-3)
        (ev,) = store.events("d1")
        assert ev["t"] == pytest.approx(REAL + 140, abs=1e-3)
        assert store.read("SELECT t, temp_c FROM health_points WHERE temp_c IS NOT NULL") == [
            (pytest.approx(REAL + 130, abs=1e-3), 41.5)]  # the dashboard's timeline too
        # a claim left unplaced once its pending boot is forgotten goes at the next prune
        _ingest(store, placer, [_health(160.0, _clk(False, 160.0, KB2))])
        with store.transaction() as db:
            db.execute("DELETE FROM clock_pending")
        store.prune(keep_health_s=7 * 86400.0, keep_events_s=30 * 86400.0, now=REAL + 300)
        assert store.read("SELECT COUNT(*) FROM health WHERE t < 1e9") == [(0,)]
        _pool_exact(store)
    finally:
        store.close()


def test_a_claim_ahead_that_no_boot_can_place_is_not_kept_until_its_date(store_url):
    """An unsynced claim may read up to 2100 (a box whose RTC says 2099). While its boot
    waits for a sync it is kept, to be placed; once no pending boot of its device is left
    (forgotten after the retention, as above) nothing can ever place it, and the prune,
    judging it by its claim, kept it until 2099: garbage for ever. It now goes then."""
    store = Store(store_url)
    try:
        placer = Placer(store)
        at_2099 = 4_070_000_000.0
        _ingest(store, placer, [_health(at_2099, _clk(False, 130.0)),
                                Inbound("d1", "event", {"v": 1, "t": at_2099 + 1, "type": "x",
                                                        "clk": _clk(False, 131.0)}),
                                _health(REAL + 30, None)])  # an old device's, on time
        store.prune(keep_health_s=7 * 86400.0, keep_events_s=30 * 86400.0, now=REAL + 60)
        assert store.read("SELECT COUNT(*) FROM health") == [(2,)]  # waiting to be placed
        with store.transaction() as db:
            db.execute("DELETE FROM clock_pending")
        store.prune(keep_health_s=7 * 86400.0, keep_events_s=30 * 86400.0, now=REAL + 60)
        assert store.read("SELECT t FROM health") == [(REAL + 30,)]
        assert store.read("SELECT COUNT(*) FROM events") == [(0,)]
        _pool_exact(store)
    finally:
        store.close()


def test_a_claim_a_week_behind_waits_for_its_placing_not_the_prune(store_url):
    """A device clock a week behind claims a plausible time (after 2025), so the prune judged
    its health and events by the claim, not kept them for their boot's placing as it keeps
    a claim at 1970: with keep_health_s a week, they went at the next prune (on PostgreSQL
    with their whole day's partition), and the sync found nothing to place. Now a row whose
    claimed time lies in the range its device's pending boot noted waits for the placing;
    placed, it is judged by its placed time; other rows are pruned as before."""
    day = 86400.0
    store = Store(store_url)
    try:
        placer = Placer(store)
        claim = REAL - BEHIND  # made at boottime 100 s, at REAL
        if store.backend == "postgresql":  # the claimed day's partition, made back then
            store._d.maintain(now=claim)
        made = [_health(claim, _clk(False, 100.0)),
                Inbound("d1", "event", {"v": 1, "t": claim + 10, "type": "thermal_trip",
                                        "clk": _clk(False, 110.0)})]
        made[0].msg["temp_c"] = 41.5  # a timeline number (health_points)
        other = Inbound("d2", "health", {"v": 1, "t": claim, "boot": "p9"})  # synced, old
        _ingest(store, placer, [*made, other])
        # two days on, no sync yet: the claims are past a week's retention, and so is their
        # day's partition; d2's row, a real time, goes
        store.prune(keep_health_s=BEHIND, keep_events_s=BEHIND, now=REAL + 2 * day)
        assert store.read("SELECT device, t FROM health") == [("d1", claim)]
        assert store.read("SELECT device, t FROM events") == [("d1", claim + 10)]
        assert store.read("SELECT t FROM health_points WHERE temp_c IS NOT NULL") == [
            (claim,)]
        # the clock syncs: the week-old claims land where they belong, and stay
        _ingest(store, placer, [_health(REAL + 2 * day, _clk(True, 100.0 + 2 * day))])
        store.prune(keep_health_s=BEHIND, keep_events_s=BEHIND, now=REAL + 2 * day)
        placed = sorted(t for (t,) in store.read("SELECT t FROM health"))
        assert placed == pytest.approx([REAL, REAL + 2 * day], abs=1e-3)
        (ev,) = store.events("d1")
        assert ev["t"] == pytest.approx(REAL + 10, abs=1e-3)
        assert store.read("SELECT t FROM health_points WHERE temp_c IS NOT NULL") == [
            (pytest.approx(REAL, abs=1e-3),)]
        assert store.read("SELECT COUNT(*) FROM clock_pending") == [(0,)]
        # a week-old claim of a pending boot forgotten (after the retention) goes
        _ingest(store, placer, [_health(claim + 50, _clk(False, 150.0, KB2))])
        store.prune(keep_health_s=BEHIND, keep_events_s=BEHIND, now=REAL + 2 * day)
        assert store.read("SELECT COUNT(*) FROM health WHERE t < ?", (REAL,)) == [(1,)]
        with store.transaction() as db:
            db.execute("DELETE FROM clock_pending")
        store.prune(keep_health_s=BEHIND, keep_events_s=BEHIND, now=REAL + 2 * day)
        assert store.read("SELECT COUNT(*) FROM health WHERE t < ?", (REAL,)) == [(0,)]
        _pool_exact(store)
    finally:
        store.close()


def test_a_refused_items_marker_amid_a_boots_results_does_not_end_its_placing(store_url):
    """A refused item's seq is kept as a marker row of no boot (result_items.py). Amid an
    unsynced boot's results it must not read as "the next boot's results": the placing
    stopped there and left the boot's later results with their claimed, week-behind t."""
    store = Store(store_url)
    try:
        placer = Placer(store)
        m = _results(range(1, 6))
        items = m.msg["results"]
        m = replace(m, msg={**m.msg, "results": [r for r in items if r["seq"] != 3]},
                    refused=((3, "at t: -1 is less than the minimum of 0", 40),))
        _ingest(store, placer, [m])
        assert [r["seq"] for r in store.results("d1")] == [1, 2, 4, 5]
        _ingest(store, placer, [_health(REAL + 10, _clk(True, 110.0))])
        rows = {r["seq"]: r for r in store.results("d1")}
        assert {q: rows[q]["t"] for q in rows} == pytest.approx(
            {q: REAL + q for q in (1, 2, 4, 5)}, abs=1e-3)
        assert store.read("SELECT device FROM clock_pending") == []
        _pool_exact(store)
    finally:
        store.close()
