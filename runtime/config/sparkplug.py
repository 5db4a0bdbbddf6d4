"""The `[sparkplug]` section: an opt-in Sparkplug B 3.0 edge node beside the native JSON tree
(docs/sparkplug.md). It connects with `[telemetry.broker]`'s settings."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Sparkplug B 3.0 (topic namespace): group, edge node and device ids are UTF-8 strings that
# must not hold the MQTT separator or wildcards; control characters are refused too (they
# reach an operator's tag browser and logs).
_FORBIDDEN = set("/+#")


def check_sparkplug_id(what: str, value: str) -> str | None:
    """Why `value` cannot be a Sparkplug group/edge node/host id, or None when it can."""
    if not value or len(value) > 256:
        return f"{what} must be 1-256 characters, got {value!r}"
    bad = sorted({c for c in value if c in _FORBIDDEN or ord(c) < 32 or ord(c) == 127})
    if bad:
        return (f"{what} must not contain '/', '+', '#' or control characters (it is a "
                f"Sparkplug topic level), got {value!r}")
    return None


@dataclass(frozen=True)
class SparkplugConfig:
    """The `[sparkplug]` section. The device is the Edge Node, each source a Device."""

    enabled: bool = False
    # empty: telemetry.fleet and the device id, which the broker ACL that `edgerun fleet
    # enroll` writes grants the device's `+sparkplug` connection (docs/sparkplug.md)
    group_id: str = ""
    edge_node_id: str = ""
    # empty: no primary host; births go out at every connect. Set: the node births only while
    # spBv1.0/STATE/<primary_host_id> says online, and holds its data meanwhile.
    primary_host_id: str = ""
    ok_labels: tuple[str, ...] = ("ok", "none")  # classes whose verdict is "ok" (else "reject")
    # report by exception: a metric is sent when it changed by more than these
    score_deadband: float = 0.02
    temp_deadband_c: float = 0.5
    relative_deadband: float = 0.05  # energy, latency, rates: a fraction of the last value sent
    max_births_per_minute: int = 6  # a flapping primary host or NCMD rebirths: bounded
    max_command_bytes: int = 4096  # NCMD/DCMD payloads larger than this are refused
    max_held_results: int = 10_000  # results held in memory while the host/broker is away
    # live results are read and published at most once per this interval, coalesced per
    # source (every verdict change still goes out; docs/sparkplug.md); 0: each at once
    data_interval_s: float = 0.1

    def validate(self) -> tuple[str, str] | None:
        for key in ("group_id", "edge_node_id", "primary_host_id"):
            value = getattr(self, key)
            if value and (why := check_sparkplug_id(key, value)):
                return key, why
        for key in ("score_deadband", "temp_deadband_c", "relative_deadband"):
            value = getattr(self, key)
            if not 0 <= value < math.inf:
                return key, f"must be >= 0 and finite, got {value}"
        if not 1 <= self.max_births_per_minute <= 600:
            return "max_births_per_minute", f"must be 1..600, got {self.max_births_per_minute}"
        if not 256 <= self.max_command_bytes <= 1 << 20:
            return "max_command_bytes", f"must be 256..1048576, got {self.max_command_bytes}"
        if not 0 <= self.max_held_results <= 1_000_000:
            return "max_held_results", f"must be 0..1000000, got {self.max_held_results}"
        if not 0 <= self.data_interval_s <= 60:
            return "data_interval_s", f"must be 0..60 seconds, got {self.data_interval_s}"
        if len(self.ok_labels) > 256 or any(not 0 < len(x) <= 256 for x in self.ok_labels):
            return "ok_labels", "at most 256 labels of 1-256 characters"
        return None
