"""The sources as the daemon plans for them: which model each `[[sources]]` entry runs (its key),
how many tiles each frame costs, the streams the latency budget shares and each model's
per-inference target (runtime/choice/joint.py), and the pipeline's lanes.

One `[source]` is a single stream on the [model]'s model; with `[[sources]]` each entry is a
stream on the [model]'s model or its own. A source whose own model failed at start (`failed`)
is neither planned for nor opened.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from runtime.choice import joint
from runtime.config.source import model_path
from runtime.frames.multisource import aggregate, lanes, single
from runtime.frames.sources import open_source
from runtime.frames.synthetic_source import Clock


def bundled_model() -> Path:
    """The model served when `[model] path` is not set."""
    from models import bundled

    return bundled()


class SourcePlan:
    """The plan of one daemon's sources; `config()` is its configuration now (a reload or a
    command changes the constraints, never the sources)."""

    def __init__(self, config: Callable[[], Any], state_dir: Path):
        self.config = config  # -> runtime.config.Config
        self.state_dir = state_dir  # where a source keeps its state (a trigger's replay)
        self.device_id = ""  # the telemetry client id the triggers' ids derive from
        self.edges: Any = None  # runtime.frames.edges.EdgeBoard of the PLC ([opcua]), or None
        self.tiles: dict[str, int] = {}  # source name -> tiles per frame planned with
        # models of sources that could not be loaded or measured at start: key -> why. Their
        # sources are not inspected (health: state failed); the others run (docs/sources.md)
        self.failed: dict[str, str] = {}
        self._keys: dict[tuple, tuple] = {}  # ids of (entry, [model]) -> (them, its key)

    def model_key(self, s: Any) -> str:
        """The key of a `[[sources]]` entry's model: "" when it has none of its own, or names
        the [model] section's own model, tiled the same way (they share its session).
        Remembered: it resolves paths, and the budget asks for every source's key many times
        a tick (64 sources on 64 models took seconds per health message)."""
        if not s.model:
            return ""
        m = self.config().model
        memo = (id(s), id(m))  # hashing the entries costs more than the lookup saves
        if (got := self._keys.get(memo)) is None or got[0] is not s or got[1] is not m:
            got = self._keys[memo] = (s, m, self._find_model_key(s, m))  # held: ids stay theirs
        return got[2]

    def _find_model_key(self, s: Any, m: Any) -> str:
        default = Path(m.path).expanduser() if m.path else bundled_model()
        if model_path(s.model).resolve() == default.resolve() and (
                s.tiling, s.tile_size, s.tile_overlap) == (m.tiling, m.tile_size,
                                                           m.tile_overlap):
            return ""
        # one key per model, however it is spelt (a bundled name, a path, a symlink): the
        # first entry's spelling, so the sources share one session, ladder and measurement
        here = model_path(s.model).resolve()
        return next((x.model for x in self.config().sources
                     if x.model and model_path(x.model).resolve() == here), s.model)

    def check_extras(self) -> None:
        """A source that needs an extra (a Basler camera: pypylon) raises ImportError saying
        so now, at start-up, not as a source retried for ever."""
        cfg = self.config()
        if any(s.kind == "pylon" for s in (cfg.sources or (cfg.source,))):
            from runtime.frames.pylon_source import pypylon

            pypylon()

    def model_used(self) -> bool:
        """Whether any source runs the [model] section's model."""
        cfg = self.config()
        return not (cfg.sources and all(self.model_key(s) for s in cfg.sources))

    def streams(self) -> list[joint.Stream]:
        """The sources as the budget sees them (model key, rate, tiles planned)."""
        cfg = self.config()
        if not cfg.sources:
            name = cfg.source.name or "main"
            return [joint.Stream(name, "", cfg.source.rate_hz, self.tiles.get(name, 1))]
        return [joint.Stream(s.name, k, s.rate_hz, self.tiles.get(s.name, 1))
                for s in cfg.sources if (k := self.model_key(s)) not in self.failed]

    def target(self, key: str) -> tuple[float, str]:
        """(per-inference target ms, why) of a model: with several sources the target that
        holds each stream's at their combined rate, over the tiles of its most tiled source
        (runtime.choice.joint.targets); a model no source uses (the [model]'s when every
        source names its own) gets the per-frame one."""
        c = self.config().constraints
        streams = self.streams()
        got = joint.targets(c.latency_ms, streams)
        return got.get(key) or aggregate(c.latency_ms, [s.rate_hz for s in streams])

    def lanes(self, clock: Clock | None = None) -> list:
        """The pipeline's sources: one `[source]`, or each of `[[sources]]` (a trigger gets a
        client id of its own so two do not take over each other's session). `clock`: the
        simulated board's, so a synthetic camera offers frames per simulated second."""
        cfg = self.config()
        if not cfg.sources:
            return single(cfg.source, lambda: open_source(
                cfg.source, self.state_dir, cfg.telemetry.broker, self.device_id, clock,
                self.edges))
        out = lanes(cfg.sources, lambda s, i: open_source(
            s, self.state_dir, cfg.telemetry.broker, f"{self.device_id}-{s.name}", clock,
            self.edges), self.model_key)
        for lane in out:  # a source whose model failed at start is never opened
            if lane.model in self.failed:
                lane.refused, lane.model, lane.share = self.failed[lane.model], "", 0.0
        # a combined rate cap is shared by the sources inspected (a refused one's share was
        # lost: a 10 Hz cap over two 10 Hz cameras, one refused, gave the other 5 Hz)
        total = sum(lane.share for lane in out)
        for lane in out:
            lane.share = lane.share / total if total > 0 else lane.share
        return out

    def model_failed(self, key: str, path: Path, e: Exception) -> tuple[list[str], str]:
        """Record that a source's own model cannot be used; (its sources' names, why)."""
        names = [s.name for s in self.config().sources if self.model_key(s) == key]
        why = (f"model {key!r} ({path}) cannot be used: {type(e).__name__}: {e}")[:1000]
        self.failed[key] = why
        return names, why

    def plan_tiles(self, manifests: Mapping[str, Any], default: Any) -> None:
        """Tiles per frame of each source before its frames come (choice.joint.planned_tiles):
        `manifests` of the sources' own models by key, `default` the [model]'s."""
        cfg = self.config()
        for s in cfg.sources or (cfg.source,):
            key = self.model_key(s) if cfg.sources else ""
            if key and key not in manifests:
                continue
            self.tiles[s.name or "main"] = joint.planned_tiles(
                s, manifests[key] if key else default)

    def learn_tiles(self, seen_lanes: list) -> str:
        """Take the tiles per frame the sources' frames cost (a camera's size is known only
        from its frames); what moved, said for the log ("" when nothing did)."""
        seen = {lane.name: lane.tiles for lane in seen_lanes if lane.tiles}
        moved = {n: t for n, t in seen.items() if self.tiles.get(n, 1) != t}
        why = ", ".join(f"source {n}: {t} tiles per frame, planned {self.tiles.get(n, 1)}"
                        for n, t in moved.items())
        self.tiles.update(moved)
        return why
