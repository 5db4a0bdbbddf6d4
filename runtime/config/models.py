"""The `[models]` section: who may publish models and how a new one is judged (docs/ota.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelsConfig:
    """The `[models]` section: who may publish models, and how a new one is judged."""

    publisher_keys: tuple[str, ...] = ()  # Ed25519 public keys (PEM) trusted to sign bundles
    max_bundle_mb: float = 512.0  # a bundle (download or header) over this is refused
    min_free_mb: float = 64.0  # free space that must remain in the state dir after a download
    probation_frames: int = 200  # frames on the new model before it is judged
    agreement_floor: float = 0.8  # top-1 agreement with the old model on the shadow sample
    shadow_every: int = 5  # every Nth frame is also run on the old model during probation
    max_error_rate_increase: float = 0.01  # inference errors per frame, over the old model's
    energy_factor: float = 1.5  # energy per inference may be at most this times the old one
    crash_boots: int = 3  # starts in probation without passing: a crash loop, roll back
    # How a deployed bundle is fetched (runtime/ota/bundle_mqtt.py): "http" from the coordinator's
    # API, "mqtt" in chunks through the broker, "auto" HTTP and MQTT when the API is unreachable
    fetch: str = "auto"
    mqtt_chunk_kb: int = 128  # bytes asked per MQTT request (a coordinator sends <= 256 KiB)
    mqtt_window: int = 8  # MQTT requests outstanding at once (a coordinator queues <= 16)
    mqtt_timeout_s: float = 10.0  # re-ask a chunk unanswered this long; 4x without data: fail

    def validate(self) -> tuple[str, str] | None:
        # one key a check, named by itself: the key locates the line in the file
        if self.max_bundle_mb <= 0:
            return "max_bundle_mb", f"must be > 0, got {self.max_bundle_mb}"
        if self.min_free_mb < 0:
            return "min_free_mb", f"must be >= 0, got {self.min_free_mb}"
        if not 0.0 <= self.agreement_floor <= 1.0:
            return "agreement_floor", f"must be within 0..1, got {self.agreement_floor}"
        for key in ("probation_frames", "shadow_every", "crash_boots"):
            if getattr(self, key) < 1:
                return key, f"must be >= 1, got {getattr(self, key)}"
        if self.fetch not in ("auto", "http", "mqtt"):
            return "fetch", f"must be \"auto\", \"http\" or \"mqtt\", got {self.fetch!r}"
        if not 1 <= self.mqtt_chunk_kb <= 256:
            return "mqtt_chunk_kb", f"must be within 1..256, got {self.mqtt_chunk_kb}"
        if not 1 <= self.mqtt_window <= 16:
            return "mqtt_window", f"must be within 1..16, got {self.mqtt_window}"
        if self.mqtt_timeout_s <= 0:
            return "mqtt_timeout_s", f"must be > 0, got {self.mqtt_timeout_s}"
        if self.energy_factor < 1.0:
            return "energy_factor", f"must be >= 1, got {self.energy_factor}"
        if self.max_error_rate_increase < 0:
            return "max_error_rate_increase", f"must be >= 0, got {self.max_error_rate_increase}"
        return None
