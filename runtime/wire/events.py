"""Every event type a device emits, typed: the `type` of an `event` message (wire contract).

A device queues an event (`{"v", "t", "type", "severity", ...fields}`, payloads.py `event`)
for what an operator should see: a failure that does not stop it, a decision it took, a model's
life (deploy, swap, probation, rollback). The coordinator stores every event and drives
rollouts from the model events (runtime/coordinator/rollout.py); the demo and the dashboard
show them. Both sides import this module, so a type is written once, here.

`EventType` members are `str`s: they go into JSON and compare equal to the strings a device
of an older version sends. The coordinator raises alerts, not events (their codes are
runtime/config/coordinator.py `ALERT_CODES`). power/ emits five of these types from its
control step and imports nothing of runtime/: power/control.py names them in a `Literal`,
which tests/wire/test_events.py checks against this list, as it checks every type the product
code emits.
"""

from __future__ import annotations

from enum import StrEnum


class EventType(StrEnum):
    """An event's `type`, with `doc`: what it reports and who emits it."""

    doc: str

    def __new__(cls, value: str, doc: str) -> EventType:
        member = str.__new__(cls, value)
        member._value_ = value
        member.doc = doc
        return member

    # -- the daemon's own life (runtime/device/instance.py) -------------------------------------
    UNCLEAN_STOP = ("unclean_stop", "at start: the previous run never ran its stop (`how`: "
                    "\"killed\" in this boot: kill -9, the OOM killer, a crash; "
                    "\"power\": a power loss or reset in an earlier boot)")
    # -- frames (runtime/frames/) ---------------------------------------------------------------
    FRAME_BAD = ("frame_bad", "an input was refused (too large, truncated, corrupt, not an "
                 "image, unreadable); rate-limited, the source keeps running")
    SOURCE_FAILED = ("source_failed", "a frame source failed (camera unplugged, stream down): "
                     "retried with backoff; critical when its model cannot be used at all")
    SOURCE_ENDED = ("source_ended", "a source has nothing more to give (a video file's last "
                    "frame, no loop); the daemon keeps running")
    INFERENCE_FAILED = ("inference_failed", "one inference raised; the frame is counted as an "
                        "error and the pipeline goes on")
    STORE_FAILED = ("store_failed", "a result could not be queued in the outbox")
    LOCAL_RESULTS_FAILED = ("local_results_failed", "a local sink ([results] JSONL, "
                            "snapshots) could not write; the outbox path is unaffected")
    # -- telemetry (runtime/telemetry/) ---------------------------------------------------------
    MQTT_TAKEOVER = ("mqtt_takeover", "another client connected with this device's id and "
                     "took its session")
    ACK_REFUSED = ("ack_refused", "a suspicious ack (beyond what was sent, or vouching for "
                   "results still held) was refused; nothing was deleted")
    SPARKPLUG_REFUSED = ("sparkplug_refused", "the Sparkplug edge node refused an NCMD/DCMD "
                         "(unknown metric, wrong datatype, too large, not a payload) or a "
                         "malformed primary host STATE; nothing changed (docs/sparkplug.md)")
    OUTBOX_CORRUPT = ("outbox_corrupt", "the outbox database was unreadable at start: moved "
                      "aside, a new one begun")
    REPLAY_RECORD_LOST = ("replay_record_lost", "the outbox's keep file (seen command ids, "
                          "evicted_total) was lost: commands issued before now are refused")
    OUTBOX_LOG_DAMAGED = ("outbox_log_damaged", "damaged lines of the outbox's result log "
                          "(a bad sector, a flipped bit) were skipped at start: results in "
                          "them are lost, the rest kept; said once, as the log is rewritten")
    OUTBOX_EVICTING = ("outbox_evicting", "the outbox is full: the oldest results are evicted")
    OUTBOX_DISK_FULL = ("outbox_disk_full", "the state disk refuses writes: results wait in "
                        "memory up to a bound, health and events go out from memory")
    OUTBOX_DISK_RECOVERED = ("outbox_disk_recovered", "the state disk takes writes again: what "
                             "waited in memory is stored")
    # -- control (power/control.py through the daemon) ------------------------------------------
    GOVERNOR = ("governor", "the thermal governor changed its level or failed safe")
    ENERGY = ("energy", "the energy-neutral budget changed (battery, harvest forecast)")
    SENSOR_HOLD = ("sensor_hold", "an invalid reading: the last valid value is held before "
                   "failing safe")
    PHYSICS_BOUNDED = ("physics_bounded", "at minimum duty on the cheapest rung and still above "
                       "the trip: edgerun cannot hold the die below it")
    PHYSICS_BOUNDED_CLEARED = ("physics_bounded_cleared", "the die is back under control")
    GOVERNOR_DISABLED = ("governor_disabled", "no usable thermal sensor at start: nothing "
                         "protects the device from overheating")
    SENSOR_INVALID = ("sensor_invalid", "a sensor read returned garbage or nothing")
    CONTROL_FAILED = ("control_failed", "the control tick raised; the loop keeps running")
    # -- choice and rungs (runtime/device/daemon.py) --------------------------------------------
    RUNG_CHANGED = ("rung_changed", "the running variant moved to another rung (from, to, why)")
    SWITCH_FAILED = ("switch_failed", "loading a variant failed: the old one keeps running, "
                     "retried with backoff")
    VARIANT_REFUSED = ("variant_refused", "a variant failed during profiling; the others run")
    SLOW_INFERENCE = ("slow_inference", "p95 latency well above the profile's (throttling?)")
    ENERGY_METER_LOST = ("energy_meter_lost", "the power meter failed or read garbage: the box's "
                         "energy per frame falls back to the CPU-time estimate")
    MODEL_BLIND = ("model_blind", "a served model's outputs over its first frames look "
                   "degenerate (no boxes, one class, constant or NaN): check its preprocessing")
    REPROFILE = ("reprofile", "profiling again (temperature drift, command, reload)")
    ACCELERATOR_METER_DISTRUSTED = (
        "accelerator_meter_distrusted", "an accelerator's energy counter stuck, went backwards "
        "or jumped impossibly during a measuring window: the variant is billed the labelled "
        "estimate ([[accelerators]]), never 0 (power/meter_trust.py)")
    INTEGRATION_STOPPED = (
        "integration_stopped", "an integration's thread (sparkplug, opcua, modbus) stopped "
        "while serving: results stay in the outbox and the native MQTT tree, the daemon runs "
        "on without it; health's `integrations` shows it false (runtime/device/daemon.py)")
    RERANK = ("rerank", "a variant served on an accelerator cost more per inference than its "
              "profile's at-rate figure, beyond the meter's error: the measured figure "
              "replaced it and the choice was made again (profiled_mj, live_mj, error, "
              "outcome; runtime/device/serving_drift.py)")
    REPROFILE_SKIPPED = ("reprofile_skipped", "a re-profile was asked while one runs")
    REPROFILE_FAILED = ("reprofile_failed", "a re-profile failed; the old ladder stays")
    SOURCE_MODEL_FAILED = ("source_model_failed", "a [[sources]] model cannot be used: its "
                           "sources are not inspected, the others run")
    # -- commands and configuration (runtime/device/daemon.py) ----------------------------------
    COMMAND_APPLIED = ("command_applied", "a signed command was applied")
    COMMAND_FAILED = ("command_failed", "a command was refused or failed")
    CONFIG_RELOADED = ("config_reloaded", "the config file was reloaded (SIGHUP or command)")
    CONFIG_RELOAD_FAILED = ("config_reload_failed", "the reloaded config was invalid; the old "
                            "one stays")
    # -- models over the air (runtime/device/ota.py; the coordinator's rollouts read these) ----
    MODEL_DEPLOYED = ("model_deployed", "a deploy asked for the model already served")
    MODEL_DEPLOY_FAILED = ("model_deploy_failed", "a deploy failed (download, signature, "
                           "install, profiling); its reason names the version")
    MODEL_SWAPPED = ("model_swapped", "a new model version serves, in probation (from, to)")
    MODEL_PROBATION_PASSED = ("model_probation_passed", "a new model passed probation: kept")
    MODEL_ROLLED_BACK = ("model_rolled_back", "a new model failed probation or crash-looped: "
                         "the previous one serves again")
    # -- sleep (runtime/device/sleep.py) --------------------------------------------------------
    SLEEPING = ("sleeping", "about to suspend until the next inspection (until, seconds)")
    WOKE = ("woke", "resumed from suspend (slept_s, asked_s)")
    SLEEP_FAILED = ("sleep_failed", "a suspend failed; awake, tried again next cycle")
    SLEEP_DISABLED = ("sleep_disabled", "sleep is configured but the board cannot sleep: "
                      "running awake")


MODEL_EVENTS = frozenset({EventType.MODEL_DEPLOYED, EventType.MODEL_DEPLOY_FAILED,
                          EventType.MODEL_SWAPPED, EventType.MODEL_PROBATION_PASSED,
                          EventType.MODEL_ROLLED_BACK})  # a rollout's verdicts come from these
