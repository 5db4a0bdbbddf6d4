"""A broker directory made by an older version (its ACL without the bundle topics of bundles
over MQTT) is brought up to date when the coordinator (`coordinator.broker_dir`) or the
broker it belongs to starts: atomically, its mode kept, logged; then, on a real Mosquitto, a
device can ask for and receive bundle chunks on its own topics and still not on another's."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from support.mqtt_probe import Probe
from support.waiting import until

from runtime.config.telemetry import BrokerConfig
from runtime.wire.brokerauth import BrokerAuth, Identity, acl_text, write_secret


def old_broker_dir(workdir: Path) -> dict[str, BrokerConfig]:
    """`workdir/broker-auth` (Mosquitto's layout) enrolled with devices f/d1, f/d2 and
    coordinator `coord`, its ACL as an older version wrote it (no bundle lines), mode 0640.
    Returns the logins (port 0: set by the caller)."""
    auth = BrokerAuth(workdir / "broker-auth")
    logins = {}
    for ident in (Identity("f/d1", "device"), Identity("f/d2", "device"),
                  Identity("coord", "coordinator", fleets=("f",))):
        pw = write_secret(workdir / "creds" / ident.username.replace("/", "_"),
                          auth.enrol(ident))
        logins[ident.username] = BrokerConfig(username=ident.username, password_file=str(pw))
    text = acl_text(list(auth.identities().values()))
    old = "".join(line + "\n" for line in text.splitlines() if "bundle" not in line)
    assert old != text
    auth.acl.write_text(old)
    os.chmod(auth.acl, 0o640)
    return logins


def _bundle_topics_work(port: int, logins: dict[str, BrokerConfig]) -> None:
    coord = Probe(port, logins["coord"], "coord")
    d1 = Probe(port, logins["f/d1"], "d1")
    try:
        assert coord.accepted and d1.accepted
        coord.sub("edgerun/v1/f/+/bundle/req")
        d1.sub("edgerun/v1/f/d1/bundle/chunk")
        d1.sub("edgerun/v1/f/d2/bundle/chunk")  # another device's: must never arrive
        d1.pub("edgerun/v1/f/d1/bundle/req", b"mine")
        d1.pub("edgerun/v1/f/d2/bundle/req", b"forged")
        coord.pub("edgerun/v1/f/d1/bundle/chunk", b"chunk-1")
        coord.pub("edgerun/v1/f/d2/bundle/chunk", b"chunk-2")
        # a last allowed message from each: the broker passes one client's messages on in
        # the order it sent them, so once it arrives anything let through before it has
        # arrived too (was: 0.5 s of waiting, which a loaded host could outlast)
        d1.pub("edgerun/v1/f/d1/bundle/req", b"end")
        coord.pub("edgerun/v1/f/d1/bundle/chunk", b"end")
        assert until(lambda: len(coord.got) >= 2 and len(d1.got) >= 2, 30), (coord.got,
                                                                            d1.got)
        assert coord.got == [("edgerun/v1/f/d1/bundle/req", b"mine"),
                             ("edgerun/v1/f/d1/bundle/req", b"end")]
        assert d1.got == [("edgerun/v1/f/d1/bundle/chunk", b"chunk-1"),
                          ("edgerun/v1/f/d1/bundle/chunk", b"end")]
    finally:
        coord.close()
        d1.close()


def test_the_coordinator_brings_an_old_acl_up_to_date_at_start(tmp_path, caplog):
    """Old code: the ACL stayed without the bundle lines until a device was enrolled again,
    and the broker silently dropped every bundle chunk request (the device's
    `bundle/req` never reached the coordinator)."""
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator
    from runtime.wire.broker import Mosquitto

    logins = old_broker_dir(tmp_path)
    acl = tmp_path / "broker-auth" / "acl"
    inode = acl.stat().st_ino
    caplog.set_level(logging.WARNING, "edgerun.brokerauth")
    c = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "store.db"),
                                      broker_dir=str(tmp_path / "broker-auth")))
    c.start()
    try:
        assert "bundle/req" in acl.read_text() and "bundle/chunk" in acl.read_text()
        assert stat.S_IMODE(acl.stat().st_mode) == 0o640  # kept
        assert acl.stat().st_ino != inode  # replaced (renamed over), not written in place
        assert "broker ACL" in caplog.text and "was out of date" in caplog.text
        # the 3 bundle lines, and the blocks of the +bundles connection identities (3 lines
        # each for f/d1, f/d2 and coord, one of coord's the same as a line of its own block)
        assert "11 lines added" in caplog.text, caplog.text
    finally:
        c.stop()
    # the broker (started on that directory now) lets each device use its bundle topics
    broker = Mosquitto(tmp_path).start()
    try:
        _bundle_topics_work(broker.port, logins)
    finally:
        broker.stop()
    # a second start finds nothing to do: nothing logged, the file untouched
    caplog.clear()
    inode = acl.stat().st_ino
    assert BrokerAuth(tmp_path / "broker-auth").refresh_acl() is False
    assert acl.stat().st_ino == inode and "broker ACL" not in caplog.text


def test_a_broker_started_on_an_old_directory_brings_it_up_to_date(tmp_path, caplog):
    """The broker the tests and `edgerun demo` start (runtime/wire/broker.py) owns its
    directory: an old one is refreshed before Mosquitto reads it."""
    from runtime.wire.broker import Mosquitto

    logins = old_broker_dir(tmp_path)
    caplog.set_level(logging.WARNING, "edgerun.brokerauth")
    broker = Mosquitto(tmp_path).start()
    try:
        _bundle_topics_work(broker.port, logins)
        assert "was out of date" in caplog.text
    finally:
        broker.stop()


def test_fleet_acl_command(tmp_path, capsys):
    from runtime.cli import main

    old_broker_dir(tmp_path)
    d = str(tmp_path / "broker-auth")
    assert main(["fleet", "acl", "--broker-dir", d]) == 0
    assert "rewrote" in capsys.readouterr().out
    assert main(["fleet", "acl", "--broker-dir", d]) == 0
    assert "is up to date" in capsys.readouterr().out
    # an ACL edgerun did not generate (no identities.json) is never touched
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "acl").write_text("user admin\ntopic readwrite #\n")
    assert main(["fleet", "acl", "--broker-dir", str(tmp_path / "other")]) == 2
    assert (tmp_path / "other" / "acl").read_text() == "user admin\ntopic readwrite #\n"


def test_a_broken_broker_directory_never_stops_the_coordinator(tmp_path, caplog):
    from runtime.config.coordinator import CoordinatorConfig
    from runtime.coordinator.service import Coordinator

    old_broker_dir(tmp_path)
    registry = tmp_path / "broker-auth" / "identities.json"
    registry.write_text('{"f/d1": {"fleets": []}}')  # no role
    before = (tmp_path / "broker-auth" / "acl").read_text()
    c = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "store.db"),
                                      broker_dir=str(tmp_path / "broker-auth")))
    caplog.set_level(logging.ERROR, "edgerun.coordinator")
    c.start()
    try:
        assert c.threads_alive()["ingest"]
        assert "could not bring the broker ACL" in caplog.text
        assert "identities.json: not a list of identities (KeyError" in caplog.text
        assert (tmp_path / "broker-auth" / "acl").read_text() == before
    finally:
        c.stop()
