"""Where the outbox's byte bounds lie exactly (runtime/telemetry/outbox.py): eviction past
`max_bytes` down to 90 % of it, the result just written kept; the result log holding at most
half the cap, and the whole never over it, after every append."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.config.telemetry import OutboxConfig
from runtime.telemetry import resultlog
from runtime.telemetry.outbox import Outbox

BODY = 1000  # bytes of each result as stored (its JSON, the seq left out)
CAP = 100 * BODY  # 90 % of it is 90 results exactly


def _result(i: int, boot: str) -> dict:
    """A result whose stored JSON is BODY bytes: {"i":N,"boot":"...","pad":"x..."}."""
    head = f'{{"i":{i},"pad":"","boot":"{boot}"}}'
    return {"i": i, "pad": "x" * (BODY - len(head)), "boot": boot}


def _stored_bytes(ob: Outbox) -> int:
    """The bytes of the results `ob` holds (pending()'s JSON less its '"seq":N,')."""
    return sum(len(p.json) - len(f'"seq":{p.seq},') for p in ob.pending(0, 1_000_000))


@pytest.mark.parametrize(("appended", "held", "evicted"), [
    (99, 99, 0),
    (100, 100, 0),  # exactly the cap: nothing evicted
    (101, 90, 11),  # over it: the oldest go, down to 90 % exactly (90 results)
    (102, 91, 11),  # under the cap again: none more
])
def test_eviction_goes_down_to_ninety_percent_exactly(tmp_path, appended, held, evicted):
    """Results written straight to the database (spill_after_s = 0), 1000 bytes each, under a
    100 000-byte cap: the 101st evicts the 11 oldest, leaving 90 000 bytes."""
    events: list[dict] = []
    ob = Outbox(OutboxConfig(path=str(tmp_path / "o.db"), max_bytes=CAP, spill_after_s=0),
                events.append)
    try:
        for i in range(appended):
            ob.append(_result(i, ob.boot))
        assert _stored_bytes(ob) == held * BODY == ob.stats()["bytes"]
        assert (ob.floor(), ob.last_seq()) == (appended - held + 1, appended)
        assert ob.evicted_total == evicted
        said = [(e["count"], e["first_seq"], e["last_seq"]) for e in events
                if e["type"] == "outbox_evicting"]
        assert said == ([(11, 1, 11)] if evicted else [])
    finally:
        ob.close()


def test_the_log_holds_at_most_half_the_cap_and_the_whole_never_over_it(tmp_path):
    """Results wait in the log (no ack, no time passing) until they are more than half the
    cap: then they move into the database, where eviction can reach them (results in the
    log are never evicted). Whatever the mix, the bytes held stay within the cap."""
    path = tmp_path / "o.db"
    ob = Outbox(OutboxConfig(path=str(path), max_bytes=CAP), clock=lambda: 0.0)
    log = Path(f"{path}.log")
    try:
        for i in range(300):
            ob.append(_result(i, ob.boot))
            in_log = sum(len(b) for _, b in resultlog.read(log).results)
            assert in_log <= CAP // 2, (i, in_log)
            assert ob.stats()["bytes"] == _stored_bytes(ob) <= CAP, i
    finally:
        ob.close()


@pytest.mark.parametrize(("waited_s", "spilled"), [(59.9, False), (60.0, True)])
def test_results_unacked_for_spill_after_s_move_into_the_database(tmp_path, waited_s,
                                                                  spilled):
    """The oldest unacked result in the log for exactly spill_after_s (60 s) takes the log's
    results into the database with the next append; the log starts again."""
    path = tmp_path / "o.db"
    now = [0.0]
    ob = Outbox(OutboxConfig(path=str(path), max_bytes=CAP), clock=lambda: now[0])
    try:
        ob.append(_result(0, ob.boot))
        now[0] = waited_s
        ob.append(_result(1, ob.boot))
        in_log = [q for q, _ in resultlog.read(Path(f"{path}.log")).results]
        assert in_log == ([] if spilled else [1, 2])
        assert [p.seq for p in ob.pending(0, 10)] == [1, 2]
    finally:
        ob.close()
