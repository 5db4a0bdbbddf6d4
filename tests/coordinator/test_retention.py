"""Store retention (finding 10): age and size bounds, never below what the ack needs."""

from __future__ import annotations

import logging
import time

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.service import Coordinator
from runtime.coordinator.store import Inbound, Store


def _batch(stream: str, seqs, blob: int = 0, floor: int = 1) -> dict:
    return {"v": 1, "stream": stream, "boot": "b1", "floor": floor,
            "results": [{"seq": s, "t": time.time(), "label": "ok", "score": 0.5,
                         "blob": "x" * blob} for s in seqs]}


def test_age_prunes_acked_rows_only_and_never_lowers_the_ack(store_url):
    store = Store(store_url)
    store.ingest([Inbound("d", "result", _batch("s", range(1, 101)))])
    # 101..104 missing: the device still holds 101 (its floor), not stored yet
    store.ingest([Inbound("d", "result", _batch("s", range(105, 111), floor=101))])
    assert store.acks() == {("d", "s"): 100}
    later = time.time() + 100 * 86400
    done = store.prune_results(max_age_s=90 * 86400, now=later)
    assert done["results_by_age"] == 100
    # rows above the ack are kept: they are needed when the gap closes
    assert [q for _, q in store.result_seqs("d")] == list(range(105, 111))
    assert store.acks() == {("d", "s"): 100}
    # a re-sent old row is not stored as news below the ack... and the ack still climbs
    store.ingest([Inbound("d", "result", _batch("s", range(101, 105), floor=101))])
    assert store.acks() == {("d", "s"): 110}
    assert store.prune_results(max_age_s=90 * 86400) == {
        "results_by_age": 0, "results_by_size": 0, "health_by_size": 0, "events_by_size": 0}
    store.close()


def test_size_cap_bounds_the_store_file_under_a_flood_of_big_results(tmp_path, caplog):
    cap_mb = 4
    coord = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db"),
                                          max_store_mb=cap_mb, retention_days=0))
    seq = 0
    for _ in range(30):  # 30 messages of ~1 MB each, as in the finding
        coord.store.ingest([Inbound("d", "result",
                                    _batch("s", range(seq + 1, seq + 11), blob=100_000,
                                           floor=seq + 1))])
        seq += 10
        with caplog.at_level(logging.WARNING, "edgerun.coordinator"):
            coord.run_retention()
    size_mb = sum(p.stat().st_size for p in tmp_path.glob("c.db*")) / 2**20  # with the WAL
    assert coord.store.used_bytes() <= cap_mb * 2**20
    assert size_mb < cap_mb + 3, size_mb  # 30 MB went in; the file stays near the cap
    assert coord.store.acks() == {("d", "s"): 300}
    remaining = [q for _, q in coord.store.result_seqs("d")]
    assert remaining and remaining == list(range(remaining[0], 301))  # the newest are kept
    assert coord.counters["pruned_results_by_size"] + coord.counters["shed_results"] \
        == 300 - len(remaining)
    # alone, its share is the whole budget: what it holds past it is what goes, its oldest
    # acked rows shed by admission before the new ones are written (it rotates)
    assert "device d was over its quota of results in a full store" in caplog.text
    assert coord.counters["shed_results"] > 0
    coord.stop()


def test_size_cap_never_deletes_unacked_rows(store_url):
    store = Store(store_url)
    # seq 1 never arrived: nothing is acked, nothing may go, whatever the size
    store.ingest([Inbound("d", "result", _batch("s", range(2, 40), blob=50_000))])
    assert store.acks().get(("d", "s"), 0) == 0  # seq 1 never arrived: nothing is acked
    done = store.prune_results(max_bytes=64 * 1024)
    assert done["results_by_size"] == 0 and len(store.result_seqs("d")) == 38
    store.close()
