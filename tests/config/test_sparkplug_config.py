"""The `[sparkplug]` section (runtime/config/sparkplug.py): ids that are Sparkplug topic
levels, and bounded knobs; a refusal names the key."""

from __future__ import annotations

import pytest

from runtime.config import ConfigError, from_dict


def test_the_section_is_off_by_default_and_takes_its_ids():
    assert not from_dict({}).sparkplug.enabled
    s = from_dict({"sparkplug": {"enabled": True, "group_id": "Line 1", "edge_node_id": "cam-3",
                                 "primary_host_id": "ignition"}}).sparkplug
    assert (s.group_id, s.edge_node_id, s.primary_host_id) == ("Line 1", "cam-3", "ignition")


@pytest.mark.parametrize("key,value", [
    ("group_id", "a/b"), ("edge_node_id", "node+1"), ("primary_host_id", "host#"),
    ("group_id", "tab\there"), ("edge_node_id", "x" * 257),
    ("score_deadband", -0.1), ("relative_deadband", float("inf")),
    ("max_births_per_minute", 0), ("max_command_bytes", 10), ("max_held_results", -1),
    ("data_interval_s", -0.1), ("data_interval_s", 61), ("data_interval_s", float("nan")),
    ("ok_labels", [""]),
])
def test_bad_values_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigError, match=f"sparkplug.{key}"):
        from_dict({"sparkplug": {key: value}})
