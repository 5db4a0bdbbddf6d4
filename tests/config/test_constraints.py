"""`[constraints]` is one type with one rule per number (runtime/config/constraints.py): the
config, the operator's commands (runtime/wire/commands.py), the saved overrides
(runtime/device/operator_state.py) and the selector accept the same values, and each
refusal names the key."""

from __future__ import annotations

import json
import logging
import math

import pytest

from runtime import config
from runtime.choice import selector
from runtime.config.constraints import (
    Constraints,
    accuracy_floor_problem,
    latency_target_problem,
)
from runtime.config.schema import ConfigError, to_dict
from runtime.device import operator_state
from runtime.wire.commands import CommandRefused, check_args

LATENCIES = [0.05, 0.1, 20, 20.5, 60_000, 60_000.5, 0, -5, math.inf, math.nan, 1e300]
FLOORS = [0.0, 0.5, 1, 1.01, -0.1, math.nan]


def _config_says(key: str, value: object) -> str | None:
    try:
        config.from_dict({"constraints": {key: value}}, source="edgerun.toml")
    except ConfigError as e:
        return str(e)
    return None


def _command_says(cmd: str, arg: str, value: object) -> str | None:
    try:
        check_args(cmd, {arg: value})
    except CommandRefused as e:
        return str(e)
    return None


def _saved_override_says(tmp_path, caplog, key: str, value: object) -> str | None:
    (tmp_path / operator_state.SETTINGS_FILE).write_text(json.dumps({key: value}))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edgerun.operator_state"):
        kept = operator_state.load_settings(tmp_path)
    return None if kept == {key: value} else caplog.text


@pytest.mark.parametrize("ms", LATENCIES)
def test_every_reader_of_a_latency_target_applies_the_one_rule(ms, tmp_path, caplog):
    ok = latency_target_problem(ms) is None
    assert ok == (0 < ms <= 60_000)  # nan compares false: refused
    said = {"latency_ms": _config_says("latency_ms", ms),
            "end_to_end_ms": _config_says("end_to_end_ms", ms),
            "ms": _command_says("set_latency_target", "ms", ms),
            "saved latency_ms": _saved_override_says(tmp_path, caplog, "latency_ms", ms)}
    for who, why in said.items():
        assert (why is None) == ok, (who, why)
    if not ok:  # each refusal names its key (nan and inf: refused by the schema, as a type)
        rule = ": must be > 0" if math.isfinite(ms) else ": expected a"
        assert "key 'constraints.latency_ms'" + rule in said["latency_ms"]
        assert "key 'constraints.end_to_end_ms'" + rule in said["end_to_end_ms"]
        assert "set_latency_target: ms: must be > 0: expected a number" in said["ms"]
        assert "latency_ms: must be > 0" in said["saved latency_ms"]


@pytest.mark.parametrize("floor", FLOORS)
def test_every_reader_of_an_accuracy_floor_applies_the_one_rule(floor, tmp_path, caplog):
    ok = accuracy_floor_problem(floor) is None
    assert ok == (0.0 <= floor <= 1.0)
    said = {"config": _config_says("accuracy_floor", floor),
            "command": _command_says("set_accuracy_floor", "value", floor),
            "saved": _saved_override_says(tmp_path, caplog, "accuracy_floor", floor)}
    for who, why in said.items():
        assert (why is None) == ok, (who, why)
    if not ok:
        rule = ": must be within 0..1" if math.isfinite(floor) else ": expected a number"
        assert "key 'constraints.accuracy_floor'" + rule in said["config"]
        assert "set_accuracy_floor: value: must be within 0..1" in said["command"]
        assert "accuracy_floor: must be within 0..1" in said["saved"]


@pytest.mark.parametrize("value", [True, "5", None])
def test_a_target_that_is_no_number_is_refused_by_each(value):
    assert latency_target_problem(value) is not None
    assert _command_says("set_latency_target", "ms", value) is not None
    assert _config_says("latency_ms", value) is not None


def test_the_selector_judges_by_the_type_the_config_reads():
    assert selector.Constraints is Constraints is type(config.Config().constraints)


@pytest.mark.parametrize("key", ["frame", "rate_hz"])
def test_what_the_device_measures_is_no_key_of_the_section(key):
    """`frame` and `rate_hz` are set by the device where it hands the constraints to the
    selector; a file naming them is a typo, refused like any unknown key."""
    why = _config_says(key, 1.0)
    assert why is not None and f"key 'constraints.{key}': unknown key" in why
    assert key not in to_dict(Constraints())
