"""Review R4 of the broker ACL refresh (H26): identities.json is read as hostile input."""

from __future__ import annotations

import json

import pytest

from runtime.coordinator.enroll import refresh_acl
from runtime.telemetry.brokerauth import BrokerAuth, Identity


@pytest.mark.parametrize("edit", [
    # a username carrying ACL lines: grants `evil` every topic
    lambda d: d.update({"ops\nuser evil\ntopic readwrite #": {"role": "client",
                                                              "read": ["edgerun/v1/f/+/state"]}}),
    # a coordinator's fleet that is a wildcard: the coordinator reads every fleet's topics
    lambda d: d["coord"].update(fleets=["#"]),
    # a device "name" that is not fleet/device (an ACL-significant `+`)
    lambda d: d.update({"f/+": {"role": "device", "write": ["edgerun/v1/f/+/cmd"]}}),
    # a topic with a newline
    lambda d: d["coord"].update(read=["a\ntopic readwrite #"]),
    # fleets as a string (read letter by letter), a role that does not exist
    lambda d: d["coord"].update(fleets="f"),
    lambda d: d["coord"].update(role="root"),
])
def test_refresh_refuses_identities_enrol_would_refuse(tmp_path, edit):
    """Old code: `refresh_acl` (coordinator start, `edgerun fleet acl`) regenerated the ACL
    from whatever identities.json held, unchecked: a hand-edited, restored or planted file
    with ACL-significant characters (newlines, `#`, `+`) in a name widened what a user may
    read or write. Now every identity is checked as `enrol` checks it, and the ACL is left
    untouched, the file and identity named."""
    auth = BrokerAuth(tmp_path)
    auth.enrol(Identity("f/d1", "device"))
    auth.enrol(Identity("coord", "coordinator", fleets=("f",)))
    before = auth.acl.read_text()
    auth.acl.write_text(before.replace("bundle", "x"))  # out of date: a refresh would write
    stale = auth.acl.read_text()
    doc = json.loads(auth._registry.read_text())
    edit(doc)
    auth._registry.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="identities.json"):
        auth.refresh_acl()
    with pytest.raises(ValueError, match="identities.json"):
        refresh_acl(tmp_path)
    assert auth.acl.read_text() == stale
    assert "readwrite #" not in stale and "user evil" not in stale


def test_refresh_of_a_valid_registry_still_works(tmp_path):
    auth = BrokerAuth(tmp_path)
    auth.enrol(Identity("f/d1", "device"))
    auth.enrol(Identity("coord", "coordinator", fleets=("f",)))
    auth.enrol(Identity("ops", "client", read=("edgerun/v1/f/+/state",)))
    want = auth.acl.read_text()
    auth.acl.write_text("old\n")
    assert auth.refresh_acl() and auth.acl.read_text() == want
    assert not auth.refresh_acl()
