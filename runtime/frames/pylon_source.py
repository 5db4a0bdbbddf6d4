"""A machine-vision camera through pypylon (Basler's pylon SDK; GigE Vision and USB3 Vision).

`[source] kind = "pylon"`: the camera chosen by `serial` (or the first one found), its
features set at open (a `.pfs` feature file, then `pixel_format`, `exposure_us`,
`gain_db`), each read back and checked against what was asked; a value the camera refuses
or changes beyond its own rounding is a CameraError naming the key and what the camera
offers.

Two modes:

- **free-running** (no `trigger`): the camera runs at its own frame rate and pylon keeps
  only the newest frame (GrabStrategy_LatestImageOnly): a live source, latest wins.
- **triggered** (`trigger = "opcua"` or `"modbus"`, wrapped by sources.EdgeTriggered): the
  camera waits in GenICam SFNC FrameStart / Software trigger mode; each PLC edge makes one
  `read()`, which fires the software trigger and takes exactly that frame. A frame in the
  queue that no edge asked for (a hardware line also wired, a second trigger source) is
  discarded before the trigger, counted and logged, so a part's verdict is never another
  part's frame. The frame carries the camera's own frame number (`camera_frame`: its block
  id) beside the edge's `plc-<n>`.

The camera here knows nothing of frames and sources (sources.PylonSource makes it one, and
maps CameraError to SourceError, GrabFailed to a bad frame), so sources.py can open it
without an import cycle.

pypylon is an optional extra (`pip install 'edgerun[camera]'`: 241 MB installed with the
pylon runtime): it is imported when a pylon source opens, never by the rest of the daemon.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from runtime.config.source import SourceConfig

log = logging.getLogger("edgerun.source")

INSTALL = "pip install 'edgerun[camera]'"
# how far a value read back may be from the one asked before it is a mismatch: cameras
# round to their own step (the emulator's exposure 1234.56 us reads back 1235.0)
REL_TOLERANCE = 0.01
NO_BLOCK_ID = 2**64 - 1  # what pylon reports where the transport layer has no block id
MAX_FAILED_GRABS = 3  # triggered: failed grabs of one edge in a row before the camera is reopened


def pypylon() -> Any:
    """The pypylon `pylon` module; ImportError naming the key and the extra when absent."""
    try:
        from pypylon import pylon
    except ImportError as e:
        raise ImportError(f'source.kind = "pylon" needs the pypylon package ({e}): '
                          f"{INSTALL}") from e
    return pylon


class CameraError(Exception):
    """The camera failed or cannot be used as configured; the message says what and names
    the key (a SourceError to the pipeline: reported, reopened with backoff)."""


class GrabFailed(Exception):
    """One frame came incomplete (lost packets); the camera itself is fine (a bad frame to
    the pipeline)."""

    def __init__(self, ref: str, why: str):
        super().__init__(f"{ref}: {why}")
        self.ref, self.why = ref, why


@dataclass(frozen=True)
class Grab:
    """One frame: BGR image, the camera's number for it, its time and conversion CPU."""

    image: np.ndarray
    number: int
    t: float
    convert_cpu_s: float


@dataclass(frozen=True)
class Found:
    """A camera pylon enumerated: what `serial` is matched against and what errors list."""

    serial: str
    model: str
    name: str  # the friendly name, e.g. "Basler Emulation (0815-0000)"


def choose(serial: str, found: list[Found]) -> int:
    """The index in `found` of the camera to open: the one whose serial number is `serial`,
    or the first when `serial` is empty. CameraError naming what was found otherwise."""
    if not found:
        raise CameraError("source.kind = \"pylon\": no camera found (none connected, powered "
                          "or reachable: a GigE camera on another subnet, a USB camera "
                          "without its udev rules)")
    if not serial:
        return 0
    for i, f in enumerate(found):
        if f.serial == serial:
            return i
    listed = ", ".join(f"{f.serial} ({f.name})" for f in found)
    raise CameraError(f"source.serial {serial!r}: no camera with that serial number; found: "
                      f"{listed}")


def applied_problem(key: str, asked: float, got: float, step: float | None,
                    unit: str) -> str | None:
    """Why a value the camera reports after it was set is not the one asked (None when it
    is: within the camera's own step, or 1 % of the value, whichever is larger)."""
    tolerance = max(step or 0.0, abs(asked) * REL_TOLERANCE, 1e-9)
    if abs(got - asked) <= tolerance:
        return None
    return (f"source.{key} = {asked:g}: the camera set {got:g} {unit} instead (its step "
            f"{step:g} {unit})" if step else
            f"source.{key} = {asked:g}: the camera set {got:g} {unit} instead")


def to_bgr(array: np.ndarray, pixel_format: str) -> np.ndarray | None:
    """A grabbed frame as HxWx3 uint8 BGR for the formats converted here (Mono8, BGR8,
    RGB8, BGRA8); None for any other (pylon's converter does those)."""
    fmt = pixel_format.lower().removesuffix("packed")
    if fmt == "mono8" and array.ndim == 2:
        return cv2.cvtColor(array, cv2.COLOR_GRAY2BGR)
    if fmt == "bgr8" and array.ndim == 3:
        return np.ascontiguousarray(array)
    if fmt == "rgb8" and array.ndim == 3:
        return cv2.cvtColor(array, cv2.COLOR_RGB2BGR)
    if fmt == "bgra8" and array.ndim == 3:
        return cv2.cvtColor(array, cv2.COLOR_BGRA2BGR)
    return None


def _feature(cam: Any, *names: str) -> tuple[str, Any] | None:
    """The first of `names` this camera has and can write, with its node (SFNC names
    first, then the older Basler ones: ExposureTimeAbs, GainAbs on GigE ace cameras)."""
    from pypylon import genicam

    for name in names:
        node = cam.GetNodeMap().GetNode(name)
        if node is not None and genicam.IsWritable(node):
            return name, getattr(cam, name)
    return None


class PylonCamera:
    """One Basler camera through pypylon (see module doc). `triggered`: one frame per
    `read()`, fired by software trigger (for sources.EdgeTriggered); else free-running.
    `cam` is pypylon's InstantCamera (None once closed)."""

    def __init__(self, cfg: SourceConfig, triggered: bool = False):
        try:
            self._pylon = pypylon()
        except ImportError as e:
            raise CameraError(str(e)) from e
        self._cfg, self.triggered = cfg, triggered
        self.strays = 0  # frames no edge asked for, discarded (triggered)
        self.skipped = 0  # frames the camera made that a slower reader never saw
        self._failed = 0  # failed grabs in a row
        self._converter: Any = None
        self._last = time.monotonic()
        pylon = self._pylon
        try:
            factory = pylon.TlFactory.GetInstance()
            devices = factory.EnumerateDevices()
            found = [Found(d.GetSerialNumber(), d.GetModelName(), d.GetFriendlyName())
                     for d in devices]
            info = devices[choose(cfg.serial, found)]
            self.name = f"{info.GetModelName()} {info.GetSerialNumber()}"
            self.cam = pylon.InstantCamera(factory.CreateDevice(info))
            self.cam.Open()
        except CameraError:
            raise
        except Exception as e:  # genicam.GenericException: in use elsewhere, no access
            raise CameraError(f"source.kind = \"pylon\" ({cfg.serial or 'first camera'}): "
                              f"cannot open: {_said(e)}") from e
        try:
            self._configure()
            self.cam.StartGrabbing(pylon.GrabStrategy_OneByOne if triggered
                                    else pylon.GrabStrategy_LatestImageOnly)
        except BaseException as e:
            self.close()
            if isinstance(e, CameraError):
                raise
            if not isinstance(e, Exception):
                raise
            raise CameraError(f"pylon camera {self.name}: cannot start grabbing: "
                              f"{_said(e)}") from e
        self._format = self.cam.PixelFormat.Value
        log.info("pylon camera %s open: %s, %s, exposure %s us, gain %s dB", self.name,
                 "triggered by software on each PLC edge" if triggered else "free-running",
                 self._format, _value(self.cam, "ExposureTime", "ExposureTimeAbs"),
                 _value(self.cam, "Gain", "GainAbs"))

    def _configure(self) -> None:
        """The feature file, then pixel format, exposure and gain, each checked; then the
        trigger mode (software FrameStart when triggered, off when free-running)."""
        cam, cfg = self.cam, self._cfg
        if cfg.features_file:
            path = Path(cfg.features_file).expanduser()
            try:
                self._pylon.FeaturePersistence.Load(str(path), cam.GetNodeMap(), True)
            except Exception as e:
                raise CameraError(f"source.features_file {path}: the camera refused it: "
                                  f"{_said(e)}") from e
        if cfg.pixel_format:
            offered = list(cam.PixelFormat.Symbolics)
            if cfg.pixel_format not in offered:
                raise CameraError(f"source.pixel_format {cfg.pixel_format!r}: camera "
                                  f"{self.name} offers {', '.join(offered)}")
            try:
                cam.PixelFormat.Value = cfg.pixel_format
            except Exception as e:  # offered but not now (a locked feature)
                raise CameraError(f"source.pixel_format {cfg.pixel_format!r}: the camera "
                                  f"refused it: {_said(e)}") from e
            if (got := cam.PixelFormat.Value) != cfg.pixel_format:
                raise CameraError(f"source.pixel_format {cfg.pixel_format!r}: the camera "
                                  f"set {got!r}")
        if cfg.exposure_us is not None:
            self._set_float("exposure_us", cfg.exposure_us, "us", "ExposureAuto",
                            "ExposureTime", "ExposureTimeAbs")
        if cfg.gain_db is not None:
            self._set_float("gain_db", cfg.gain_db, "dB", "GainAuto", "Gain", "GainAbs")
        if cam.GetNodeMap().GetNode("TriggerSelector") is None:
            if self.triggered:
                raise CameraError(f"pylon camera {self.name} has no TriggerSelector: it "
                                  "cannot be triggered by software")
            return
        # every other trigger off (a feature file may have left FrameBurstStart on, which
        # would hold free-running frames or make a software trigger wait for a line): a
        # selector whose mode is not writable on this model is left as it is
        for selector in cam.TriggerSelector.Symbolics:
            try:
                cam.TriggerSelector.Value = selector
                cam.TriggerMode.Value = "Off"
            except Exception as e:
                log.debug("pylon camera %s: TriggerSelector %s: %s", self.name, selector, e)
        try:  # the frame trigger: SFNC's FrameStart
            if self.triggered:
                cam.TriggerSelector.Value = "FrameStart"
                cam.TriggerMode.Value = "On"
                cam.TriggerSource.Value = "Software"
        except Exception as e:
            raise CameraError(f"pylon camera {self.name}: cannot set its frame trigger "
                              f"(TriggerSelector FrameStart, TriggerSource Software): "
                              f"{_said(e)}") from e

    def _set_float(self, key: str, value: float, unit: str, auto: str, *names: str) -> None:
        cam = self.cam
        got = _feature(cam, *names)
        if got is None:
            raise CameraError(f"source.{key}: camera {self.name} has no writable "
                              f"{' or '.join(names)}")
        name, node = got
        if _feature(cam, auto) is not None:  # the camera's automatic mode would override it
            getattr(cam, auto).Value = "Off"
        lo, hi = node.Min, node.Max
        if not lo <= value <= hi:
            raise CameraError(f"source.{key} = {value:g}: camera {self.name} accepts "
                              f"{lo:g}..{hi:g} {unit} ({name})")
        try:
            node.Value = value
        except Exception as e:
            raise CameraError(f"source.{key} = {value:g}: the camera refused it: "
                              f"{_said(e)}") from e
        try:
            step = float(node.Inc) if node.HasInc() else None
        except Exception:  # a float feature without an increment
            step = None
        if problem := applied_problem(key, value, float(node.Value), step, unit):
            raise CameraError(f"{problem} ({name} on camera {self.name})")

    def read(self, timeout_s: float) -> Grab | None:
        """Free-running: the newest frame, None when none came within the timeout (a camera
        silent for `read_timeout_s` has failed: CameraError). Triggered: fire the software
        trigger and return that frame (None when it did not come within the timeout)."""
        pylon, cam = self._pylon, self.cam
        ms = max(int(timeout_s * 1000), 1)
        try:
            if self.triggered:
                self._discard_strays()
                if not cam.WaitForFrameTriggerReady(ms, pylon.TimeoutHandling_Return):
                    return self._nothing(timeout_s)
                t0 = time.time()
                cam.ExecuteSoftwareTrigger()
            else:
                t0 = None
            res = cam.RetrieveResult(ms, pylon.TimeoutHandling_Return)
        except Exception as e:
            if isinstance(e, CameraError):
                raise
            raise self._lost(e) from e
        if res is None or not res.IsValid():
            return self._nothing(timeout_s)
        try:
            return self._frame(res, t0)
        finally:
            res.Release()

    def _frame(self, res: Any, t0: float | None) -> Grab:
        # the camera's own frame counter (GigE Vision / USB3 Vision block id: a gap is a
        # frame the camera made and this reader never saw); pylon's count of the frames it
        # delivered where the transport has none
        n = int(res.BlockID)
        if n == NO_BLOCK_ID:
            n = int(res.ImageNumber)
        ref = f"frame-{n}"  # triggered: EdgeTriggered names it plc-<n>
        if not res.GrabSucceeded():
            self._failed += 1
            why = f"grab failed: {res.ErrorDescription} (0x{res.ErrorCode:x})"
            if self._failed >= MAX_FAILED_GRABS:
                self._failed = 0
                raise CameraError(f"pylon camera {self.name}: {MAX_FAILED_GRABS} grabs failed "
                                  f"in a row, the last: {why}")
            raise GrabFailed(ref, why)  # an incomplete frame (lost packets)
        self._failed = 0
        self._last = time.monotonic()
        self.skipped += int(res.GetNumberOfSkippedImages())
        c0 = time.thread_time()
        image = to_bgr(res.GetArray(), self._format)
        if image is None:
            if self._converter is None:
                self._converter = self._pylon.ImageFormatConverter()
                self._converter.OutputPixelFormat = self._pylon.PixelType_BGR8packed
            image = self._converter.Convert(res).GetArray()
        return Grab(image, n, t0 if t0 is not None else time.time(), time.thread_time() - c0)

    def _discard_strays(self) -> None:
        """Triggered: frames already waiting were asked for by nobody here; drop them so
        the next frame taken is the trigger's own."""
        while True:
            res = self.cam.RetrieveResult(0, self._pylon.TimeoutHandling_Return)
            if res is None or not res.IsValid():
                return
            n = res.BlockID
            res.Release()
            self.strays += 1
            log.warning("pylon camera %s: frame %d came without a PLC edge (a hardware "
                        "trigger line or another trigger source?); discarded (%d so far)",
                        self.name, n, self.strays)

    def _nothing(self, timeout_s: float) -> None:
        if self.cam.IsCameraDeviceRemoved():
            raise self._lost(None)
        if self.triggered:  # EdgeTriggered reopens and keeps the edge
            return None
        silent = time.monotonic() - self._last
        if silent >= self._cfg.read_timeout_s:
            raise CameraError(f"pylon camera {self.name}: no frame for {silent:.1f} s "
                              f"(read_timeout_s {self._cfg.read_timeout_s:g}): the camera "
                              "stalled")
        return None

    def _lost(self, e: Exception | None) -> CameraError:
        if self.cam.IsCameraDeviceRemoved():
            return CameraError(f"pylon camera {self.name} is gone (unplugged, powered off or "
                               "its network lost); reopened once it is back")
        return CameraError(f"pylon camera {self.name}: {_said(e)}")

    def close(self) -> None:
        """Stop grabbing and let the camera go (another program may open it then)."""
        cam = getattr(self, "cam", None)
        if cam is None:
            return
        for step in (cam.StopGrabbing, cam.Close, cam.DestroyDevice):
            try:
                step()
            except Exception as e:  # a camera already gone: nothing left to release
                log.debug("pylon camera %s: %s: %s", self.name, step.__name__, e)
        self.cam = None


def _value(cam: Any, *names: str) -> str:
    got = _feature(cam, *names)
    return "?" if got is None else f"{got[1].Value:g}"


def _said(e: Exception | None) -> str:
    """pylon's message without its C++ file and line tail."""
    if e is None:
        return "no frame"
    text = str(e).split(" : ", 1)[0] if " : " in str(e) else str(e)
    return f"{type(e).__name__}: {text.strip()}"[:500]
