"""Review R3: `edgerun fleet enroll` must not hand out the fleet's identities or topics."""

from __future__ import annotations

import pytest

from runtime.cli import main
from runtime.telemetry.brokerauth import BrokerAuth


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
