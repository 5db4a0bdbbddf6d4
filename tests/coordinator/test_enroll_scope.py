"""Review R3: `edgerun fleet enroll` must not hand out the fleet's identities or topics."""

from __future__ import annotations

import pytest

from runtime.cli import main
from runtime.wire.brokerauth import BrokerAuth


def _enroll(tmp_path, *args: str) -> int:
    return main(["fleet", "enroll", *args, "--fleet", "f", "--broker-dir",
                 str(tmp_path / "bd"), "--out", str(tmp_path / "out" / args[-1])])


def test_a_client_named_like_the_coordinator_does_not_replace_it(tmp_path, capsys):
    """`enroll --role client coordinator` replaced the coordinator's password and its ACL
    with the camera's one topic: after the broker's reload the fleet had no coordinator."""
    assert _enroll(tmp_path, "--role", "coordinator", "coordinator") == 0
    acl = (tmp_path / "bd" / "acl").read_text()
    passwd = (tmp_path / "bd" / "passwd").read_text()
    capsys.readouterr()
    assert _enroll(tmp_path, "--role", "client", "--write", "plc/x", "coordinator") == 2
    err = capsys.readouterr().err
    assert "'coordinator' is already enrolled as a coordinator" in err
    assert "edgerun fleet revoke coordinator" in err
    assert (tmp_path / "bd" / "acl").read_text() == acl
    assert (tmp_path / "bd" / "passwd").read_text() == passwd
    # the same role again is still a re-enrolment (a new password), as before
    assert _enroll(tmp_path, "--role", "coordinator", "coordinator") == 0
    assert BrokerAuth(tmp_path / "bd").identities()["coordinator"].role == "coordinator"


@pytest.mark.parametrize("topic", ["#", "edgerun/#", "edgerun/v1/f/+/result",
                                   "+/v1/+/+/ack", "edgerun/v1/f/box1/health"])
def test_a_client_cannot_be_given_write_on_the_fleets_topics(tmp_path, capsys, topic):
    """A camera with `--write '#'` could publish results, health and acks as any device."""
    assert _enroll(tmp_path, "--role", "client", "--write", topic, "cam1") == 2
    assert "reaches the fleet's own topics" in capsys.readouterr().err
    assert "cam1" not in BrokerAuth(tmp_path / "bd").identities()


def test_own_topics_and_reading_the_fleet_stay_possible(tmp_path):
    """A trigger camera writes its own topic; Node-RED reads every device's result/each
    (docs/homeassistant.md): both as before."""
    assert _enroll(tmp_path, "--role", "client", "--write", "plc/line1/trigger", "cam1") == 0
    assert _enroll(tmp_path, "--role", "client", "--read", "edgerun/v1/+/+/result/each",
                   "nodered") == 0
    acl = (tmp_path / "bd" / "acl").read_text()
    assert "topic write plc/line1/trigger" in acl
    assert "topic read edgerun/v1/+/+/result/each" in acl


def test_a_client_an_older_version_enrolled_with_the_fleets_topics_can_be_revoked(tmp_path,
                                                                                  capsys):
    """A camera enrolled by an older version with `--write 'edgerun/#'` is refused now, and
    the refusal says to remove it; `edgerun fleet revoke` itself refused (it read every
    identity through the same check), so the only way out was editing identities.json by
    hand. Each is revoked now (a revocation only narrows the ACL), one at a time."""
    import json

    bd = tmp_path / "bd"
    assert _enroll(tmp_path, "--role", "client", "--write", "plc/x", "cam1") == 0
    assert _enroll(tmp_path, "--role", "client", "--write", "plc/y", "cam2") == 0
    reg = bd / "identities.json"
    doc = json.loads(reg.read_text())
    doc["cam1"]["write"] = ["edgerun/#"]  # as the older version wrote it
    doc["cam2"]["write"] = ["#"]
    reg.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["fleet", "revoke", "--role", "client", "cam1", "--broker-dir", str(bd)]) == 0, \
        capsys.readouterr().err
    assert "cam1" not in json.loads(reg.read_text())
    assert "cam1" not in (bd / "passwd").read_text()
    assert "cam1" not in (bd / "acl").read_text() and "cam2" in (bd / "acl").read_text()
    with pytest.raises(ValueError, match="'cam2' is not an identity"):
        BrokerAuth(bd).identities()  # the other is still refused, until revoked too
    assert main(["fleet", "revoke", "--role", "client", "cam2", "--broker-dir", str(bd)]) == 0
    assert BrokerAuth(bd).identities() == {}
    assert "edgerun/#" not in (bd / "acl").read_text()


def test_a_revocation_still_refuses_a_hand_edited_identity_that_would_inject_acl_lines(
        tmp_path):
    """Revoking skips only the write-topic rule older versions lacked: a name or topic no
    enrolment ever wrote (a newline: an ACL line of its own) still stops it."""
    import json

    bd = tmp_path / "bd"
    assert _enroll(tmp_path, "--role", "client", "--write", "plc/x", "cam1") == 0
    assert _enroll(tmp_path, "--role", "client", "--write", "plc/y", "cam2") == 0
    reg = bd / "identities.json"
    doc = json.loads(reg.read_text())
    doc["cam2"]["read"] = ["plc/y\ntopic readwrite #"]
    reg.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="'cam2' is not an identity"):
        BrokerAuth(bd).remove("cam1")
    assert "topic readwrite #" not in (bd / "acl").read_text()
