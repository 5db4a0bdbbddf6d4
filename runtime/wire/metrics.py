"""Prometheus metric families from health messages, shared by the coordinator's `/metrics`
(one series per device) and the device's own opt-in `/metrics` (runtime/device/local_api.py).

A health message comes from a device, so every value is read defensively: a field that is
missing, None, a bool where a number belongs, a string, NaN or infinite is skipped (the series
is absent for that device in this scrape) — it never raises and never breaks the scrape.
Units follow Prometheus conventions: seconds, watts, joules, ratios in 0..1, `_total` for
counters the device keeps (they restart at zero with the daemon; `rate()` handles that).
docs/metrics.md lists every name.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PREFIX = "edgerun_device_"
# The classic text format: every name here is a legacy-valid Prometheus name, so what
# generate_latest writes is format 0.0.4, which every Prometheus version reads. (Newer
# prometheus_client releases label their output 1.0.0, which older servers do not know.)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Spec:
    """One per-device metric read from a health message."""

    name: str  # after PREFIX
    path: tuple[str, ...]  # where in the health message
    help: str
    scale: float = 1.0  # e.g. 1e-3 for milliseconds -> seconds
    kind: str = "gauge"  # "gauge", "counter" (a device counter), or "bool" (a 0/1 gauge)


SPECS: tuple[Spec, ...] = (
    Spec("temperature_celsius", ("temp_c",), "Die temperature the governor reads"),
    Spec("passive_trip_celsius", ("passive_trip_c",),
         "The device's first passive thermal trip point"),
    Spec("throttled", ("throttled",), "1 when the device reports thermal throttling", kind="bool"),
    Spec("rung", ("rung",), "Running rung of the model ladder (1 = cheapest)"),
    Spec("rungs", ("rungs",), "Rungs in the ladder (the top one is the selector's choice)"),
    Spec("accuracy_ratio", ("accuracy",), "Accuracy of the running rung, 0..1"),
    Spec("inference_rate_hz", ("pipeline", "rate_hz"), "Inferences per second, recent"),
    Spec("latency_p50_seconds", ("pipeline", "latency_ms", "p50"),
         "Median inference latency, recent", 1e-3),
    Spec("latency_p95_seconds", ("pipeline", "latency_ms", "p95"),
         "95th percentile inference latency, recent", 1e-3),
    Spec("latency_target_seconds", ("slo", "target_ms"), "Latency target (constraints)", 1e-3),
    Spec("slo_compliance_ratio", ("slo", "compliance"),
         "Share of recent inferences within the latency target"),
    Spec("power_watts", ("power_w",), "Estimated device power: idle plus inference"),
    Spec("inference_energy_joules", ("rung_energy_mj",),
         "Energy per inference of the running rung", 1e-3),
    Spec("battery_ratio", ("battery_frac",), "Battery state of charge, 0..1"),
    Spec("governor_enabled", ("governor", "enabled"),
         "1 when the thermal governor runs (0: nothing steps the model down)", kind="bool"),
    Spec("rate_cap_hz", ("rate_cap_hz",), "Frame rate cap set by the governor (absent: none)"),
    Spec("backlog_results", ("backlog", "results_held"),
         "Results held on the device, not yet acknowledged"),
    Spec("backlog_bytes", ("backlog", "bytes"), "Bytes of results held on the device"),
    Spec("outbox_disk_full", ("backlog", "disk_full"),
         "1 while the device's disk refuses outbox writes (results wait in memory)",
         kind="bool"),
    Spec("uptime_seconds", ("uptime_s",), "Seconds since the daemon started"),
    Spec("health_timestamp_seconds", ("t",), "Device clock when the health was made"),
    Spec("mqtt_connected", ("mqtt", "connected"), "1 when the device's MQTT link is up",
         kind="bool"),
    Spec("frames_total", ("pipeline", "frames"), "Frames captured since the daemon started",
         kind="counter"),
    Spec("results_total", ("pipeline", "results"), "Results stored since the daemon started",
         kind="counter"),
    Spec("frames_bad_total", ("pipeline", "frames_bad", "total"),
         "Frames refused as bad since the daemon started", kind="counter"),
    Spec("infer_errors_total", ("pipeline", "infer_errors"),
         "Inference errors since the daemon started", kind="counter"),
    Spec("results_evicted_total", ("backlog", "evicted_total"),
         "Unacknowledged results evicted because the outbox was full", kind="counter"),
)


def read(h: Any, spec: Spec) -> float | None:
    """The value of `spec` in health message `h`, or None when absent or unusable."""
    node = h
    for key in spec.path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    if isinstance(node, bool):
        return float(node) if spec.kind == "bool" else None
    if spec.kind == "bool" or not isinstance(node, int | float):
        return None
    try:
        value = float(node) * spec.scale
    except OverflowError:  # an int beyond float range
        return None
    if not math.isfinite(value) or (spec.kind == "counter" and value < 0):
        return None
    return value


def families(rows: Iterable[tuple[Mapping[str, str], Any]], label_names: tuple[str, ...]
             ) -> list[Metric]:
    """One family per spec with a sample per (labels, health) row that has the value; rows
    whose health is not a mapping contribute nothing."""
    out: list[Metric] = []
    rows = list(rows)
    for spec in SPECS:
        cls = CounterMetricFamily if spec.kind == "counter" else GaugeMetricFamily
        fam = cls(PREFIX + spec.name, spec.help, labels=list(label_names))
        for labels, h in rows:
            value = read(h, spec)
            if value is not None:
                fam.add_metric([str(labels[k]) for k in label_names], value)
        out.append(fam)
    return out
