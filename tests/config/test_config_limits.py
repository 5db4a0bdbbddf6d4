"""Review R3: config values that validated but broke the daemon or the coordinator."""

from __future__ import annotations

import pytest

from runtime.config import ConfigError, load


@pytest.mark.parametrize("section,key,value", [
    ("constraints", "latency_ms", "nan"),        # ready, then a traceback at the first health
    ("telemetry", "health_interval_s", "nan"),   # one health message, then none, silently
    ("governor", "tick_s", "inf"),
    ("source", "rate_hz", "nan"),
    ("coordinator", "keep_health_s", "inf"),
    ("profiler", "time_budget_s", "-inf"),
])
def test_nan_and_inf_are_refused_naming_file_line_and_key(tmp_path, section, key, value):
    cfg = tmp_path / "e.toml"
    cfg.write_text(f"# comment\n[{section}]\n{key} = {value}\n")
    with pytest.raises(ConfigError) as e:
        load(cfg)
    assert f"e.toml:3: key '{section}.{key}': expected a finite number, got {value}" in str(e.value)


@pytest.mark.parametrize("section,key,value,why", [
    ("source", "size", "0", "must be 1..1024 pixels"),       # the capture thread died
    ("source", "size", "-1", "must be 1..1024 pixels"),
    ("source", "size", "5000", "must be 1..1024 pixels"),    # 19 GB of pool
    ("telemetry", "max_command_bytes", "-1", "must be 1024..1048576"),  # every command refused
    ("telemetry", "clock_skew_s", "-1", "must be >= 0"),     # every command "in the future"
    ("coordinator", "keep_health_s", "0", "must be >= 60 s"),  # pruned every health message
    ("coordinator", "keep_events_s", "-1", "must be >= 60 s"),  # and every event
    ("coordinator", "future_skew_s", "-1", "must be >= 0"),
    ("coordinator", "stale_after_s", "0", "must be > 0"),
    # named telemetry.ack_timeout_s, a key the file did not set
    ("telemetry", "health_interval_s", "-1", "must be > 0"),
    ("governor", "rate_hz", "-1", "must be >= 0"),  # named governor.tick_s
    # the main thread spun a core (100 % CPU) and starved the refinement
    ("governor", "tick_s", "1e-9", "must be >= 0.01 s"),
])
def test_values_that_broke_a_thread_or_stored_data_are_refused(tmp_path, section, key, value,
                                                               why):
    cfg = tmp_path / "e.toml"
    cfg.write_text(f"[{section}]\n{key} = {value}\n")
    with pytest.raises(ConfigError) as e:
        load(cfg)
    assert f"e.toml:2: key '{section}.{key}': {why}" in str(e.value)


def test_the_bounds_keep_what_the_docs_and_tests_use(tmp_path):
    cfg = tmp_path / "e.toml"
    cfg.write_text("[source]\nsize = 192\n[telemetry]\nmax_command_bytes = 8192\n"
                   "clock_skew_s = 0\n[coordinator]\nkeep_health_s = 3600\nstale_after_s = 1\n"
                   "offline_after_s = 2\n")
    c = load(cfg)
    assert c.source.size == 192 and c.coordinator.keep_health_s == 3600


@pytest.mark.parametrize("section,key,value", [
    # each was checked together with another key and named that one (the first of the pair),
    # without a line: a reader looked for a key the file did not set (found in the field,
    # 2026-12-07: `read_timeout_s = -1` read "key 'source.open_timeout_s'")
    ("source", "read_timeout_s", "-1"),
    ("telemetry.outbox", "retry_s", "0"),
    ("telemetry.outbox", "spill_bytes", "10"),
    ("telemetry.outbox", "event_keep", "0"),
    ("telemetry", "batch_max", "0"),
    ("coordinator", "max_store_mb", "-1"),
    ("models", "min_free_mb", "-1"),
    ("models", "shadow_every", "0"),
    ("models", "crash_boots", "0"),
    ("models", "mqtt_window", "0"),
    ("models", "mqtt_timeout_s", "0"),
    ("models", "max_error_rate_increase", "-1"),
    ("sleep", "per_hour", "-1"),
    ("sleep", "burst", "0"),
    ("sleep", "deliver_s", "-1"),
    ("sleep", "flush_timeout_s", "-1"),
])
def test_the_key_set_wrong_is_the_one_named_with_its_line(tmp_path, section, key, value):
    cfg = tmp_path / "e.toml"
    extra = 'kind = "capture"\npath = "rtsp://x/y"\n' if section == "source" else ""
    cfg.write_text(f"[{section}]\n{key} = {value}\n{extra}")
    with pytest.raises(ConfigError) as e:
        load(cfg)
    assert f"e.toml:2: key '{section}.{key}': " in str(e.value)
    assert value in str(e.value).split(": ", 2)[-1]  # the value it refused, said


@pytest.mark.parametrize("body,key", [
    ('[backends]\nenabled = ["tensorrt"]\n', "backends.enabled.[0]"),
    ('[backends]\nthreads = [1, "4"]\n', "backends.threads.[1]"),
    ('[source]\nkind = "capture"\npath = "rtsp://x/y"\nframe_size = [224, 126.5]\n',
     "source.frame_size.[1]"),
])
def test_a_list_entry_refused_is_placed_on_its_list_line(tmp_path, body, key):
    # the entry's line is its list's (a field run's `enabled = ["tensorrt"]` had none)
    cfg = tmp_path / "e.toml"
    cfg.write_text(body)
    with pytest.raises(ConfigError) as e:
        load(cfg)
    line = body.splitlines().index(next(x for x in body.splitlines()
                                        if x.startswith(key.split(".")[1]))) + 1
    assert f"e.toml:{line}: key '{key}': " in str(e.value)
