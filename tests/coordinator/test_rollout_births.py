"""Returning devices in bulk: `Rollouts.on_online_many` (one read of the desired state for a
batch of births) decides exactly what the per-birth path decided, on SQLite and PostgreSQL,
and the coordinator's ingest hands a batch's births over together, in order around events."""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from runtime.coordinator.rollout import Rollouts
from runtime.coordinator.store import Store

ARGS = {"name": "m", "version": "2", "url": "http://here/api/v1/bundles/m@2", "size": 1,
        "sha256": "0" * 64, "token": "t"}
STORED_OTHER_URL = {**ARGS, "url": "http://old/api/v1/bundles/m@2"}  # same file, older address
REBUILT = {**ARGS, "name": "r", "url": "http://old/api/v1/bundles/r@1", "version": "1"}
GONE = {**ARGS, "name": "g", "version": "9", "url": "http://old/api/v1/bundles/g@9"}
SETTINGS = {"set_latency_target": {"ms": 20}, "set_rate": {"fps": 5}}

# device -> its stored desired state (absent: none stored)
DESIRED = {
    "same": {"model": ARGS},
    "other": {"model": STORED_OTHER_URL},
    "set": {"settings": SETTINGS},
    "both": {"model": ARGS, "settings": {"set_rate": {"fps": 2}}},
    "rebuilt": {"model": REBUILT},  # the shelf holds another file under r@1: stored ones sent
    "gone": {"model": GONE},  # this coordinator cannot make g@9's arguments: stored ones sent
    "rejected": {"model_rejected": "rolled back on this device", "settings": {}},
    "broken": {"model": {"version": "1"}},  # no name: this device's bookkeeping fails alone
}
# (device, model_version reported at its birth), in a batch's order, repeats included
BIRTHS = [
    ("same", "m@2"), ("same", "m@1"), ("same", None), ("same", ""),
    ("other", "m@1"), ("set", "m@2"), ("set", None), ("both", "x@1"), ("both", "m@2"),
    ("rebuilt", "r@0"), ("gone", "g@8"), ("rejected", "m@1"), ("broken", "m@1"),
    ("unknown", "m@1"), ("other", "m@1"),
]


def _deploy_args(bundle: str) -> dict:
    if bundle == "m@2":
        return ARGS
    if bundle == "r@1":
        return {**REBUILT, "sha256": "1" * 64, "url": "http://here/api/v1/bundles/r@1"}
    raise ValueError(f"no bundle {bundle!r} held by this coordinator")


def _per_birth_reference(r: Rollouts, device: str, model_version: str | None) -> None:
    """The per-birth `on_online` before batching, verbatim but for its name."""
    doc = r.desired(device)
    want = doc.get("model")
    if want and model_version is not None \
            and model_version != f"{want['name']}@{want['version']}":
        fresh = r._fresh_args(f"{want['name']}@{want['version']}", want)
        if all(fresh.get(k) == want.get(k) for k in ("size", "sha256", "token")):
            want = fresh
        r._try_send(device, "deploy", want)
    for cmd, args in (doc.get("settings") or {}).items():
        r._try_send(device, cmd, args)


def _rollouts(store_url: str, sent: list) -> tuple[Rollouts, list]:
    shelf_reads: list[str] = []

    def deploy_args(bundle: str) -> dict:
        shelf_reads.append(bundle)
        return _deploy_args(bundle)

    r = Rollouts(Store(store_url), lambda d, c, a: sent.append((d, c, json.dumps(a,
                 sort_keys=True))), deploy_args, lambda: sorted(DESIRED))
    for device, doc in DESIRED.items():
        r._set_desired(device, doc)
    return r, shelf_reads


def test_batched_births_decide_as_the_per_birth_path(store_url):
    expected: list = []
    ref, _ = _rollouts(store_url, expected)
    for device, version in BIRTHS:
        with contextlib.suppress(KeyError):  # "broken": the ingest loop logged it, went on
            _per_birth_reference(ref, device, version)
    ref._store.close()
    got: list = []
    r, shelf_reads = _rollouts(store_url, got)
    reads: list = []
    real_query = r._store._query
    r._store._query = lambda sql, args=(): reads.append(sql) or real_query(sql, args)
    r.on_online_many(BIRTHS)
    assert got == expected
    # the table's expectations, spelled out: what each returning device is sent
    assert [(d, c) for d, c, _ in got] == [
        ("same", "deploy"), ("same", "deploy"), ("other", "deploy"),
        ("set", "set_latency_target"), ("set", "set_rate"), ("set", "set_latency_target"),
        ("set", "set_rate"), ("both", "deploy"), ("both", "set_rate"), ("both", "set_rate"),
        ("rebuilt", "deploy"), ("gone", "deploy"), ("other", "deploy")]
    sent_args = {d: json.loads(a) for d, c, a in got if c == "deploy"}
    assert sent_args["other"] == ARGS  # this coordinator's address for the same file
    assert sent_args["rebuilt"] == REBUILT and sent_args["gone"] == GONE  # stored ones
    assert len(reads) == 1 and "FROM desired" in reads[0]  # one query for the whole batch
    assert sorted(shelf_reads) == ["g@9", "m@2", "r@1"]  # once per bundle, not per birth
    r._store.close()


def test_births_beyond_one_query_chunk_are_all_read(store_url):
    sent: list = []
    r = Rollouts(Store(store_url), lambda d, c, a: sent.append(d), _deploy_args, list)
    devices = [f"d{i:04d}" for i in range(1203)]
    r._store.write("INSERT INTO desired VALUES (?, ?)",
                   [(d, json.dumps({"settings": {"set_rate": {"fps": 1}}})) for d in devices])
    reads: list = []
    real_query = r._store._query
    r._store._query = lambda sql, args=(): reads.append(sql) or real_query(sql, args)
    r.on_online_many([(d, "m@1") for d in reversed(devices)])
    assert sent == list(reversed(devices)) and len(reads) == 3
    r._store.close()


def _birth(device: str, t: float, model_version: str = "m@1") -> tuple[str, bytes, float]:
    return (f"edgerun/v1/b/{device}/state", json.dumps(
        {"v": 1, "online": True, "boot": "b", "t": t, "model_version": model_version}
    ).encode(), t)


def test_ingest_reads_desired_state_once_per_batch_of_births(tmp_path):
    """10 births in one ingest batch: one read of the desired table (it was one per birth),
    and each returning device still gets its settings."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator

    c = Coordinator(CoordinatorConfig(fleet="b", store=str(tmp_path / "c.db")))
    c._conn.publish = lambda *a, **k: None
    sent: list = []
    c.rollouts._send = lambda d, cmd, a: sent.append((d, cmd))
    devices = [f"d{i}" for i in range(10)]
    for d in devices:
        c.rollouts.record_setting(d, "set_rate", {"fps": 3})
    reads: list = []
    real_query = c.store._query
    c.store._query = lambda sql, args=(): reads.append(sql) or real_query(sql, args)
    now = time.time()
    c._ingest([_birth(d, now) for d in devices])
    assert sent == [(d, "set_rate") for d in devices]
    assert sum("FROM desired" in q for q in reads) == 1
    c.store.close()


def test_ingest_keeps_births_and_events_in_order(tmp_path):
    """An event between births splits them: the births before it are decided before the
    event changes any desired state, those after it after."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator

    c = Coordinator(CoordinatorConfig(fleet="b", store=str(tmp_path / "c.db")))
    c._conn.publish = lambda *a, **k: None
    calls: list = []
    c.rollouts.on_online_many = lambda births: calls.append(("births", list(births)))
    c.rollouts.on_event = lambda device, ev: calls.append(("event", device))
    now = time.time()
    event = ("edgerun/v1/b/e1/event", json.dumps(
        {"v": 1, "t": now, "type": "model_probation_passed", "version": "m@2"}).encode(), now)
    c._ingest([_birth("a", now), _birth("b", now, ""), event, _birth("c", now)])
    assert calls == [("births", [("a", "m@1"), ("b", "")]), ("event", "e1"),
                     ("births", [("c", "m@1")])]
    c.store.close()


@pytest.mark.parametrize("fail", ["read", "decision"])
def test_a_failing_batch_or_device_costs_only_its_own_resends(tmp_path, fail):
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator

    c = Coordinator(CoordinatorConfig(fleet="b", store=str(tmp_path / "c.db")))
    c._conn.publish = lambda *a, **k: None
    sent: list = []
    c.rollouts._send = lambda d, cmd, a: sent.append((d, cmd))
    c.rollouts.record_setting("a", "set_rate", {"fps": 3})
    c.rollouts.record_setting("c", "set_rate", {"fps": 3})
    if fail == "read":
        def broken(sql, args=()):
            raise RuntimeError("store down")
        c.rollouts._desired_bodies = broken
    else:
        c.rollouts._set_desired("b", {"model": {"version": "1"}})  # no name
    now = time.time()
    c._ingest([_birth("a", now), _birth("b", now), _birth("c", now)])
    assert sent == ([] if fail == "read" else [("a", "set_rate"), ("c", "set_rate")])
    assert "a" in c.views and "c" in c.views  # the views were kept either way
    c.store.close()


def test_a_births_window_is_on_the_coordinators_clock(tmp_path):
    """Births' re-send windows are on the coordinator's `mono` (stepped in tests), the
    clock `Births.due` is called with: a window opened on another clock ended at once or
    never. `mono` here reads far from time.monotonic(), so a window opened on it is caught."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator
    from runtime.coordinator.store import Inbound

    c = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db"),
                                      resend_window_s=60.0))
    mono = [1e9]
    c.mono = lambda: mono[0]
    try:
        def birth(boot: str) -> tuple[int, Inbound]:
            return 0, Inbound("A", "state", {"v": 1, "online": True, "boot": boot,
                                             "t": time.time()})
        c.births.stored([birth("b1")])  # acts at once: its window opens
        c.births.stored([birth("b2")])  # within the window: held to its end
        assert c.births.stats()["held"] == 1
        c.births.due(mono[0] + 59.0)
        assert c.births.stats()["held"] == 1  # the window is not over
        c.births.due(mono[0] + 61.0)
        assert c.births.stats()["held"] == 0
    finally:
        c.store.close()
        c.shelf.close()
