"""A config reload while an operator's setting overrides `[constraints]` (docs/ota.md: kept in
`<state_dir>/settings.json`, over restarts and reloads). Found in a field run (2026-12-07):
`latency_ms = 15` written into the file and `systemctl reload` logged "config reloaded
(constraints and governor applied)" while the choice stayed "meeting p95 <= 20 ms", the
target an earlier `fleet send D1 set_latency_target ms=20` had set (and the coordinator's
desired state sends again at every boot). The start-up log says which overrides apply; the
reload must too, with what to send to change it, or the edit looks applied and is not."""

from __future__ import annotations

import json
import os
import signal

from support.daemon_harness import Serve, events, write_config
from support.waiting import wait


def test_a_reload_says_which_file_values_an_operator_setting_overrides(tmp_path):
    cfg = write_config(tmp_path, tmp_path / "cache", latency_ms=100.0)
    (tmp_path / "state").mkdir(parents=True, exist_ok=True)
    # what `set_latency_target ms=20` left, as the daemon writes it
    (tmp_path / "state" / "settings.json").write_text(json.dumps({"latency_ms": 20.0}))
    d = Serve(tmp_path, cfg)
    try:
        wait(d.ready, 120, "the daemon ready", d)
        cfg.write_text(cfg.read_text().replace("latency_ms = 100.0", "latency_ms = 15.0"))
        os.kill(d.proc.pid, signal.SIGHUP)
        wait(lambda: events(d.outbox, "config_reloaded"), 30, "the reload", d)
    finally:
        assert d.stop() == 0, d.text()[-3000:]
    said = [ln for ln in d.text().splitlines() if "config reloaded" in ln]
    assert said and "constraints.latency_ms" in said[-1] and "settings.json" in said[-1] \
        and "set_latency_target" in said[-1], said
    (ev,) = events(d.outbox, "config_reloaded")
    assert ev["overridden"] == {"latency_ms": {"file": 15.0, "in_force": 20.0}}, ev
