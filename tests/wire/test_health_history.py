"""The device's health history file (runtime/wire/health_history.py) as a hostile state
directory sees it."""

from __future__ import annotations

import time

from runtime.wire.health_history import NAME, HealthHistory, read


def test_a_symlink_planted_as_the_history_is_not_followed(tmp_path):
    """The history was opened with a plain append: a symlink planted in its place made the
    daemon append its health lines to whatever file the link named (as root: any file on
    the box). Refused like every other state file (runtime/durable.py refuses planted
    links): the target is untouched, the append counted as an error, and once the link is
    gone the history is written again."""
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    state = tmp_path / "state"
    state.mkdir()
    (state / NAME).symlink_to(victim)
    hist = HealthHistory(state)
    hist.append({"t": time.time(), "temp_c": 50.0})
    assert victim.read_text() == "keep me\n"
    assert hist.errors == 1
    (state / NAME).unlink()
    hist.append({"t": time.time(), "temp_c": 51.0})
    assert [r["temp_c"] for r in read(state)] == [51.0]
