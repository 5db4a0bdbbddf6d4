"""`[opcua]` and `trigger = "opcua"`: loopback-only without security, what security needs."""

from __future__ import annotations

import pytest

from runtime.config import ConfigError, from_dict
from runtime.config.opcua import is_loopback


@pytest.mark.parametrize(("host", "loop"), [
    ("127.0.0.1", True), ("127.3.4.5", True), ("::1", True), ("[::1]", True),
    ("localhost", True), ("0.0.0.0", False), ("::", False), ("192.168.1.20", False),
    ("plc-gw.local", False)])
def test_loopback_means_this_box_only(host, loop):
    assert is_loopback(host) is loop


def test_off_by_default_and_on_loopback_without_security():
    assert from_dict({}).opcua.enabled is False
    c = from_dict({"opcua": {"enabled": True, "port": 4841}}).opcua
    assert (c.host, c.port, c.security, c.max_sessions) == ("127.0.0.1", 4841, "none", 50)


@pytest.mark.parametrize(("section", "match"), [
    ({"enabled": True, "host": "0.0.0.0"}, r"opcua.security.*only on loopback.*0\.0\.0\.0"),
    ({"enabled": True, "host": "10.0.0.5"}, "basic256sha256"),
    ({"security": "basic256sha256", "username": "plc", "password_file": "/p"},
     "certificate and private_key"),
    ({"security": "basic256sha256", "certificate": "c", "private_key": "k"}, "needs a login"),
    ({"security": "basic256sha256", "certificate": "c", "private_key": "k",
      "username": "plc"}, "go together"),
    ({"username": "plc", "password_file": "/p"}, "takes no login"),
    ({"security": "aes"}, "security"),
    ({"port": 70000}, "port"),
    ({"max_sessions": 0}, "max_sessions"),
    ({"ok_labels": []}, "ok_labels"),
])
def test_bad_sections_are_refused_naming_the_key(section, match):
    with pytest.raises(ConfigError, match=match):
        from_dict({"opcua": section})


def test_basic256sha256_on_the_network_is_accepted():
    c = from_dict({"opcua": {"enabled": True, "host": "0.0.0.0", "security": "basic256sha256",
                             "certificate": "c.der", "private_key": "k.pem",
                             "trusted_certs": "/etc/edgerun/plc-certs"}}).opcua
    assert c.security == "basic256sha256"


def test_a_plc_trigger_needs_the_server_and_a_camera():
    with pytest.raises(ConfigError, match=r"needs \[opcua\] enabled"):
        from_dict({"source": {"kind": "synthetic", "trigger": "opcua"}})
    with pytest.raises(ConfigError, match="kind must be 'synthetic', 'capture' or 'pylon'"):
        from_dict({"source": {"kind": "folder", "path": "/x", "trigger": "opcua"},
                   "opcua": {"enabled": True}})
    cfg = from_dict({"sources": [{"name": "a", "kind": "synthetic", "trigger": "opcua"}],
                     "opcua": {"enabled": True}})
    assert cfg.sources[0].trigger == "opcua"
