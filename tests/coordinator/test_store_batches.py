"""A batch of births (and of any device set) in few statements on both backends: the states
of a batch are written in one statement on PostgreSQL (the last of a device twice stays),
and a batch's device lists go to PostgreSQL as one array, not a parameter per device."""

from __future__ import annotations

import time

import pytest

from runtime.coordinator.store import Inbound, Store


def _state(device_no: int, t: float, boot: str = "b") -> dict:
    return {"v": 1, "online": True, "boot": f"{boot}{device_no}", "t": t,
            "versions": {"edgerun": "sim"}, "reason": "quote ' and \" and \\ and \u00e9"}


def _result(stream: str, seq: int) -> dict:
    return {"v": 1, "stream": stream, "boot": "b", "floor": 1,
            "results": [{"seq": s, "t": time.time(), "label": "ok"} for s in range(1, seq + 1)]}


@pytest.fixture
def recorded(monkeypatch):
    """Every statement sent to PostgreSQL: (sql, number of parameters, executemany?)."""
    from runtime.coordinator import dialect

    sent: list[tuple[str, int, bool]] = []
    execute, executemany = dialect._PgConn.execute, dialect._PgConn.executemany

    def rec_execute(self, sql, args=()):
        sent.append((sql, len(tuple(args)), False))
        return execute(self, sql, args)

    def rec_executemany(self, sql, rows):
        sent.append((sql, len(rows), True))
        return executemany(self, sql, rows)

    monkeypatch.setattr(dialect._PgConn, "execute", rec_execute)
    monkeypatch.setattr(dialect._PgConn, "executemany", rec_executemany)
    return sent


def test_a_batch_of_births_and_results_is_stored_and_read_back(store_url, recorded):
    """600 devices' births (one twice: its second stays) and results in one batch: every
    state, view and ack as before; on PostgreSQL no statement takes a parameter per device
    and the states go in one statement."""
    store = Store(store_url)
    now = time.time()
    batch = [Inbound(f"d{i:03d}", "state", _state(i, now)) for i in range(600)]
    batch.append(Inbound("d007", "state", _state(7, now + 1, boot="again")))
    batch += [Inbound(f"d{i:03d}", "result", _result("s", 2)) for i in range(600)]
    written: dict = {}
    acks, refused = store.ingest(batch, written)
    assert refused == []
    states = store.states()
    assert len(states) == 600 and states["d007"]["boot"] == "again7"
    assert states["d123"] == _state(123, now)  # the awkward characters come back as sent
    assert sorted(written) == [f"d{i:03d}" for i in range(600)]
    assert all(a[0].seq == 2 for a in acks.values()) and len(acks) == 600
    assert written["d007"][1].online and store.read_in(
        "SELECT device FROM devices WHERE device", ["d001", "d599", "nope"]) in (
        [("d001",), ("d599",)], [("d599",), ("d001",)])
    if store.backend == "postgresql":
        assert recorded and max(n for sql, n, many in recorded if not many) <= 50
        assert not [sql for sql, n, many in recorded if many and "states" in sql]
    store.close()


def test_read_in_of_many_keys(store_url):
    store = Store(store_url)
    store.write("INSERT INTO desired VALUES (?, ?)", [(f"d{i}", "{}") for i in range(700)])
    keys = [f"d{i}" for i in range(0, 700, 2)] + ["x", "it's"]
    got = store.read_in("SELECT device FROM desired WHERE device", keys)
    assert sorted(d for (d,) in got) == sorted(keys[:-2])
    assert store.read_in("SELECT device FROM desired WHERE device", ["it's"]) == []
    store.close()
