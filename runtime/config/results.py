"""The `[results]` section: local outputs besides the outbox (runtime/frames/results_local.py)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class JsonlConfig:
    """`[results.jsonl]`: one JSON object per result, appended; rotated by size."""

    path: str = ""  # empty: off
    max_bytes: int = 10 << 20  # rotate before the file would grow past this
    keep: int = 5  # rotated files kept (path.1 newest ... path.keep oldest)

    def validate(self) -> tuple[str, str] | None:
        if self.max_bytes < 4096:
            return "max_bytes", f"must be >= 4096, got {self.max_bytes}"
        if not 0 <= self.keep <= 1000:
            return "keep", f"must be within 0..1000, got {self.keep}"
        return None


@dataclass(frozen=True)
class SnapshotConfig:
    """`[results.snapshots]`: JPEGs of frames whose label is not the ok one."""

    dir: str = ""  # empty: off
    labels: tuple[str, ...] = ()  # empty: every label except the manifest's first ("ok")
    keep: int = 1000  # at most this many snapshots
    max_age_h: float = 168.0  # and none older than this (0: no age limit)
    quality: int = 90  # JPEG quality

    def validate(self) -> tuple[str, str] | None:
        if self.keep < 1:
            return "keep", f"must be >= 1, got {self.keep}"
        if self.max_age_h < 0:
            return "max_age_h", f"must be >= 0, got {self.max_age_h}"
        if not 1 <= self.quality <= 100:
            return "quality", f"must be within 1..100, got {self.quality}"
        return None


@dataclass(frozen=True)
class ResultsConfig:
    """`[results]`: local outputs besides the outbox (`serve --print` sets `print`)."""

    print: bool = False  # one line a result on stdout
    jsonl: JsonlConfig = field(default_factory=JsonlConfig)
    snapshots: SnapshotConfig = field(default_factory=SnapshotConfig)

    @property
    def enabled(self) -> bool:
        """Any local sink is on."""
        return self.print or bool(self.jsonl.path) or bool(self.snapshots.dir)
