"""Client ids bound to identities (issue 25, item 3) on a real Mosquitto configured as edgerun
writes it (`use_username_as_clientid`): a device connecting with the coordinator's client id
gets its own session only and the coordinator stays connected; each extra connection of a
process is an identity of its own with exactly its topics."""

from __future__ import annotations

import json
import time

from support.mqtt_probe import Probe
from support.waiting import until

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.service import Coordinator
from runtime.wire.brokerauth import (
    BrokerAuth,
    Identity,
    acl_text,
    connection_username,
    passwd_text,
)


def test_the_acl_and_password_file_give_each_connection_its_own_identity(tmp_path):
    idents = [Identity("f/d1", "device", read=("plc/trigger",)),
              Identity("coord", "coordinator", fleets=("f",))]
    acl = acl_text(idents)
    blocks = {b.splitlines()[0]: b.splitlines()[1:] for b in acl.split("\n\n") if
              b.startswith("user ")}
    assert blocks["user f/d1+bundles"] == ["topic write edgerun/v1/f/d1/bundle/req",
                                           "topic read edgerun/v1/f/d1/bundle/chunk"]
    assert blocks["user f/d1+trigger"] == ["topic read plc/trigger"]
    assert blocks["user coord+bundles"] == ["topic read edgerun/v1/f/+/bundle/req",
                                            "topic write edgerun/v1/f/+/bundle/chunk"]
    text = passwd_text({i.username: i for i in idents}, {"f/d1": "$7$h1", "coord": "$7$h2"})
    assert text.splitlines() == ["coord:$7$h2", "coord+bundles:$7$h2", "f/d1:$7$h1",
                                 "f/d1+bundles:$7$h1", "f/d1+sparkplug:$7$h1",
                                 "f/d1+trigger:$7$h1"]
    assert connection_username("f/d1") == "f/d1"
    assert "use_username_as_clientid true" in BrokerAuth(tmp_path).conf_lines()


def test_an_older_password_file_gets_the_connections_usernames(tmp_path):
    auth = BrokerAuth(tmp_path)
    auth.enrol(Identity("f/d1", "device"), "pw")
    old = "".join(line + "\n" for line in auth.passwd.read_text().splitlines()
                  if "+" not in line.split(":")[0])  # as an older version wrote it
    auth.passwd.write_text(old)
    auth.refresh_acl()
    users = [line.split(":")[0] for line in auth.passwd.read_text().splitlines()]
    assert users == ["f/d1", "f/d1+bundles", "f/d1+sparkplug", "f/d1+trigger"]


def test_a_device_using_the_coordinators_client_id_gets_its_own_session_only(
        broker, tmp_path):
    coord = Coordinator(CoordinatorConfig(fleet="f", broker=broker.coordinator("f"),
                                          store=str(tmp_path / "c.db")))
    coord.start()
    probes = []
    try:
        assert coord.connected.wait(30)
        a_cfg = broker.device("f", "A")
        for _ in range(5):  # the attack: 15 connects in 20 s knocked it off 5 times
            # no reconnects: a dropped probe connecting again a second later took the
            # session back from the newest, whatever the broker did with the five
            p = Probe(broker.port, a_cfg, client_id=coord.cfg.client_id, reconnect=False)
            assert p.accepted  # logged in... as itself: its client id is f/A
            probes.append(p)
        # the coordinator was never taken over and still does its job: B's result is acked
        b = Probe(broker.port, broker.device("f", "B"), client_id="edgerun-f-B-x")
        probes.append(b)
        b.sub("edgerun/v1/f/B/ack")
        b.pub("edgerun/v1/f/B/result", json.dumps(
            {"v": 1, "stream": "s", "boot": "b1", "floor": 1,
             "results": [{"seq": 1, "t": time.time()}]}).encode())
        assert until(lambda: b.got, 30), "the coordinator did not ack B's result"
        assert json.loads(b.got[0][1])["seq"] == 1
        assert coord.counters["takeovers"] == 0 and coord.connected.is_set()
        assert coord.stats()["mqtt"]["takeovers"] == 0
        # the five connections of A took over one another (one session, A's own): all but
        # the last were disconnected by the broker
        assert until(lambda: all(p.disconnects for p in probes[:4]), 30)
        assert not probes[4].disconnects, [(len(p.connack), len(p.disconnects)) for p in probes]
    finally:
        for p in probes:
            p.close()
        coord.stop()


def test_a_connection_identity_is_confined_to_its_connections_topics(broker):
    broker.device("f", "A")
    auth = broker.auth
    # the bundle connection of A logs in with A's password and may only ask for chunks
    pw = broker.device("f", "A").password_file
    from runtime.config.telemetry import BrokerConfig

    bundles = BrokerConfig(username=connection_username("f/A", "bundles"), password_file=pw)
    watcher = Probe(broker.port, broker.coordinator("f"), client_id="w")
    watcher.sub("edgerun/v1/f/A/#")
    p = Probe(broker.port, bundles, client_id="ignored")
    assert p.accepted
    p.pub("edgerun/v1/f/A/result", b"forged")  # not this connection's topic: dropped
    p.pub("edgerun/v1/f/A/bundle/req", b"ask")
    assert until(lambda: watcher.got, 30)
    # one client's QoS 1 messages are delivered in order: the forged one, sent first, would
    # be here by now
    assert [t for t, _ in watcher.got] == ["edgerun/v1/f/A/bundle/req"]
    assert "user f/A+bundles" in auth.acl.read_text()
    p.close()
    watcher.close()
