"""The OPC UA address space's pure rules: the write check, edges, verdicts, health values."""

from __future__ import annotations

import math

import pytest

from runtime.telemetry.opcua_view import (
    check_write,
    device_values,
    rising,
    source_values,
    to_show,
    verdict,
)


@pytest.mark.parametrize(("path", "type_name", "value", "want"), [
    ("PartPresent", "Boolean", True, None),
    ("PartPresent", "Boolean", False, None),
    ("PartPresent", "Int32", 1, "BadTypeMismatch"),
    ("PartPresent", "String", "true", "BadTypeMismatch"),
    ("PartPresent", "Boolean", 1, "BadTypeMismatch"),  # a mislabelled variant
    ("PartPresent", "Boolean", [True], "BadTypeMismatch"),
    ("LastResult.Verdict", "String", "OK", "BadNotWritable"),
    ("Counts.Results", "UInt64", 0, "BadNotWritable"),
    ("", "Boolean", True, "BadNotWritable"),
])
def test_only_part_present_is_writable_and_only_as_a_boolean(path, type_name, value, want):
    assert check_write(path, type_name, value) == want


@pytest.mark.parametrize(("old", "new", "edge"), [
    (False, True, True), (True, True, False), (True, False, False), (False, False, False)])
def test_an_edge_is_false_to_true_only(old, new, edge):
    assert rising(old, new) is edge


def test_verdict_is_ok_for_the_configured_labels_only():
    assert verdict("ok", ("ok", "none")) == ("OK", True)
    assert verdict("none", ("ok", "none")) == ("OK", True)
    assert verdict("scratch", ("ok", "none")) == ("NOK", False)
    assert verdict("OK", ("ok",)) == ("NOK", False)  # labels are exact


def test_source_values_take_the_rung_of_the_model_the_source_runs():
    h = {"model": "inspection", "choice": "a", "rung": 5, "rungs": 5,
         "models": [{"model": "inspection", "rung": 5, "rungs": 5, "sources": ["a"]},
                    {"model": "defects", "rung": 2, "rungs": 3, "sources": ["b"]}],
         "pipeline": {"sources": {"b": {"state": "running", "rate_hz": 2.0,
                                        "e2e_p95_ms": None, "model": "defects",
                                        "variant": "d1"}}}}
    v = source_values(h, "b")
    assert (v["Model"], v["Variant"], v["Rung"], v["Rungs"]) == ("defects", "d1", 2, 3)
    assert v["Health.State"] == "running" and v["Health.RateHz"] == 2.0
    assert math.isnan(v["Health.E2eP95Ms"])  # null: NaN (a Double has no null)
    # a source health does not know yet: the [model]'s rung, empty state
    v = source_values({"model": "inspection", "rung": 4, "rungs": 5}, "main")
    assert (v["Model"], v["Rung"], v["Health.State"]) == ("inspection", 4, "")


def test_device_values_from_health():
    v = device_values({"temp_c": 61.0, "throttled": True, "governor": {"level": 2},
                       "uptime_s": 3.5}, 7)
    assert v == {"Device.TempC": 61.0, "Device.Throttled": True, "Device.GovernorLevel": 2,
                 "Device.UptimeS": 3.5, "Device.Sessions": 7}
    assert math.isnan(device_values({}, 0)["Device.TempC"])


@pytest.mark.parametrize(("sources", "want"), [
    ([], []),
    (["cam2"], [True]),
    (["cam2", "cam2", "cam2"], [False, False, True]),  # free-running: the newest only
    (["main", "main", "main"], [True, True, True]),  # PLC-triggered: every verdict
    (["cam2", "main", "cam2", "cam3", "main"], [False, True, True, True, True]),
])
def test_a_backlog_shows_every_triggered_verdict_and_the_newest_of_the_rest(sources, want):
    assert to_show(sources, {"main"}) == want
