"""A Basler camera through pypylon (runtime/frames/pylon_source.py): the pure choices
table-tested; the source itself on pylon's camera emulator (PYLON_CAMEMU, shipped in the
pypylon wheel): free-running frames of each pixel format, features set and checked, one
frame per software trigger paired with the camera's frame number, a camera that is not
there (yet) reopened by the pipeline's backoff."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.under_test import child_env

from runtime.config.source import SourceConfig
from runtime.frames.frame import SourceError
from runtime.frames.pylon_source import CameraError, Found, applied_problem, choose, to_bgr
from runtime.frames.sources import open_source

try:
    import pypylon  # noqa: F401  # the `camera` extra, in `test`
    HAVE_PYLON = True
except ImportError:
    HAVE_PYLON = False
needs_pylon = pytest.mark.skipif(not HAVE_PYLON, reason="pypylon is not installed "
                                 "(pip install 'edgerun[camera]')")
PFS = "# {05D8C294-F295-4dfb-9D01-096BD04049F4}\n"  # a GenApi feature file's first line
EMULATED = "0815-0000"


# -- pure ----------------------------------------------------------------------------------

CAMS = [Found("0815-0000", "Emulation", "Basler Emulation (0815-0000)"),
        Found("40012345", "a2A1920-51gcBAS", "Basler a2A1920-51gcBAS (40012345)")]


@pytest.mark.parametrize("serial,found,want", [
    ("", CAMS, 0), ("40012345", CAMS, 1), ("0815-0000", CAMS, 0),
    ("999", CAMS, "no camera with that serial number; found: 0815-0000 (Basler Emulation "
                  "(0815-0000)), 40012345 (Basler a2A1920-51gcBAS (40012345))"),
    ("", [], "no camera found"), ("999", [], "no camera found"),
])
def test_the_camera_is_chosen_by_serial_or_is_the_first(serial, found, want):
    if isinstance(want, int):
        assert choose(serial, found) == want
    else:
        with pytest.raises(CameraError, match=want.replace("(", r"\(").replace(")", r"\)")):
            choose(serial, found)


@pytest.mark.parametrize("asked,got,step,ok", [
    (1000.0, 1000.0, 0.1, True),
    (1234.56, 1235.0, 0.1, True),  # the emulator rounds exposure to whole us: 0.04 %
    (100.0, 100.9, None, True),  # within 1 %
    (100.0, 102.0, None, False),
    (20.0, 35.0, 35.0, True),  # a camera whose exposure moves in steps of 35 us
    (20.0, 70.0, 35.0, False),
    (0.0, 0.0, None, True), (0.0, 0.1, None, False),  # gain 0 dB: no relative slack
])
def test_a_value_read_back_is_checked_against_the_asked_one(asked, got, step, ok):
    problem = applied_problem("exposure_us", asked, got, step, "us")
    assert (problem is None) == ok
    if not ok:
        assert problem.startswith(f"source.exposure_us = {asked:g}: the camera set {got:g} us")


@pytest.mark.parametrize("fmt,shape,want", [
    ("Mono8", (2, 3), [[7, 7, 7]]),
    ("BGR8Packed", (2, 3, 3), [[1, 2, 3]]),
    ("BGR8", (2, 3, 3), [[1, 2, 3]]),
    ("RGB8Packed", (2, 3, 3), [[3, 2, 1]]),
    ("BGRA8Packed", (2, 3, 4), [[1, 2, 3]]),
    ("Mono12", (2, 3), None), ("BayerRG8", (2, 3), None),  # pylon's converter does those
])
def test_frames_become_bgr_here_or_go_to_pylons_converter(fmt, shape, want):
    a = np.zeros(shape, np.uint8)
    a[...] = 7 if len(shape) == 2 else [1, 2, 3, 4][:shape[2]]
    out = to_bgr(a, fmt)
    if want is None:
        assert out is None
    else:
        assert out.shape == (2, 3, 3) and out.dtype == np.uint8
        assert out[0, 0].tolist() == want[0]


@pytest.mark.parametrize("keys,problem", [
    ({"kind": "synthetic", "serial": "1"}, "serial"),
    ({"kind": "capture", "path": "0", "exposure_us": 100.0}, "exposure_us"),
    ({"kind": "pylon", "exposure_us": 0.0}, "exposure_us"),
    ({"kind": "pylon", "gain_db": 500.0}, "gain_db"),
    ({"kind": "pylon", "pixel_format": "Mono8;rm"}, "pixel_format"),
    ({"kind": "pylon", "features_file": "/nonexistent/x.pfs"}, "features_file"),
    ({"kind": "folder", "path": "/tmp", "trigger": "modbus"}, "trigger"),
    ({"kind": "pylon", "trigger": "modbus", "serial": "40012345", "exposure_us": 500.0,
      "gain_db": 0.0, "pixel_format": "BayerRG8"}, None),
])
def test_pylon_keys_are_checked_when_the_config_is_loaded(keys, problem):
    got = SourceConfig(**keys).validate()
    assert (got[0] if got else None) == problem


# -- on pylon's camera emulator ------------------------------------------------------------

@pytest.fixture
def emu(monkeypatch):
    """One emulated camera (pylon reads PYLON_CAMEMU at each enumeration)."""
    monkeypatch.setenv("PYLON_CAMEMU", "1")


def parts(tmp_path: Path, n: int, size: int = 64) -> list[np.ndarray]:
    """`n` distinct images in tmp_path/imgs (the emulator plays a folder in name order)."""
    d = tmp_path / "imgs"
    d.mkdir()
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        # smooth (a random 8x8 grid blown up): a Bayer mosaic of it demosaics back closely
        img = cv2.resize(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8), (size, size),
                         interpolation=cv2.INTER_LINEAR)
        cv2.imwrite(str(d / f"part-{i:04d}.png"), img)
        out.append(img)
    return out


def pfs(tmp_path: Path, **features: str) -> str:
    """A feature file: the emulator playing tmp_path/imgs, plus `features`."""
    lines = {"TestImageSelector": "Off", "ImageFilename": str(tmp_path / "imgs"),
             "ImageFileMode": "On", **features}
    p = tmp_path / "camera.pfs"
    p.write_text(PFS + "".join(f"{k}\t{v}\n" for k, v in lines.items()))
    return str(p)


@needs_pylon
@pytest.mark.parametrize("fmt", ["BGR8Packed", "RGB8Packed", "Mono8", "BayerRG8", "Mono12"])
def test_free_running_frames_arrive_as_bgr_of_the_camera_image(tmp_path, emu, fmt):
    imgs = parts(tmp_path, 3)
    src = open_source(SourceConfig(kind="pylon", pixel_format=fmt,
                                   features_file=pfs(tmp_path)), tmp_path)
    try:
        assert src.live and src.camera.cam.PixelFormat.Value == fmt
        got = [src.read(5) for _ in range(3)]
    finally:
        src.close()
    for f in got:
        assert f is not None and f.image.shape == (64, 64, 3) and f.image.dtype == np.uint8
        assert f.camera_frame is not None and f.ref == f"frame-{f.camera_frame}"
        want = imgs[f.camera_frame % 3]  # the emulator counts from 0
        if fmt in ("BGR8Packed", "RGB8Packed"):
            assert np.array_equal(f.image, want)
            continue
        if fmt in ("Mono8", "Mono12"):  # one channel, the same in B, G and R (the emulator
            # weighs the colours its own way: close to OpenCV's grey, not equal)
            assert np.array_equal(f.image[..., 0], f.image[..., 2])
            gray = [cv2.cvtColor(o, cv2.COLOR_BGR2GRAY).astype(int) for o in imgs]
            diff = [np.abs(f.image[..., 0].astype(int) - g).mean() for g in gray]
        else:  # a Bayer mosaic demosaiced by pylon's converter: close, not equal
            diff = [np.abs(f.image.astype(int) - o).mean() for o in imgs]
        mine = f.camera_frame % 3
        assert diff[mine] < 25 and diff[mine] == min(diff), diff


@needs_pylon
def test_exposure_gain_and_pixel_format_are_set_and_read_back(tmp_path, emu):
    src = open_source(SourceConfig(kind="pylon", exposure_us=1234.56, gain_db=6.0,
                                   pixel_format="Mono8"), tmp_path)
    try:
        cam = src.camera.cam
        assert cam.ExposureTime.Value == pytest.approx(1234.56, abs=1)  # 1235: its rounding
        assert cam.ExposureAuto.Value == "Off" and cam.GainAuto.Value == "Off"
        assert cam.Gain.Value == pytest.approx(6.0, abs=0.01)
        assert cam.PixelFormat.Value == "Mono8" and cam.TriggerMode.Value == "Off"
        assert src.read(5).image.shape == (1040, 1024, 3)  # the emulator's own test image
    finally:
        src.close()


@needs_pylon
@pytest.mark.parametrize("keys,match", [
    ({"pixel_format": "YUV422_8"}, r"source.pixel_format 'YUV422_8': camera Emulation "
                                   r"0815-0000 offers Mono8, Mono10, .*BayerRG8"),
    ({"exposure_us": 2e7}, r"source.exposure_us = 2e\+07: camera Emulation 0815-0000 "
                           r"accepts 1..1e\+07 us \(ExposureTime\)"),
    ({"gain_db": 60.0}, r"source.gain_db = 60: camera Emulation 0815-0000 accepts 0..48 dB"),
    ({"serial": "21999999"}, r"source.serial '21999999': no camera with that serial "
                             r"number; found: 0815-0000"),
])
def test_a_setting_the_camera_refuses_names_the_key_and_what_it_offers(tmp_path, emu, keys,
                                                                      match):
    with pytest.raises(SourceError, match=match):
        open_source(SourceConfig(kind="pylon", **keys), tmp_path)
    # the camera was let go: it opens again at once
    open_source(SourceConfig(kind="pylon"), tmp_path).close()


@needs_pylon
def test_a_feature_file_the_camera_refuses_is_named(tmp_path, emu):
    bad = tmp_path / "bad.pfs"
    bad.write_text(PFS + "NoSuchFeature\t3\n")
    with pytest.raises(SourceError, match=f"source.features_file {bad}: the camera refused "
                                          "it: .*NoSuchFeature"):
        open_source(SourceConfig(kind="pylon", features_file=str(bad)), tmp_path)


@needs_pylon
def test_each_software_trigger_gives_its_own_frame_numbered_by_the_camera(tmp_path, emu):
    """Triggered: FrameStart / Software; read() fires one trigger and takes that frame.
    A frame nobody here asked for (fired behind the source's back, as a second trigger
    source would) is discarded, so the next read is still its own trigger's frame."""
    from runtime.frames.sources import PylonSource

    imgs = parts(tmp_path, 5)
    src = PylonSource(SourceConfig(kind="pylon", pixel_format="BGR8Packed", exposure_us=100,
                                   features_file=pfs(tmp_path, AcquisitionFrameRate="1000.00")),
                      triggered=True)
    try:
        cam = src.camera.cam
        assert not src.live
        assert (cam.TriggerSelector.Value, cam.TriggerMode.Value, cam.TriggerSource.Value) \
            == ("FrameStart", "On", "Software")
        seen = [src.read(5) for _ in range(12)]
        assert [f.camera_frame for f in seen] == list(range(12))  # its block ids, from 0
        for f in seen:
            assert np.array_equal(f.image, imgs[f.camera_frame % 5])
        # no trigger: no frame (a free-running camera would have sent some by now)
        time.sleep(0.05)
        assert cam.RetrieveResult(0, 0) is None or not cam.RetrieveResult(0, 0).IsValid()
        # a stray: a trigger the source did not fire
        assert cam.WaitForFrameTriggerReady(2000, 1)
        cam.ExecuteSoftwareTrigger()
        deadline = time.monotonic() + 5
        while cam.NumReadyBuffers.Value == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        f = src.read(5)
        assert src.camera.strays == 1
        assert f.camera_frame == 13 and np.array_equal(f.image, imgs[13 % 5])
    finally:
        src.close()


@needs_pylon
def test_a_free_running_camera_that_stops_sending_has_stalled(tmp_path, emu):
    """A camera that sends nothing for read_timeout_s (here: a frame every 4 s) is a
    SourceError, which the pipeline answers by reopening it with backoff. (The emulator
    paces its first frame too: none comes within the test.)"""
    parts(tmp_path, 1)
    src = open_source(SourceConfig(kind="pylon", read_timeout_s=0.6, features_file=pfs(
        tmp_path, AcquisitionFrameRate="0.25")), tmp_path)
    try:
        t0 = time.monotonic()
        with pytest.raises(SourceError, match=r"no frame for 0\.\d s \(read_timeout_s 0.6\): "
                                              "the camera stalled"):
            while time.monotonic() - t0 < 5:
                assert src.read(0.2) is None
    finally:
        src.close()


@needs_pylon
def test_a_camera_not_there_is_retried_until_it_appears(tmp_path, monkeypatch):
    """The pipeline's capture thread reopens a pylon source that failed (a camera unplugged,
    powered off, not yet booted) with its backoff, and frames come once the camera is
    found: here the second emulated camera appears when PYLON_CAMEMU goes from 1 to 2, after
    two failed opens. The outage is one `source_failed` event, however many opens fail."""
    from support.tiny_ort import tiny_variant

    from runtime.frames.pipeline import Active, Pipeline

    monkeypatch.setenv("PYLON_CAMEMU", "1")
    cfg = SourceConfig(kind="pylon", serial="0815-0001", pixel_format="Mono8")
    failures: list[str] = []

    def on_event(event: dict) -> None:
        if event.get("type") == "source_failed":
            failures.append(event["error"])

    m, backend, v = tiny_variant(tmp_path)
    out: list[dict] = []
    p = Pipeline(lambda: open_source(cfg, tmp_path), m,
                 lambda rs: out.extend(rs) or list(range(len(rs))), on_event)
    p.start(Active(0, v.id, backend.load(v), v.model.input_shape))
    try:
        deadline = time.monotonic() + 30  # two backoffs of at most 2 s each, then frames
        while p.counters["source_errors"] < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        monkeypatch.setenv("PYLON_CAMEMU", "2")  # the camera comes back
        while len(out) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        p.stop()
    assert p.counters["source_errors"] >= 2
    assert len(failures) == 1, failures
    assert "source.serial '0815-0001': no camera with that serial number; found: 0815-0000" \
        in failures[0]
    assert len(out) >= 3 and all(r["camera_frame"] >= 0 for r in out)
    assert [r["camera_frame"] for r in out] == sorted(r["camera_frame"] for r in out)


def test_without_pypylon_the_error_names_the_key_and_the_extra(tmp_path):
    """pypylon is an optional extra: without it a pylon source fails with what to install
    (a child process whose import of pypylon fails, as on a core install)."""
    code = ("import sys; sys.modules['pypylon'] = None\n"
            "from runtime.config.source import SourceConfig\n"
            "from runtime.frames.frame import SourceError\n"
            "from runtime.frames.sources import open_source\n"
            "try:\n    open_source(SourceConfig(kind='pylon'), __import__('pathlib').Path('.'))\n"
            "except SourceError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=child_env(Path(__file__).parents[1]), timeout=60, check=True)
    assert out.stdout.startswith('source.kind = "pylon" needs the pypylon package')
    assert "pip install 'edgerun[camera]'" in out.stdout


def _cli(tmp_path: Path, args: list[str], no_pypylon: bool, **env: str
         ) -> subprocess.CompletedProcess:
    """`python -m runtime.cli ARGS` in a child; `no_pypylon`: as on a core install."""
    code = ("import sys\n" + ("sys.modules['pypylon'] = None\n" if no_pypylon else "")
            + f"from runtime.cli import main\nsys.exit(main({args!r}))\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=child_env(Path(__file__).parents[1], **env))


def test_serve_refuses_a_pylon_source_without_pypylon_before_profiling(tmp_path,
                                                                      profile_cache):
    """Not a source retried for ever: the daemon stops at start with what to install."""
    from support.daemon_harness import write_config

    cfg = write_config(tmp_path, profile_cache, source='kind = "pylon"\nserial = "40012345"')
    r = _cli(tmp_path, ["serve", "--config", str(cfg)], no_pypylon=True)
    assert r.returncode == 2, r.stderr[-2000:]
    assert ('source.kind = "pylon" needs the pypylon package' in r.stderr
            and "pip install 'edgerun[camera]'" in r.stderr), r.stderr[-2000:]
    assert "profiling " not in r.stderr  # said before minutes of measuring


@pytest.mark.parametrize("no_pypylon", [False, True])
def test_check_says_whether_the_pylon_camera_is_there(tmp_path, no_pypylon):
    if not no_pypylon and not HAVE_PYLON:
        pytest.skip("pypylon is not installed (pip install 'edgerun[camera]')")
    cfg = tmp_path / "e.toml"
    cfg.write_text('[governor]\npolicy = "off"\n[source]\nkind = "pylon"\n'
                   'serial = "40012345"\n')
    r = _cli(tmp_path, ["check", str(cfg)], no_pypylon, PYLON_CAMEMU="1")
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("source ")]
    if no_pypylon:
        assert line == ("source main: pylon serial 40012345; note: pypylon is not installed: "
                        "pip install 'edgerun[camera]' (serve refuses to start)")
    else:
        assert line == ("source main: pylon serial 40012345; note: source.serial '40012345': "
                        "no camera with that serial number; found: 0815-0000 (Basler "
                        "Emulation (0815-0000)) (serve starts and retries it with backoff)")


@needs_pylon
def test_an_incomplete_frame_is_a_bad_frame_and_its_edge_is_triggered_again(tmp_path, emu):
    """A grab that fails (lost packets; the emulator's ForceFailedBuffer) is a bad frame of
    kind `truncated` and the PLC edge stays: the next read triggers again for the same part,
    so its verdict still comes, on a whole frame. Three failures in a row are a SourceError
    (the camera is reopened; the edge is still kept)."""
    from runtime.frames.edges import EdgeBoard
    from runtime.frames.frame import BadFrame
    from runtime.frames.sources import PylonSource
    from runtime.frames.trigger_source import EdgeTriggered

    imgs = parts(tmp_path, 4)
    board = EdgeBoard(["main"], 10)
    camera = PylonSource(SourceConfig(kind="pylon", pixel_format="BGR8Packed", exposure_us=100,
                                      features_file=pfs(tmp_path,
                                                        AcquisitionFrameRate="1000.00")),
                         triggered=True)
    src = EdgeTriggered(camera, board, "main")
    cam = camera.camera.cam
    try:
        for _ in range(2):
            board.push("main", "PartSeq")
        cam.ForceFailedBufferCount.Value = 1
        cam.ForceFailedBuffer.Execute()
        with pytest.raises(BadFrame) as bad:
            src.read(5)
        assert bad.value.kind == "truncated" and "grab failed" in bad.value.why
        assert board.pending("main") == 2  # the edge was put back
        got = [src.read(5), src.read(5)]
        assert [f.ref for f in got] == ["plc-1", "plc-2"]
        for f in got:
            assert np.array_equal(f.image, imgs[f.camera_frame % 4])
        board.push("main", "PartSeq")
        cam.ForceFailedBufferCount.Value = 3
        cam.ForceFailedBuffer.Execute()
        for _ in range(2):
            with pytest.raises(BadFrame):
                src.read(5)
        with pytest.raises(SourceError, match="3 grabs failed in a row"):
            src.read(5)
        assert board.pending("main") == 1
    finally:
        src.close()
