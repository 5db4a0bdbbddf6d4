"""One refused item of a result message costs that item, never the stream (result_items.py).

A results message with one item the schema refuses (a frame stamped t = -7.9e-05 by a device
clock stepped to 1970) was quarantined whole and the coordinator acked only up to the first
missing seq, so the device re-sent the same message for ever: the stream never advanced. Now
its valid items are stored, each refused item is quarantined once and its seq counts as done
for the ack (a marker row under the result's own key), and a message that is not one at all
is still refused whole.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from support.waiting import until

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator import result_items
from runtime.coordinator.admission import Admission
from runtime.coordinator.commander import Refused
from runtime.coordinator.service import Coordinator
from runtime.coordinator.store import Inbound, Store
from runtime.wire import payloads

NOW = 1.7e9


def _item(seq: int, **kw) -> dict:
    return {"seq": seq, "t": NOW + seq, "label": "ok", "score": 0.9, **kw}


def _msg(items: list, floor: int = 1, **kw) -> dict:
    return {"v": 1, "stream": "s1", "boot": "b1", "floor": floor, "results": items, **kw}


def _raw(obj) -> bytes:
    return obj if isinstance(obj, bytes) else json.dumps(obj).encode()


BAD_T = _item(2, t=-7.9e-05)
LONG_LABEL = _item(3, label="x" * 300)


@pytest.mark.parametrize("payload, good, refused, unseq", [
    # one item stamped before 1970: the others stored, its seq refused
    (_msg([_item(1), BAD_T, _item(3)]), [1, 3], [2], 0),
    # a label too long, a field typed otherwise (a later device version)
    (_msg([LONG_LABEL, _item(4, rung="top")]), [], [3, 4], 0),
    # an item with no usable seq: counted, nothing to mark; the rest go on
    (_msg([_item(1), {"seq": True, "t": 1}, {"t": 1}]), [1], [], 2),
    (_msg([_item(1), "not an item"]), [1], [], 1),
    # whole: not JSON, not an object, no usable seq in any item, a bad envelope
    (b"not json", None, None, None),
    (_raw([1, 2]), None, None, None),
    (_msg([{"seq": 0, "t": 1}, {"seq": -3}]), None, None, None),
    (_msg([_item(1), BAD_T], v=2), None, None, None),  # a version we do not speak
    (_msg([_item(1), BAD_T], floor=0), None, None, None),
    (_msg([BAD_T], stream="a/b"), None, None, None),
    (_msg([]), None, None, None),
    (_msg([_item(1), BAD_T], extra="kept"), [1], [2], 0),  # extra envelope keys: as before
])
def test_which_items_are_stored_refused_or_refuse_the_message(payload, good, refused, unseq):
    got = result_items.split(_raw(payload))
    if good is None:
        assert got is None
        return
    assert [r["seq"] for r in got.msg["results"]] == good
    assert [q for q, _, _ in got.refused] == refused
    assert len(got.unseq) == unseq
    assert all(why and size > 0 for _, why, size in got.refused)


def test_the_reason_names_the_field():
    got = result_items.split(_raw(_msg([_item(1), BAD_T])))
    assert got is not None
    (seq, why, _), = got.refused
    assert seq == 2 and "t" in why and "minimum" in why, why


def test_a_valid_message_is_never_split():
    assert result_items.split(_raw(_msg([_item(1), _item(2)]))) is None


def test_decode_admits_whole_splits_or_refuses_explained():
    whole = result_items.decode(_raw(_msg([_item(1), _item(2)])))
    assert whole.refused == () and len(whole.msg["results"]) == 2
    assert [q for q, _, _ in result_items.decode(_raw(_msg([_item(1), BAD_T]))).refused] == [2]
    with pytest.raises(payloads.PayloadError, match="v"):  # refused whole: explained
        result_items.decode(_raw(_msg([_item(1), BAD_T], v=2)))
    with pytest.raises(payloads.PayloadError):
        result_items.decode(b"[")


def test_past_the_first_ten_refused_items_the_compiled_validator_says_why():
    got = result_items.split(_raw(_msg([_item(q, t=-1) for q in range(1, 13)])))
    assert got is not None and len(got.refused) == 12
    assert all("t" in why and "0" in why for _, why, _ in got.refused), got.refused
    assert got.refused[0][1] != got.refused[11][1]  # jsonschema's words, then fastjsonschema's


def test_admission_takes_a_result_message_item_by_item():
    a = Admission(CoordinatorConfig(fleet="f"), __import__("collections").Counter())
    device, kind, msg, refused, unseq = a.admit_items(
        "edgerun/v1/f/d1/result", _raw(_msg([_item(1), BAD_T, _item(3)])), NOW)
    assert (device, kind, [r["seq"] for r in msg["results"]]) == ("d1", "result", [1, 3])
    assert [q for q, _, _ in refused] == [2] and unseq == ()
    with pytest.raises(Refused):  # a health is never split (it is one item)
        a.admit("edgerun/v1/f/d1/health", b'{"v": 1, "t": -1, "boot": "b"}', NOW)


def _split_inbound(device: str, items: list, floor: int = 1) -> Inbound:
    s = result_items.split(_raw(_msg(items, floor)))
    assert s is not None
    return Inbound(device, "result", s.msg, 100, s.refused)


def test_the_store_acks_past_a_refused_seq_exactly_once(store_url):
    store = Store(store_url)
    try:
        told: list = []
        acks, refused = store.ingest([_split_inbound("d1", [_item(1), BAD_T, _item(3)])],
                                     None, told)
        assert refused == []
        assert [(i, q) for i, q, _, _ in told] == [(0, 2)]
        assert acks[("d1", "s1")][-1].seq == 3  # was: no ack past 1 (seq 2 never stored)
        assert store.result_seqs("d1") == [("s1", 1), ("s1", 3)]
        assert [r["seq"] for r in store.results("d1")] == [1, 3]
        assert [r["seq"] for r in store.results_page("d1")[0]] == [1, 3]
        # re-sent (its ack lost): nothing stored twice, the refusal not told again
        told = []
        acks, _ = store.ingest([_split_inbound("d1", [_item(1), BAD_T, _item(3)])], None,
                               told)
        assert told == [] and acks[("d1", "s1")][-1].seq == 3
        assert store.counts() == {"d1": 3}  # two results and the marker: rows, once each
        # the stream goes on past it; a floor that is a refused seq is done too
        acks, _ = store.ingest([Inbound("d1", "result", _msg([_item(4)], floor=2))])
        assert (acks[("d1", "s1")][-1].first, acks[("d1", "s1")][-1].seq) == (2, 4)
        assert store.acks()[("d1", "s1")] == 4
        events = [e for e in store.events("d1") if e["type"] == "results_refused"]
        assert len(events) == 1 and events[0]["n"] == 1 and events[0]["seqs"] == [2]
        assert "minimum" in events[0]["reason"]
    finally:
        store.close()


def test_a_message_of_refused_items_only_still_moves_the_ack(store_url):
    store = Store(store_url)
    try:
        store.ingest([Inbound("d1", "result", _msg([_item(1)]))])
        told: list = []
        acks, _ = store.ingest([_split_inbound("d1", [BAD_T, LONG_LABEL], floor=2)], None,
                               told)
        assert sorted(q for _, q, _, _ in told) == [2, 3]
        assert acks[("d1", "s1")][-1].seq == 3
        assert store.result_seqs("d1") == [("s1", 1)]
    finally:
        store.close()


def _device_client(broker, fleet: str, device: str, acks: list) -> mqtt.Client:
    cfg = broker.device(fleet, device)
    dev = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                      client_id=f"edgerun-{fleet}-{device}-test", protocol=mqtt.MQTTv311)
    dev.username_pw_set(cfg.username, Path(cfg.password_file).read_text().strip())
    dev.on_message = lambda c, u, m: acks.append(json.loads(m.payload))
    subscribed = threading.Event()
    dev.on_subscribe = lambda *a: subscribed.set()
    dev.on_connect = lambda c, *a: c.subscribe(f"edgerun/v1/{fleet}/{device}/ack", 1)
    dev.connect("127.0.0.1", broker.port, 30)
    dev.loop_start()
    assert subscribed.wait(30)
    return dev


@pytest.mark.timeout(120)
def test_a_device_stream_with_one_bad_item_goes_on_through_a_real_broker(broker, tmp_path):
    """Mosquitto + coordinator + a device speaking the wire format: seqs 1..9 in three
    messages, seq 5 stamped before 1970. Every good seq is stored once, seq 5 is counted
    once (quarantined with its reason), the ack goes past it to 9, and a re-send of the
    message holding it stores and counts nothing more."""
    coord = Coordinator(CoordinatorConfig(fleet="f", broker=broker.coordinator("f"),
                                          store=str(tmp_path / "c.db")))
    acks: list[dict] = []
    coord.start()
    dev = None
    try:
        assert coord.connected.wait(30)
        dev = _device_client(broker, "f", "A", acks)
        topic = "edgerun/v1/f/A/result"
        bad = [_item(4), _item(5, t=-7.9e-05), _item(6)]
        for items in ([_item(1), _item(2), _item(3)], bad, [_item(7), _item(8), _item(9)]):
            dev.publish(topic, json.dumps(_msg(items)), qos=1).wait_for_publish(30)
        assert until(lambda: any(a["seq"] == 9 for a in acks), 30), acks
        assert max(a["seq"] for a in acks) == 9 and all(a["from"] == 1 for a in acks)
        assert coord.store.result_seqs("A") == [("s1", q) for q in (1, 2, 3, 4, 6, 7, 8, 9)]
        # the quarantine row is written after the batch's acks are sent (service._ingest)
        assert until(lambda: coord.store.quarantine_counts() == {"A": 1}, 30), \
            coord.store.quarantine_counts()
        (q,), = [coord.store.quarantined("A")]
        assert "seq 5" in q["reason"] and "minimum" in q["reason"], q
        # the device re-sends the message (its ack lost): nothing stored or counted twice
        dev.publish(topic, json.dumps(_msg(bad, floor=4)), qos=1).wait_for_publish(30)
        assert until(lambda: any(a["from"] == 4 for a in acks), 30), acks
        assert coord.store.quarantine_counts() == {"A": 1}
        assert coord.counters["result_items_refused"] == 1
        assert len(coord.store.result_seqs("A")) == 8
        view = coord.device_view("A")
        assert any(e["type"] == "results_refused" and e["n"] == 1 for e in view["events"])
    finally:
        if dev is not None:
            dev.loop_stop()
            dev.disconnect()
        coord.stop()


def test_a_seq_written_2_0_is_the_integer_2_not_a_poison_pill(store_url):
    """JSON has one number type and the schema (draft 2020-12) takes 2.0 as an integer, so
    a message with `"seq": 2.0` (or `"floor": 1.0`) was admitted whole; its row then failed
    ingest's `isinstance(seq, int)` check: the batch was redone with savepoints, the message
    quarantined whole and never acked, so its device re-sent it for ever (and every batch it
    was in took the slow path). Such a seq is the integer it writes."""
    a = Admission(CoordinatorConfig(fleet="f"), __import__("collections").Counter())
    raw = _raw(_msg([_item(1), {**_item(2), "seq": 2.0}, _item(3)], floor=1.0))
    device, kind, msg, refused, unseq = a.admit_items("edgerun/v1/f/d1/result", raw, NOW)
    assert refused == () and unseq == ()
    assert [type(r["seq"]) for r in msg["results"]] == [int] * 3 and type(msg["floor"]) is int
    store = Store(store_url)
    try:
        acks, bad = store.ingest([Inbound(device, kind, msg, len(raw), refused)])
        assert bad == []
        assert (acks[("d1", "s1")][-1].first, acks[("d1", "s1")][-1].seq) == (1, 3)
        assert store.result_seqs("d1") == [("s1", 1), ("s1", 2), ("s1", 3)]
        assert [r["seq"] for r in store.results("d1")] == [1, 2, 3]
    finally:
        store.close()


def test_admission_charges_a_split_message_from_above(store_url):
    """The fair shares admit a result message by its charge estimated from above (budget.py
    `_charge_of`): a refused item's marker row (its reason up to 300 characters) can weigh
    far more than the item's bytes on the wire, so its marker is counted exactly."""
    store = Store(store_url)
    try:
        m = _split_inbound("d1", [{"seq": q, "t": -1} for q in range(1, 41)])
        m = Inbound(m.device, m.kind, m.msg, len(_raw(_msg([{"seq": q, "t": -1}
                                                            for q in range(1, 41)]))),
                    m.refused)
        estimate = store._budget._charge_of(m)
        store.ingest([m])
        charged = store.pools()[("d1", "results")]
        assert estimate >= charged, (estimate, charged)
    finally:
        store.close()


def test_explaining_a_refused_item_reads_a_bounded_number_of_its_errors():
    """An item with 300 bad boxes has 1,800 schema errors: jsonschema's best match over all
    of them took 22 ms an item, ten items a message, so a device sending such messages
    cost the ingest thread (every device's) 4-5x what valid ones of the same size did. The
    explanation reads the first EXPLAIN_ERRORS errors (1 ms); its reason names one of the
    first boxes, where reading on named the last (boxes/299)."""
    bad_box = {"label": 1, "score": "x", "x": 5, "y": 5, "w": 5, "h": 5}
    got = result_items.split(_raw(_msg([_item(1), _item(2, boxes=[bad_box] * 300)])))
    assert got is not None
    (seq, why, _), = got.refused
    assert seq == 2 and why.startswith("at boxes/"), why
    assert int(why.split("/")[1]) < result_items.EXPLAIN_ERRORS, why


@pytest.mark.parametrize("seq, why", [
    (1, "at t: -1.0 is less than the minimum of 0"),
    (2**62 - 1, 'quotes " and \\ backslash, a newline\n, a tab\t'),
    (7, "é, ü, \u2028, \U0001f600 and \x00"),
    (9, "x" * 400),  # cut at 300
    (3, ""),
])
def test_a_markers_body_is_what_json_writes(seq, why):
    """marker_row writes its body by hand (json.dumps was most of a refused item's cost in
    the store): byte for byte what json.dumps wrote."""
    from runtime.coordinator.store_rows import marker_row

    body = marker_row("d", "s", seq, why, 1.0)[6]
    assert body == json.dumps({"seq": seq, "refused": why[:300]}, separators=(",", ":"))
    assert json.loads(body) == {"seq": seq, "refused": why[:300]}
