"""A device that goes silent: `stale`, then `offline`. The offline alert's raise delay
(coordinator.offline_alert_s) is for a will that says offline at once (a broker's restart);
after a silence already told as `stale` it left the receiver with no alert open."""

from __future__ import annotations

import time

from runtime.config.coordinator import CoordinatorConfig
from runtime.coordinator.service import Coordinator
from runtime.wire import payloads


def test_a_silent_device_has_an_alert_open_from_stale_through_offline(tmp_path):
    """Old code (stale 30 s, offline 120 s, alert_clear_s 30, offline_alert_s 60): stale
    raised at 30 s, its clear told at 150 s (offline replaced it at 120 s), offline told at
    180 s: for 30 s the webhook's receiver had nothing open for a device that was offline."""
    c = Coordinator(CoordinatorConfig(fleet="f", store=str(tmp_path / "c.db"),
                                      stale_after_s=30, offline_after_s=120, alert_clear_s=30,
                                      offline_alert_s=60))
    try:
        t0 = time.time()
        c._ingest([(payloads.topic("f", "d", "health"), payloads.encode("health", {
            "v": 1, "t": t0, "boot": "b"}), t0)])
        c._refresh(t0)
        open_: set[str] = set()
        gaps = []
        for s in range(1, 240):
            c._refresh(t0 + s)
            while c.alert_log and (b := c.alert_log.popleft()):
                (open_.add if b["state"] == "raised" else open_.discard)(b["alert"])
            if s > 31 and not open_:
                gaps.append(s)
        assert c.views["d"].status == "offline"
        assert gaps == [], f"no alert open at {gaps[0]}..{gaps[-1]} s of the silence"
        assert open_ == {"offline"}
    finally:
        c.stop()
