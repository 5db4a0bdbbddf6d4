"""Opens the configured frame source: synthetic conveyor (synthetic_source.py), image folder in
watch mode (folder_source.py), OpenCV capture (capture_source.py), PyAV stream (av_source.py)
or edgerun's own RTSP client decoded by PyAV (rtp_source.py),
MQTT trigger (trigger_source.py), a Basler camera through pypylon (pylon_source.py, wrapped
here), and any of them triggered by the PLC's edges (`trigger = "opcua"` or `"modbus"`).

Every source yields `Frame`s from `read(timeout)` (None when nothing arrived in time) and
raises `SourceError` for a failure worth reporting (camera unplugged, stream down); the
pipeline's capture thread retries with backoff and reports an event, the rest of the daemon
keeps running. `live` sources may have stale frames dropped by the pipeline (latest wins);
folder and trigger sources are never dropped (runtime/frames/frame.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from runtime.config.source import SourceConfig
from runtime.frames.av_source import AvStreamSource, pyav_available
from runtime.frames.capture_source import CaptureSource
from runtime.frames.edges import EdgeBoard, EdgeBoards
from runtime.frames.folder_source import FolderSource
from runtime.frames.frame import BadFrame, Frame, Source, SourceError
from runtime.frames.rtp_source import RtpStreamSource
from runtime.frames.synthetic_source import Clock, SyntheticConveyor
from runtime.frames.trigger_source import EdgeTriggered, TriggerSource


class PylonSource:
    """A Basler camera through pypylon (runtime/frames/pylon_source.py, imported only here:
    pypylon is an optional extra) as a source: free-running (live, the newest frame) or,
    `triggered`, one frame per read by its software trigger (under EdgeTriggered). Frames
    carry the camera's frame number (`camera_frame`)."""

    def __init__(self, cfg: SourceConfig, triggered: bool = False):
        from runtime.frames import pylon_source

        self._m = pylon_source
        self.live = not triggered  # free-running: latest wins; triggered: never dropped
        try:
            self.camera = pylon_source.PylonCamera(cfg, triggered)
        except pylon_source.CameraError as e:
            raise SourceError(str(e)) from e

    def read(self, timeout_s: float) -> Frame | None:
        """The camera's next frame (PylonCamera.read); an incomplete one is a bad frame."""
        try:
            got = self.camera.read(timeout_s)
        except self._m.GrabFailed as e:
            raise BadFrame(e.ref, "truncated", e.why) from e
        except self._m.CameraError as e:
            raise SourceError(str(e)) from e
        if got is None:
            return None
        return Frame(got.image, f"frame-{got.number}", t=got.t, decode_cpu_s=got.convert_cpu_s,
                     camera_frame=got.number)

    def done(self, frames: list[Frame]) -> None:
        """Nothing to remember."""

    def close(self) -> None:
        """Let the camera go."""
        self.camera.close()


def use_pyav(cfg: SourceConfig) -> bool:
    """Whether a capture source is read through PyAV: `decoder = "pyav"` (SourceError when
    PyAV is missing), or "auto" for an RTSP URL where PyAV is installed."""
    if cfg.decoder == "opencv":
        return False
    if cfg.decoder == "pyav":
        if not pyav_available():
            raise SourceError("source.decoder = 'pyav' but PyAV is not installed (pip "
                              "install 'edgerun[streams]')")
        return True
    return cfg.path.lower().startswith("rtsp://") and pyav_available()


def open_source(cfg: SourceConfig, state_dir: Path, broker=None, client_id: str = "",
                clock: Clock | None = None, edges: EdgeBoard | EdgeBoards | None = None
                ) -> Source:
    """The configured source; SourceError when it cannot be opened right now. `clock` paces
    a synthetic camera (default: this host's); `edges`: the PLC's, for `trigger = "opcua"` or
    `"modbus"`."""
    if cfg.trigger:
        name = cfg.name or "main"
        if edges is None or name not in edges.sources:
            raise SourceError(f"source {name}: trigger = {cfg.trigger!r} but no PLC server "
                              f"hands it edges ([{cfg.trigger}] enabled)")
        if cfg.kind == "pylon":  # the camera's own software trigger, fired on each edge
            return EdgeTriggered(PylonSource(replace(cfg, trigger=""), triggered=True),
                                 edges, name)
        # captured on the edge, at once: a synthetic camera is not paced to its rate_hz
        camera = open_source(replace(cfg, trigger="", rate_hz=0.0 if cfg.kind == "synthetic"
                                     else cfg.rate_hz), state_dir, clock=clock)
        return EdgeTriggered(camera, edges, name)
    if cfg.kind == "synthetic":
        return SyntheticConveyor(cfg, clock)
    if cfg.kind == "folder":
        return FolderSource(cfg, state_dir)
    if cfg.kind == "capture":
        if cfg.decoder == "rtp":
            if not pyav_available():
                raise SourceError("source.decoder = 'rtp' decodes with PyAV, which is not "
                                  "installed (pip install 'edgerun[streams]')")
            return RtpStreamSource(cfg)
        if use_pyav(cfg):
            return AvStreamSource(cfg)
        return CaptureSource(cfg)
    if cfg.kind == "pylon":
        return PylonSource(cfg)
    if broker is None or not broker.host:
        raise SourceError("source kind 'trigger' needs telemetry.broker.host")
    return TriggerSource(cfg, broker, f"{client_id}-trigger")
