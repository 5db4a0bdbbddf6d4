"""The coordinator's log lines for alert transitions, as an operator reads them."""

from __future__ import annotations

import logging

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator import fleet
from runtime.coordinator.service import Coordinator


def test_a_cleared_alert_says_what_it_was_raised_for(tmp_path, caplog):
    """An outside run read "device d: alert offline cleared: device is offline": the clear
    carried the raise's message as if it were the state now."""
    c = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db"),
                                      alert_clear_s=0))
    try:
        now = 1_000_000.0
        c.views = {"d": fleet.on_state(fleet.DeviceView("d"),
                                       {"v": 1, "online": True, "boot": "b", "t": now}, now)}
        with caplog.at_level(logging.INFO, "edgerun.coordinator"):
            c._refresh(now + 60)  # silent a minute: stale
            c.views = {"d": fleet.on_activity(c.views["d"], now + 61)}  # heard again
            c._refresh(now + 62)
        lines = [r.getMessage() for r in caplog.records if "alert" in r.getMessage()]
        assert lines[0].startswith("device d: alert stale raised: "), lines
        assert lines[1].startswith("device d: alert stale cleared (raised for: "), lines
        assert len(lines) == 2, lines
    finally:
        c.store.close()
