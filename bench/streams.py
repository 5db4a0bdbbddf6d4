"""Decoding a live H.264 camera: which path, at what CPU, how fresh. Against the real RTSP
camera of tests/support/rtsp_camera.py (GStreamer's server, 720p25 by default, a key frame
every `--key-int` frames), every path reading the same stream at the same time (the camera's
media is shared), so the ratios are measured side by side on one loaded host:

- `cv2`: OpenCV's capture (what runtime/frames/sources.py CaptureSource uses), one decoder
  thread, every frame decoded and converted to BGR;
- `av`: PyAV (FFmpeg's libraries, its wheel's own FFmpeg), one decoder thread, every frame;
- `av-scaled`: PyAV, every frame, converted to BGR and scaled to `--to` pixels in one
  swscale pass (what "decoder-side scaling" can mean for H.264: FFmpeg's H.264 decoder has
  no reduced-resolution decode) against `cv2+resize` (full BGR, then cv2.resize);
- `av-keyframes`: PyAV with `skip_frame = NONKEY`: only key frames decoded (a rate cap at or
  below the stream's key-frame rate, 1 fps at `--key-int 25`).

For each: CPU (the thread's own clock: every path decodes on the thread that reads) per
decoded frame and per served frame at a 1 fps rate cap (the cap serves one frame a second;
every path but key-frames-only still decodes all 25), the age of each decoded frame from the
camera's encoding (the frame number is read from its picture), and whether the path gives
the frame's PTS. Usage: python bench/streams.py [--seconds 20] [--size 1280x720]
[--key-int 25] [--to 224]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support.rtsp_camera import RtspCamera, frame_number, skip_reason  # noqa: E402


@dataclass
class Path_:
    """What one path measured."""

    name: str
    decoded: int = 0
    cpu_s: float = 0.0
    ages_ms: list[float] = field(default_factory=list)
    pts: bool = False
    error: str = ""
    first: float = 0.0  # monotonic time of the first and last frame decoded
    last: float = 0.0

    def tick(self, t: float) -> None:
        """A frame decoded at `t`."""
        self.first = self.first or t
        self.last = t
        self.decoded += 1


def _age(cam: RtspCamera, img: np.ndarray, out: Path_, t: float) -> None:
    n = frame_number(img)
    times = cam.times()
    if n is not None and n in times:
        out.ages_ms.append((t - times[n][1]) * 1e3)


def run_cv2(cam: RtspCamera, out: Path_, stop: threading.Event, resize: int = 0) -> None:
    """OpenCV's capture, one decoder thread (as CaptureSource opens a stream)."""
    cap = cv2.VideoCapture(cam.url, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, 1])
    c0 = time.thread_time()
    while not stop.is_set():
        ok, img = cap.read()
        if not ok:
            out.error = "read failed"
            break
        t = time.monotonic()
        if resize:
            cv2.resize(img, (resize, resize), interpolation=cv2.INTER_AREA)
        out.tick(t)
        out.cpu_s = time.thread_time() - c0
        if out.decoded % 5 == 0:  # the code reader's own CPU kept out of most frames
            c1 = time.thread_time()
            _age(cam, img, out, t)
            c0 += time.thread_time() - c1
    # its position in ms from the stream's first PTS (CAP_PROP_POS_MSEC): relative only
    out.pts = cap.get(cv2.CAP_PROP_POS_MSEC) > 0
    cap.release()


def run_av(cam: RtspCamera, out: Path_, stop: threading.Event, keyframes: bool = False,
           scale: int = 0) -> None:
    """PyAV, one decoder thread; `keyframes`: skip_frame NONKEY; `scale`: BGR at scale x
    scale from swscale."""
    import av

    c = av.open(cam.url, options={"rtsp_transport": "tcp"}, timeout=10)
    stream = c.streams.video[0]
    stream.thread_count = 1
    if keyframes:
        stream.codec_context.skip_frame = "NONKEY"
    c0 = time.thread_time()
    try:
        for frame in c.decode(stream):
            if stop.is_set():
                break
            if scale:
                frame.to_ndarray(format="bgr24", width=scale, height=scale)
                big = None
            else:
                big = frame.to_ndarray(format="bgr24")
            t = time.monotonic()
            out.tick(t)
            out.pts = out.pts or frame.pts is not None
            out.cpu_s = time.thread_time() - c0
            if big is not None and (keyframes or out.decoded % 5 == 0):
                c1 = time.thread_time()
                _age(cam, big, out, t)
                c0 += time.thread_time() - c1
    except Exception as e:  # reported in the table
        out.error = f"{type(e).__name__}: {e}"[:80]
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--key-int", type=int, default=25)
    ap.add_argument("--to", type=int, default=224)
    a = ap.parse_args()
    if skip_reason():
        print(f"skipped: {skip_reason()}")
        return 0
    try:
        import av  # noqa: F401
    except ImportError:
        print("skipped: PyAV is not installed (pip install av)")
        return 0
    w, h = (int(x) for x in a.size.split("x"))
    paths = {k: Path_(k) for k in ("cv2", "cv2+resize", "av", "av-scaled", "av-keyframes")}
    with tempfile.TemporaryDirectory() as tmp, \
            RtspCamera(Path(tmp), width=w, height=h, key_int=a.key_int) as cam:
        stop = threading.Event()
        runs = [threading.Thread(target=run_cv2, args=(cam, paths["cv2"], stop)),
                threading.Thread(target=run_cv2, args=(cam, paths["cv2+resize"], stop, a.to)),
                threading.Thread(target=run_av, args=(cam, paths["av"], stop)),
                threading.Thread(target=run_av, args=(cam, paths["av-scaled"], stop, False,
                                                      a.to)),
                threading.Thread(target=run_av, args=(cam, paths["av-keyframes"], stop, True))]
        for t in runs:
            t.start()
        time.sleep(a.seconds)
        stop.set()
        for t in runs:
            t.join(30)
    fps = 25
    full = paths["cv2"]
    full_ms = full.cpu_s / max(full.decoded, 1) * 1e3
    full_served = full.cpu_s / max(full.last - full.first, 1e-9) * 1e3
    print(f"# {w}x{h} H.264 at {fps} fps, key frame every {a.key_int}; {a.seconds:g} s, all "
          f"paths at once; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'path':14} {'frames':>6} {'CPU ms/frame':>12} {'x cv2':>6} "
          f"{'CPU ms/served @1fps':>19} {'x cv2 full':>10} {'age p50/p99 ms':>15} PTS")
    for p in paths.values():
        per = p.cpu_s / max(p.decoded, 1) * 1e3
        # at a 1 fps cap one frame a second is served: its cost is a second's decode CPU
        per_served = p.cpu_s / max(p.last - p.first, 1e-9) * 1e3
        ages = (f"{statistics.median(p.ages_ms):.0f}/{np.percentile(p.ages_ms, 99):.0f}"
                if p.ages_ms else "n/a")
        print(f"{p.name:14} {p.decoded:>6} {per:>12.2f} {per / full_ms:>6.2f} "
              f"{per_served:>19.1f} {per_served / full_served:>10.2f} {ages:>15} "
              f"{'yes' if p.pts else 'no'}{'  ' + p.error if p.error else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
