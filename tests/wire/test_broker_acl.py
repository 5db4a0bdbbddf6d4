"""Identity and ACLs on a real Mosquitto (finding 5): anonymous and forged publishes refused,
devices confined to their own topics, client-id takeover by an outsider refused, and the
coordinator still does its job."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.mqtt_probe import Probe
from support.waiting import until, wait

from runtime.config.telemetry import BrokerConfig
from runtime.wire.brokerauth import BrokerAuth, Identity, acl_text, hash_password


@pytest.fixture
def secure_broker(broker):
    return broker  # conftest's: ACLs on


def test_python_pbkdf2_hash_is_what_mosquitto_reads(tmp_path):
    # same layout as mosquitto_passwd's default (sha512-pbkdf2, 12-byte salt): $7$N$salt$hash
    h = hash_password("pw", salt=b"\0" * 12, iterations=101)
    kind, it, salt, digest = h.split("$")[1:]
    assert (kind, it, salt, len(digest)) == ("7", "101", "AAAAAAAAAAAAAAAA", 88)


def test_anonymous_and_wrong_password_are_refused(secure_broker):
    anon = Probe(secure_broker.port)
    assert not anon.accepted and "authori" in str(anon.connack[0]).lower()
    cfg = secure_broker.device("f1", "dev1")
    wrong = cfg.password_file + ".wrong"
    Path(wrong).write_text("guess\n")
    bad = Probe(secure_broker.port, BrokerConfig(username="f1/dev1", password_file=wrong))
    assert not bad.accepted
    good = Probe(secure_broker.port, cfg)
    assert good.accepted
    good.close()


def test_device_is_confined_to_its_own_topics_and_the_coordinator_does_its_job(secure_broker):
    b = secure_broker
    coord = Probe(b.port, b.coordinator("f1"), client_id="coord")
    assert coord.accepted
    coord.sub("$share/coord/edgerun/v1/f1/+/result")
    coord.sub("edgerun/v1/f1/+/state")
    coord.sub("edgerun/v1/f1/+/cmd/reply")
    dev1 = Probe(b.port, b.device("f1", "dev1"), client_id="edgerun-f1-dev1")
    dev2 = Probe(b.port, b.device("f1", "dev2"), client_id="edgerun-f1-dev2")
    dev1.sub("edgerun/v1/f1/dev1/cmd")
    dev1.sub("edgerun/v1/f1/dev1/ack")
    dev1.sub("edgerun/v1/f1/dev2/#")  # granted by the broker, but nothing is delivered
    dev1.sub("#")
    dev2.sub("edgerun/v1/f1/dev2/ack")
    dev2.sub("edgerun/v1/f1/dev2/cmd")
    # forged: under another device, under another fleet, and the coordinator's topics
    dev1.pub("edgerun/v1/f1/dev2/result", b"forged")
    dev1.pub("edgerun/v1/f1/dev2/state", b"forged", retain=True)
    dev1.pub("edgerun/v1/f2/dev1/result", b"forged")
    dev1.pub("edgerun/v1/f1/dev1/ack", b"forged")
    dev1.pub("edgerun/v1/f1/dev2/ack", b"forged")
    dev1.pub("edgerun/v1/f1/dev2/cmd", b"forged")
    # its own
    dev1.pub("edgerun/v1/f1/dev1/result", b"mine")
    dev1.pub("edgerun/v1/f1/dev1/state", b"mine")
    dev1.pub("edgerun/v1/f1/dev1/cmd/reply", b"mine")
    # the coordinator acks and commands both devices
    coord.pub("edgerun/v1/f1/dev2/ack", b"ack2")
    coord.pub("edgerun/v1/f1/dev2/cmd", b"cmd2")
    coord.pub("edgerun/v1/f1/dev1/ack", b"ack1")
    assert until(lambda: len(coord.got) >= 3 and len(dev2.got) >= 2 and dev1.got, 30)
    time.sleep(0.5)
    assert sorted(coord.got) == sorted([("edgerun/v1/f1/dev1/result", b"mine"),
                                        ("edgerun/v1/f1/dev1/state", b"mine"),
                                        ("edgerun/v1/f1/dev1/cmd/reply", b"mine")])
    assert sorted(dev2.got) == [("edgerun/v1/f1/dev2/ack", b"ack2"),
                                ("edgerun/v1/f1/dev2/cmd", b"cmd2")]  # no forged ack or cmd
    assert {t for t, _ in dev1.got} == {"edgerun/v1/f1/dev1/ack"}  # nothing of dev2's
    assert all(p == b"ack1" for _, p in dev1.got)
    # the forged retained state was never stored: a late subscriber sees none
    late = Probe(b.port, b.coordinator("f1", "coord2"))
    late.sub("edgerun/v1/f1/dev2/state")
    time.sleep(0.5)
    assert late.got == []
    for p in (coord, dev1, dev2, late):
        p.close()


def test_a_coordinator_of_another_fleet_cannot_ack_or_command(secure_broker):
    """Fleet f2's coordinator publishes an ack and a command to f1's dev1, which its grant
    (f2 only) refuses. The observers (dev1 itself, f1's coordinator) have subscribed before,
    and f1's coordinator then sends a real ack and command as the positive control: Mosquitto
    handles packets in order on one thread and each forged publish was PUBACKed first, so a
    forged message it let through would reach an observer before the control does."""
    b = secure_broker
    ack, cmd = "edgerun/v1/f1/dev1/ack", "edgerun/v1/f1/dev1/cmd"
    dev1 = Probe(b.port, b.device("f1", "dev1"), client_id="edgerun-f1-dev1")
    dev1.sub(ack)
    dev1.sub(cmd)
    spy = Probe(b.port, b.coordinator("f1", "coord-f1"))
    spy.sub("edgerun/v1/f1/#")
    coord = Probe(b.port, b.coordinator("f2", "coord-f2"))
    coord.sub("edgerun/v1/#")
    coord.pub(ack, b"wrong fleet")  # returns on the broker's PUBACK: it has been handled
    coord.pub(cmd, b"wrong fleet")
    spy.pub(ack, b"right fleet")
    spy.pub(cmd, b"right fleet")
    # and f2's coordinator's own topic, the control that it receives what it may read
    coord.pub("edgerun/v1/f2/dev9/ack", b"own fleet")
    right = [(ack, b"right fleet"), (cmd, b"right fleet")]
    wait(lambda: len(dev1.got) >= 2 and len(spy.got) >= 2 and coord.got, 30,
         "the controls at every observer")
    assert dev1.got == right
    assert spy.got == right
    # nothing of f1 (the forged publishes nor f1's own) reached f2's coordinator
    assert coord.got == [("edgerun/v1/f2/dev9/ack", b"own fleet")]
    for p in (coord, spy, dev1):
        p.close()


def test_outsider_cannot_take_over_a_device_client_id(secure_broker):
    b = secure_broker
    dev = Probe(b.port, b.device("f1", "dev1"), client_id="edgerun-f1-dev1")
    for _ in range(5):
        outsider = Probe(b.port, client_id="edgerun-f1-dev1")  # anonymous, same client id
        assert not outsider.accepted
        outsider.close()
    time.sleep(0.3)
    assert dev.disconnects == []  # the device was never kicked off
    dev.pub("edgerun/v1/f1/dev1/result", b"still here")
    dev.close()


def test_acl_file_layout_and_revocation(tmp_path):
    auth = BrokerAuth(tmp_path)
    auth.enrol(Identity("f1/dev1", "device"))
    auth.enrol(Identity("coordinator", "coordinator", fleets=("f1",)))
    auth.enrol(Identity("coordinator", "coordinator", fleets=("f2",)))
    text = auth.acl.read_text()
    assert "pattern write edgerun/v1/%u/result" in text
    assert "pattern read edgerun/v1/%u/ack" in text
    assert "topic write edgerun/v1/f1/+/ack" in text and "topic read edgerun/v1/f2/+/#" in text
    assert oct(auth.passwd.stat().st_mode & 0o777) == "0o600"
    assert auth.remove("f1/dev1") and "f1/dev1:" not in auth.passwd.read_text()
    with pytest.raises(ValueError):
        auth.enrol(Identity("f1/de+v", "device"))
    with pytest.raises(ValueError):
        auth.enrol(Identity("a/b", "coordinator"))  # only devices have a '/' in their name
    # a device's own connection needs no user block (the patterns); its bundle connection
    # is an identity of its own with exactly its two topics (client ids bound to usernames)
    assert "user f1/d\n" not in acl_text([Identity("f1/d", "device")])
    blocks = acl_text([Identity("f1/d", "device")]).split("\n\n")
    assert blocks[-2].splitlines() == [
        "user f1/d+bundles", "topic write edgerun/v1/f1/d/bundle/req",
        "topic read edgerun/v1/f1/d/bundle/chunk"]
    # its Sparkplug edge node: group f1, edge node d, and every primary host's STATE
    assert blocks[-1].splitlines() == [
        "user f1/d+sparkplug", "topic write spBv1.0/f1/+/d", "topic write spBv1.0/f1/+/d/+",
        "topic read spBv1.0/f1/NCMD/d", "topic read spBv1.0/f1/DCMD/d/+",
        "topic read spBv1.0/STATE/+"]


def test_revoked_device_is_refused_after_reload(secure_broker):
    b = secure_broker
    cfg = b.device("f1", "dev1")
    assert Probe(b.port, cfg).accepted
    b.auth.remove("f1/dev1")
    b.reload()
    assert until(lambda: not Probe(b.port, cfg).accepted, 30)  # the reload is asynchronous


def test_demo_fallback_broker_amqtt_is_authenticated_too(tmp_path):
    pytest.importorskip("amqtt")
    from runtime.tools.demo import EmbeddedBroker

    b = EmbeddedBroker(tmp_path)
    dev_cfg, coord_cfg = b.device("demo", "box"), b.coordinator("demo")
    b.start()
    try:
        assert not Probe(b.port, v5=False).accepted
        coord = Probe(b.port, coord_cfg, v5=False)
        dev = Probe(b.port, dev_cfg, v5=False)
        assert coord.accepted and dev.accepted
        coord.sub("edgerun/v1/demo/+/result")
        dev.sub("#")  # refused by amqtt's subscribe ACL
        dev.sub("edgerun/v1/demo/box/ack")
        dev.pub("edgerun/v1/demo/other/result", b"forged")
        dev.pub("edgerun/v1/demo/box/ack", b"forged ack")
        dev.pub("edgerun/v1/demo/box/result", b"mine")
        coord.pub("edgerun/v1/demo/box/ack", b"ack")
        assert until(lambda: coord.got and dev.got, 10)
        time.sleep(0.5)
        assert coord.got == [("edgerun/v1/demo/box/result", b"mine")]
        assert dev.got == [("edgerun/v1/demo/box/ack", b"ack")]
        coord.close()
        dev.close()
    finally:
        b.stop()


def test_forged_results_and_health_never_reach_a_real_coordinator(tmp_path, secure_broker):
    """Finding 5 end to end: what the outsider and the rogue device of the finding sent
    (results and health for real and invented devices, a spoofed ack) is refused by the
    broker; the coordinator stores only the device's own traffic."""
    import json

    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator

    b = secure_broker
    coord = Coordinator(CoordinatorConfig(fleet="f1", broker=b.coordinator("f1"),
                                          store=str(tmp_path / "c.db")))
    coord.start()
    assert coord.connected.wait(30)

    def result(seq: int) -> bytes:
        return json.dumps({"v": 1, "stream": "s1", "boot": "b", "floor": 1,
                           "results": [{"seq": seq, "t": time.time()}]}).encode()

    health = json.dumps({"v": 1, "t": time.time(), "boot": "b", "temp_c": 99.0,
                         "backlog": {"results_held": 10**6}}).encode()
    outsider = Probe(b.port, client_id="edgerun-coordinator")  # anonymous, the coordinator's id
    assert not outsider.accepted
    rogue = Probe(b.port, b.device("f1", "dev1"))
    victim_sub = Probe(b.port, b.device("f1", "dev2"))
    victim_sub.sub("edgerun/v1/f1/dev2/ack")
    for device in ("dev2", "ghost"):
        rogue.pub(f"edgerun/v1/f1/{device}/result", result(1))
        rogue.pub(f"edgerun/v1/f1/{device}/health", health)
    rogue.pub("edgerun/v1/f1/dev2/ack", b'{"v":1,"stream":"s1","seq":1000000000}')
    rogue.pub("edgerun/v1/f1/dev1/result", result(1))  # its own: stored
    assert until(lambda: coord.store.counts().get("dev1") == 1, 10)
    time.sleep(0.5)
    assert coord.store.counts() == {"dev1": 1}
    assert set(coord.store.latest_health()) == set()
    assert victim_sub.got == []
    assert coord.connected.is_set()  # the outsider's takeover attempt did not kick it off
    coord.stop()
    for p in (outsider, rogue, victim_sub):
        p.close()


def test_concurrent_enrolments_lose_no_user(tmp_path):
    import threading

    auth = BrokerAuth(tmp_path)
    threads = [threading.Thread(target=auth.enrol, args=(Identity(f"f1/d{i}", "device"),))
               for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(auth.identities()) == {f"f1/d{i}" for i in range(12)}
    users = [line.split(":")[0] for line in auth.passwd.read_text().splitlines()]
    assert len([u for u in users if "+" not in u]) == 12  # and each one's connections:
    assert len(users) == 12 * 4  # +bundles, +trigger, +sparkplug
