"""Review R3: state files the daemon reads at start-up never stop it starting."""

from __future__ import annotations

import math

from runtime.device import operator_state


def test_a_deeply_nested_control_state_is_moved_aside_not_a_crash_loop(tmp_path):
    """json.loads raises RecursionError (not ValueError) on deep nesting: it escaped load()
    and `serve` died at every start."""
    path = tmp_path / "control.json"
    path.write_text("[" * 100_000)
    assert operator_state.load_control(path) == (None, math.inf)
    assert (tmp_path / "control.json.bad").exists() and not path.exists()


DEEP = "[" * 100_000


def test_a_deeply_nested_operator_settings_file_is_moved_aside(tmp_path):
    from runtime.device import operator_state

    (tmp_path / operator_state.SETTINGS_FILE).write_text(DEEP)
    assert operator_state.load_settings(tmp_path) == {}


def test_a_deeply_nested_model_pointer_is_moved_aside(tmp_path):
    from runtime.ota.model_store import ModelStore

    store = ModelStore(tmp_path)
    store.pointer.parent.mkdir(parents=True, exist_ok=True)
    store.pointer.write_text(DEEP)
    assert store.read()["current"] is None  # the configured model is served
    assert not store.pointer.exists()


def test_a_deeply_nested_replay_record_is_moved_aside_and_says_so(tmp_path):
    from runtime.telemetry.sidecar import Sidecar

    path = tmp_path / "outbox.db.keep.json"
    path.write_text(DEEP)
    side = Sidecar(path, lost_history=False)
    assert "unreadable" in side.problem and side.not_before > 0  # older commands refused
    assert list(tmp_path.glob("outbox.db.keep.json.corrupt-*"))


def test_a_model_pointer_with_fields_of_the_wrong_type_is_moved_aside(tmp_path):
    """{"current": 5} or {"probation": "x"} passed the version check and raised TypeError /
    AttributeError in the daemon's start-up, at every start."""
    import json

    from runtime.ota.model_store import VERSION, ModelStore

    store = ModelStore(tmp_path)
    for bad in ({"current": 5}, {"probation": "x"}, {"rejected": [1]}, {"previous": {}}):
        store.pointer.write_text(json.dumps({"v": VERSION, **bad}))
        assert store.read()["current"] is None
        assert not store.pointer.exists()
