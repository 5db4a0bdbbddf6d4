"""Review R3: state files the daemon reads at start-up never stop it starting."""

from __future__ import annotations

import math

from runtime import control_store


def test_a_deeply_nested_control_state_is_moved_aside_not_a_crash_loop(tmp_path):
    """json.loads raises RecursionError (not ValueError) on deep nesting: it escaped load()
    and `serve` died at every start."""
    path = tmp_path / "control.json"
    path.write_text("[" * 100_000)
    assert control_store.load(path) == (None, math.inf)
    assert (tmp_path / "control.json.bad").exists() and not path.exists()
