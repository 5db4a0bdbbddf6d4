"""The `[source]` section and the `[[sources]]` entries, with their checks. Standard library.

An entry's `model` is a path or the name of a bundled model: `BUNDLED_MODELS` is where the
`models` package lies beside `runtime` (in a checkout and in site-packages alike; the config
imports no project code, and tests/config/test_config.py checks it is `models.ROOT`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from runtime.config import roi
from runtime.config.schema import Absent

BUNDLED_MODELS = Path(__file__).resolve().parents[2] / "models"
DEFAULT_MAX_PIXELS = 40_000_000  # folder/trigger images larger than this are refused
MAX_SYNTHETIC_SIZE = 1024  # 256 parts x 3 MiB of pool at the most
MAX_MODEL_CHARS = 4096  # a [[sources]] model: a name or a path (PATH_MAX on Linux)
MAX_SOURCES = 64  # health's pipeline.sources holds at most this many (payloads._HEALTH)
MIN_FRAME_SIDE, MAX_FRAME_SIDE = 16, 8192  # frame_size: a model's input to 8K video
NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # a source's name goes into results and topics


@dataclass(frozen=True)
class SourceConfig:
    """The `[source]` section (or one `[[sources]]` entry, see runtime/frames/multisource.py)."""

    kind: Literal["synthetic", "folder", "capture", "trigger", "pylon"] = "synthetic"
    # results name their source; empty: "main" for a single [source] ([[sources]] need one)
    name: str = ""
    rate_hz: float = 10.0  # the rate it is inspected at, the budget's plan (0 = as it comes):
    # synthetic: parts per second; a camera or stream (capture of a URL or device, free-running
    # pylon): read whole, the frames between its slots skipped. A single [source]'s folder,
    # trigger, PLC-triggered camera or video file keeps its own pace (runtime/frames/
    # multisource.py single_pace_hz); in [[sources]] they wait for their slot (never skipped)
    seed: int = 0
    defect_rate: float = 0.2  # synthetic: share of parts with a defect
    size: int = 96  # synthetic: frame size in pixels
    path: str = ""  # folder: directory; capture: device index, file or URL
    loop: bool = False  # capture of a video file: play it again after its last frame
    # (default: the source ends there; the daemon keeps running and reports it once)
    watch: bool = True  # folder: keep watching for new files
    done_dir: str = ""  # folder: move inspected files here (empty: remember them instead)
    topic: str = ""  # trigger: MQTT topic; payload = image bytes (PNG/JPEG) or a file path
    # synthetic/capture/pylon: what starts a capture. "": the source's own pace; "opcua": one frame
    # per rising edge of the PLC (Trigger() or PartPresent false->true; docs/plc.md);
    # "modbus": the same over Modbus TCP (a PartPresent coil or a new part counter value)
    trigger: Literal["", "opcua", "modbus"] = ""
    # folder/trigger: images larger than this are refused from their header, before decoding
    max_pixels: int = DEFAULT_MAX_PIXELS
    # region of interest [x, y, w, h] cropped before preprocessing (empty: the whole frame)
    roi: tuple[float, ...] = ()
    roi_units: roi.Units = "pixels"  # or "fraction" (of the frame's width and height)
    # capture of an RTSP/HTTP URL: RTSP over TCP (or "udp"; "auto": FFmpeg's default)
    transport: Literal["tcp", "udp", "auto"] = "tcp"
    open_timeout_s: float = 10.0  # capture of a URL: give up connecting after this long
    read_timeout_s: float = 5.0  # capture of a URL, free-running pylon: silent this long = failed
    # capture of a stream: "opencv" (cv2.VideoCapture), "pyav" (PyAV: cheaper per frame, key
    # frames only under a low rate cap; the `streams` extra), "auto": PyAV for an RTSP URL
    # where it is installed; "rtp": an rtsp:// H.264 camera read by edgerun's own RTSP client
    # over TCP and decoded by PyAV (less CPU than FFmpeg's RTSP reader, docs/sources.md)
    decoder: Literal["auto", "opencv", "pyav", "rtp"] = "auto"
    # capture: each frame converted to this [width, height] (empty: the camera's own size).
    # With PyAV the scaling is the pass that makes BGR anyway (a 720p frame to 192x108 costs
    # less than at full size, docs/sources.md); with OpenCV a resize after. For a small model
    # on a large stream, where nothing needs the full frame (snapshots, tiles); an roi is then
    # in fractions (pixels would be the camera's, not the converted frame's)
    frame_size: tuple[int, ...] = ()
    # [[sources]] only (runtime/choice/joint.py, docs/sources.md): the model inspecting this source,
    # a bundled model's name or a path ("": the [model] section's), and that model's tiling
    model: str = ""
    tiling: bool = False
    tile_size: int = 0  # frame pixels per tile side; 0: the model input's size
    tile_overlap: float = 0.2
    # pylon (a Basler camera through pypylon, runtime/frames/pylon_source.py, docs/sources.md):
    # the camera's serial number ("": the first camera found); exposure, gain and pixel
    # format set at open and checked against what the camera reports (None / "": the
    # camera's own); a .pfs feature file (saved by pylon Viewer) loaded before them
    serial: str = ""
    exposure_us: float | None = None
    gain_db: float | None = None
    pixel_format: str = ""
    features_file: str = ""

    def validate(self) -> tuple[str, str] | None:
        if self.name and not NAME.match(self.name):
            return "name", (f"must be 1-64 letters, digits, '_', '.' or '-', got "
                            f"{self.name!r}")
        if self.max_pixels < 1:
            return "max_pixels", f"must be >= 1, got {self.max_pixels}"
        if self.kind in ("folder", "capture") and not self.path:
            return "path", f"source kind {self.kind!r} needs a path"
        if self.trigger and self.kind not in ("synthetic", "capture", "pylon"):
            return "trigger", (f"a PLC trigger captures from a camera: kind must be "
                               f"'synthetic', 'capture' or 'pylon', got {self.kind!r}")
        if problem := self._pylon_problem():
            return problem
        if self.kind == "trigger" and not self.topic:
            return "topic", "source kind 'trigger' needs an MQTT topic"
        if not 0 <= self.defect_rate <= 1:
            return "defect_rate", f"must be within 0..1, got {self.defect_rate}"
        if self.rate_hz < 0:
            return "rate_hz", f"must be >= 0, got {self.rate_hz}"
        # the synthetic conveyor keeps a pool of 256 rendered parts: 0 or less killed the
        # capture thread at its first render, 5000 px would be 19 GB of pool
        if not 1 <= self.size <= MAX_SYNTHETIC_SIZE:
            return "size", f"must be 1..{MAX_SYNTHETIC_SIZE} pixels, got {self.size}"
        # each named by itself: the key locates the line, so naming the other sent a reader
        # to a line the file may not even have
        for key in ("open_timeout_s", "read_timeout_s"):
            if (v := getattr(self, key)) <= 0:
                return key, f"must be > 0, got {v:g}"
        if self.decoder == "rtp" and self.kind == "capture" and (
                not self.path.lower().startswith("rtsp://") or self.transport == "udp"):
            # the path is not quoted: it may hold credentials
            return "decoder", ("'rtp' reads an rtsp:// URL over TCP (transport 'tcp' or "
                               f"'auto'), got a path of scheme "
                               f"{self.path.partition(':')[0][:20]!r} with transport "
                               f"{self.transport!r}")
        if (self.model or self.tiling) and (problem := check_model(self)):
            return problem
        if problem := self._frame_size_problem():
            return problem
        if problem := roi.check(self.roi, self.roi_units):
            return "roi", problem
        if self.roi and self.kind == "synthetic":  # its frame size is known now
            try:
                roi.resolve(self.roi, self.roi_units, self.size, self.size, "roi")
            except roi.RoiError as e:
                return "roi", str(e)
        return None

    def _frame_size_problem(self) -> tuple[str, str] | None:
        """What is wrong with `frame_size` (None when nothing is): a capture source's, two
        whole pixel counts, with an roi in fractions."""
        if not self.frame_size:
            return None
        if self.kind != "capture":
            return "frame_size", (f"is a setting of a capture source, this source's kind is "
                                  f"{self.kind!r}")
        if len(self.frame_size) != 2 or not all(
                int(v) == v and MIN_FRAME_SIDE <= v <= MAX_FRAME_SIDE for v in self.frame_size):
            return "frame_size", (f"must be [width, height], whole pixels within "
                                  f"{MIN_FRAME_SIDE}..{MAX_FRAME_SIDE}, got "
                                  f"{list(self.frame_size)}")
        if self.roi and self.roi_units == "pixels":
            return "roi_units", ('must be "fraction" with frame_size: an roi in pixels would '
                                 "be of the camera's frame, not of the converted one")
        return None

    def _pylon_problem(self) -> tuple[str, str] | None:
        """What is wrong with the pylon keys (None when nothing is): set only on a pylon
        source, in range, names of plain characters (they go into the camera's node map)."""
        given = [k for k in ("serial", "exposure_us", "gain_db", "pixel_format",
                             "features_file") if getattr(self, k) not in ("", None)]
        if self.kind != "pylon":
            return (given[0], f"is a setting of a pylon camera, this source's kind is "
                              f"{self.kind!r}") if given else None
        if self.exposure_us is not None and not 0 < self.exposure_us <= 1e8:
            return "exposure_us", f"must be within 0..1e8 microseconds, got {self.exposure_us}"
        if self.gain_db is not None and not -100 <= self.gain_db <= 100:
            return "gain_db", f"must be within -100..100 dB, got {self.gain_db}"
        for key in ("serial", "pixel_format"):
            if not re.fullmatch(r"[A-Za-z0-9_.-]{0,64}", getattr(self, key)):
                return key, (f"must be up to 64 letters, digits, '_', '.' or '-', got "
                             f"{getattr(self, key)[:80]!r}")
        if self.features_file:
            try:
                if not Path(self.features_file).expanduser().is_file():
                    return "features_file", Absent(f"{self.features_file}: no such file")
            except (OSError, ValueError) as e:
                return "features_file", Absent(f"{self.features_file[:200]}: {e}")
        return None


def check_sources(sources: Sequence[Any], single_given: bool) -> tuple[str, str] | None:
    """What is wrong with a `[[sources]]` list as a whole (None when nothing is): each entry
    has a unique name and a rate (the combined rate sizes the latency target and the energy
    budget), and `[source]` is not given as well."""
    if not sources:
        return None
    if single_given:
        return "sources", "give either one [source] or several [[sources]], not both"
    if len(sources) > MAX_SOURCES:
        return "sources", (f"at most {MAX_SOURCES} sources per daemon (health reports each), "
                           f"got {len(sources)}")
    names = [s.name for s in sources]
    for i, s in enumerate(sources):
        if not s.name:
            return "sources", (f"entry {i + 1} ({s.kind}) needs a name: results and health "
                               "name their source")
        if s.rate_hz <= 0:
            return "sources", (f"{s.name}: rate_hz must be > 0 with several sources (the "
                               f"combined rate sizes the latency target and the energy "
                               f"budget), got {s.rate_hz}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        return "sources", f"names must be unique, {', '.join(dup)} is used more than once"
    tiling: dict[Path, Any] = {}
    for s in sources:  # one session per model: a model is tiled one way
        if not s.model:
            continue
        p = model_path(s.model).resolve()
        first = tiling.setdefault(p, s)
        if (first.tiling, first.tile_size, first.tile_overlap) != (
                s.tiling, s.tile_size, s.tile_overlap):
            return "sources", (f"{first.name} and {s.name} both use model {s.model!r} but tile "
                               "it differently (tiling, tile_size, tile_overlap): the sources "
                               "of a model share its session, so they must agree")
    return None


def model_path(name: str) -> Path:
    """Where a `[[sources]] model` is: a path (it has a '/' or ends in .onnx; '~' expanded),
    else the name of a bundled model (models/<name>)."""
    if "/" in name or name.endswith(".onnx"):
        return Path(name).expanduser()
    return BUNDLED_MODELS / name


def bundled_names() -> list[str]:
    """The bundled models (directories of models/ with a manifest), sorted."""
    try:
        return sorted(d.name for d in BUNDLED_MODELS.iterdir()
                      if (d / "manifest.json").is_file())
    except OSError:  # an install without the models package data
        return []


def check_model(s: Any) -> tuple[str, str] | None:
    """What is wrong with one entry's `model` and tiling keys (None when nothing is): the
    model exists (a directory with a manifest, or an .onnx file) and the tile options are in
    range; tiling is set with the model it tiles (the [model]'s own is tiled in [model])."""
    if s.tiling and not s.model:
        return "tiling", ("tiles a model named in this entry; the [model] section's own model "
                          "is tiled by [model] tiling")
    if s.model:
        # a hostile string must not reach the filesystem, the log or health unchecked
        if len(s.model) > MAX_MODEL_CHARS or any(ord(c) < 32 or ord(c) == 127
                                                 for c in s.model):
            return "model", (f"must be a model's name or path of at most {MAX_MODEL_CHARS} "
                             f"characters with no control characters, got "
                             f"{s.model[:80]!r}{'...' if len(s.model) > 80 else ''}")
        p = model_path(s.model)
        # a path may be on a mount not up yet, or provisioned later: retried at start; a
        # bare name is a bundled model's, so one not found is a typo: the unit stops
        late = Absent if "/" in s.model or s.model.endswith(".onnx") else str
        try:
            found = (p / "manifest.json").is_file() or (p.suffix == ".onnx" and p.is_file())
        except OSError as e:  # a name too long, a symlink loop: not there either
            return "model", late(f"{s.model!r}: cannot look there: {e.strerror or e}")
        if not found:
            return "model", late(f"{s.model!r}: no model there ({p} is neither a directory "
                                 f"with a manifest.json nor an .onnx file); bundled models: "
                                 f"{', '.join(bundled_names())}")
    if not 0 <= s.tile_size <= 16384:
        return "tile_size", ("must be 0 (the model input's size) or up to 16384 pixels, "
                             f"got {s.tile_size}")
    if not 0.0 <= s.tile_overlap <= 0.75:
        return "tile_overlap", f"must be within 0..0.75, got {s.tile_overlap}"
    return None
