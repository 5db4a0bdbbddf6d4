"""`[modbus]` and `trigger = "modbus"`: loopback unless allowed, the map's bounds, the key named."""

from __future__ import annotations

import pytest

from runtime.config import ConfigError, from_dict


def test_off_by_default_and_on_loopback():
    assert from_dict({}).modbus.enabled is False
    c = from_dict({"modbus": {"enabled": True}}).modbus
    assert (c.host, c.port, c.unit_id, c.max_connections) == ("127.0.0.1", 5020, 1, 8)


@pytest.mark.parametrize(("section", "match"), [
    ({"enabled": True, "host": "0.0.0.0"}, r"modbus.allow_remote.*no login.*0\.0\.0\.0"),
    ({"enabled": True, "host": "192.168.1.20", "port": 502}, r"allow_remote.*192\.168\.1\.20:502"),
    ({"port": -1}, "modbus.port"),
    ({"host": "a b"}, "modbus.host"),
    ({"unit_id": 0}, "modbus.unit_id"),
    ({"unit_id": 248}, "modbus.unit_id"),
    ({"max_connections": 0}, "modbus.max_connections"),
    ({"max_connections": 65}, "modbus.max_connections"),
    ({"coil_base": 65536}, "modbus.coil_base"),
    ({"register_base": -1}, "modbus.register_base"),
    ({"max_pending": 0}, "modbus.max_pending"),
    ({"ok_labels": []}, "modbus.ok_labels"),
    ({"classes": ["ok", "ok"]}, "modbus.classes"),
    ({"classes": ["ok", ""]}, "modbus.classes"),
    ({"unit": 1}, "modbus.unit"),  # unknown key
])
def test_bad_sections_are_refused_naming_the_key(section, match):
    with pytest.raises(ConfigError, match=match):
        from_dict({"modbus": section})


def test_a_remote_bind_must_be_allowed_explicitly():
    c = from_dict({"modbus": {"enabled": True, "host": "0.0.0.0", "allow_remote": True}}).modbus
    assert c.allow_remote and c.host == "0.0.0.0"


def test_a_modbus_trigger_needs_the_server_and_the_blocks_must_fit():
    with pytest.raises(ConfigError, match=r"needs \[modbus\] enabled"):
        from_dict({"source": {"kind": "synthetic", "trigger": "modbus"}})
    two = [{"name": n, "kind": "synthetic", "trigger": "modbus"} for n in ("a", "b")]
    cfg = from_dict({"sources": two, "modbus": {"enabled": True, "register_base": 65504}})
    assert [s.trigger for s in cfg.sources] == ["modbus", "modbus"]
    with pytest.raises(ConfigError, match=r"modbus.register_base.*2 sources"):
        from_dict({"sources": two, "modbus": {"enabled": True, "register_base": 65505}})
    with pytest.raises(ConfigError, match=r"modbus.coil_base"):
        from_dict({"sources": two, "modbus": {"enabled": True, "coil_base": 65535}})
    mixed = [{"name": "a", "kind": "synthetic", "trigger": "opcua"},
             {"name": "b", "kind": "capture", "path": "0", "trigger": "modbus"}]
    cfg = from_dict({"sources": mixed, "modbus": {"enabled": True}, "opcua": {"enabled": True}})
    assert [s.trigger for s in cfg.sources] == ["opcua", "modbus"]
