"""Decoding a live H.264 camera: which path, at what CPU, how fresh. Against the real RTSP
camera of tests/support/rtsp_camera.py (GStreamer's server, 720p25 by default, a key frame
every `--key-int` frames), every path reading the same stream at the same time (the camera's
media is shared), so the ratios are measured side by side on one loaded host:

- `cv2`: OpenCV's capture (what runtime/frames/capture_source.py CaptureSource uses), one decoder
  thread, every frame decoded and converted to BGR (CaptureSource, under a rate cap, converts
  only the frames it may serve);
- `av`: PyAV (FFmpeg's libraries, its wheel's own FFmpeg), one decoder thread, every frame;
- `av-scaled`: PyAV, every frame, converted to BGR and scaled to `--to` pixels in one
  swscale pass (what "decoder-side scaling" can mean for H.264: FFmpeg's H.264 decoder has
  no reduced-resolution decode) against `cv2+resize` (full BGR, then cv2.resize);
- `av-keyframes`: PyAV with `skip_frame = NONKEY`: only key frames decoded (a rate cap at or
  below the stream's key-frame rate, 1 fps at `--key-int 25`);
- `av-keys-nolf`: the same without the deblocking filter (`skip_loop_filter = all`): a key
  frame decoded alone is no other frame's reference, the filter only smooths its edges.

For each: CPU (the thread's own clock: every path decodes on the thread that reads) per
decoded frame and per served frame at a 1 fps rate cap (the cap serves one frame a second;
every path but key-frames-only still decodes all 25), the age of each decoded frame from the
camera's encoding (the frame number is read from its picture), and whether the path gives
the frame's PTS.

`--compare 1,4`: N live 720p cameras (N processes), read at the same time by edgerun's source
path (a Pipeline with one lane per camera: the newest-frame reader of `decoder = "auto"`,
PyAV's AvStreamSource where installed, preprocess, ONNX Runtime on a tiny 32x32
classifier) in one process and by a hand-written loop (cv2.VideoCapture -> preprocess ->
infer, a thread per stream, OpenCV's default decoder threads) in another: frames/s,
process CPU per frame, decode's share of it (edgerun: its decode stage; the hand loop: what
its process spent outside preprocess, inference and the bench's frame-number reading), the
frame age from the camera's encoding to the start of inference p50/p99, edgerun's CPU per
frame by stage; and edgerun at a 1 fps cap per stream: decode CPU per served frame against
the hand loop's per frame, measured once every PyAV reader decodes key frames only (its
steady state; the switch, 2-3 s after a connection, is said apart).

`--age`: where a frame's age goes, stage by stage (the camera's capture -> its encoding ->
out of the demuxer -> decoded), FFmpeg's default RTSP reading (its H.264 parser) against
edgerun's (AvStreamSource: no parser, NAL ends by fragment size), side by side.

`--split`: where AvStreamSource's reader CPU goes at a 1 fps cap, key frames only: reading
(PyAV's demuxer; `--decoders rtp`: edgerun's own RTSP client, RtpStreamSource), the NAL and
picture assembly, the key frame's decode, its conversion to BGR, against the same reader
decoding every frame; one part after another (not side by side). `--decoders pyav,rtp
--runs 2`: each decoder in turn, twice (`--compare` too: edgerun's side with each).

`--reader-caps 1,5,10`: each of edgerun's readers (OpenCV's CaptureSource, PyAV's
AvStreamSource) alone on the camera under each rate cap, taken as the pipeline takes it (a
reader that paces itself is read at once, another after a wait of 1/cap): frames served a
second and the reader's CPU per served frame (decode and conversion to BGR of every frame it
handled); one reader and cap after another. Run from another checkout's root
(`cp bench/streams.py OTHER/bench/x.py; python OTHER/bench/x.py --reader-caps ...`) to set
that tree's readers beside this one's.

`--read-floor`: what reading the stream costs a key-frames-only reader (no decode): PyAV's
demuxer (FFmpeg's RTSP over TCP: three small reads an RTP packet), with AvStreamSource's NAL
and picture assembly, and the same stream read in large recv()s with RTP and FU-A parsed in
Python (a measurement of what an RTSP client of edgerun's own could reach, not a reader).

`--ab TREE`: the rtp reader at a 1 fps hint (key frames only) from this checkout and from
another (TREE: a checkout's root, e.g. a `git worktree` of the commit before a change) side
by side: two processes at once on one camera, `--runs` rounds, which starts first
alternated: reader CPU per served frame, the served frames' age from the camera's capture to
their read (p50, max), and the client's reads a second (where TREE counts them). A change's
before and after, measured in the same minutes on the same host.

`--ab-compare TREE`: `--compare 1`'s uncapped children, edgerun's from this checkout and from
TREE and the hand loop, all three at once on one camera (`--decoders`' first decoder),
`--runs` rounds, which edgerun starts first alternated: process CPU per frame, and edgerun's
capture and reader threads' (the kernel's clock, 10 ms ticks: +/- 0.03 ms a frame over 15 s).
For a change to the capture thread (capture, preprocess and inference of an idle pipeline's
frame) measured side by side.

Usage: python bench/streams.py [--seconds 20] [--size 1280x720] [--key-int 25] [--to 224]
       [--compare 1,4 --compare-seconds 15] [--age] [--split] [--reader-caps 1,5,10]
       [--read-floor] [--decoders pyav,rtp] [--runs 2] [--ab TREE] [--ab-compare TREE]
"""

from __future__ import annotations

import argparse
import math
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

# `--compare` at a cap: the hand loop's window starts this long after its start, about when
# edgerun's (once its readers decode key frames only: 1 s + three key frames + one served)
SETTLE_S = 4.5


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



def _to_keyframes_only(src) -> None:
    """Hint a 1 fps cap and read until the source decodes key frames only (30 s at most),
    then one more frame: the one served at the switch carries the full decode before it."""
    src.rate_hint(1.0)
    t_end = time.monotonic() + 30
    while not src.keyframes_only and time.monotonic() < t_end:
        src.read(2.0)
    src.read(3.0)

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
           scale: int = 0, no_loop_filter: bool = False) -> None:
    """PyAV, one decoder thread; `keyframes`: skip_frame NONKEY; `scale`: BGR at scale x
    scale from swscale; `no_loop_filter`: skip_loop_filter ALL (no deblocking)."""
    import av

    c = av.open(cam.url, options={"rtsp_transport": "tcp"}, timeout=10)
    stream = c.streams.video[0]
    stream.thread_count = 1
    if keyframes:
        stream.codec_context.skip_frame = "NONKEY"
    if no_loop_filter:
        stream.codec_context.options = {"skip_loop_filter": "all"}
    # swscale on this thread, as AvStreamSource converts (PyAV 17+ otherwise starts a thread
    # pool per frame, its CPU off this thread's clock)
    kw = {"threads": 1} if int(av.__version__.split(".")[0]) >= 17 else {}
    c0 = time.thread_time()
    try:
        for frame in c.decode(stream):
            if stop.is_set():
                break
            if scale:
                frame.to_ndarray(format="bgr24", width=scale, height=scale, **kw)
                big = None
            else:
                big = frame.to_ndarray(format="bgr24", **kw)
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


def run_age(cam: RtspCamera, parser: bool, seconds: float, out: dict) -> None:
    """One PyAV reader, every frame, noting when each packet left the demuxer and when its
    frame was decoded: `parser` as FFmpeg reads RTSP by default, else as AvStreamSource does
    (no parser: NalAssembler, AccessUnits)."""
    import av

    from runtime.frames.av_source import AccessUnits, NalAssembler

    opts = {"rtsp_transport": "tcp"}
    if not parser:
        opts["fflags"] = "noparse+nofillin"
    c = av.open(cam.url, options=opts, timeout=10)
    s = c.streams.video[0]
    s.thread_count = 1
    cc = s.codec_context
    asm = None if parser else NalAssembler()
    aus = AccessUnits()
    rows: list[tuple[int | None, float, float]] = []  # (frame number, packet out, decoded)
    end = time.monotonic() + seconds
    try:
        for packet in c.demux(s):
            t_pkt = time.monotonic()
            if t_pkt > end:
                break
            if packet.size == 0:
                continue
            units = [packet] if asm is None else [
                av.Packet(pic) for nal, pts in asm.push(memoryview(packet), packet.pts)
                for pic, _, _ in aus.push(nal, pts)]
            for u in units:
                for f in cc.decode(u):
                    t_dec = time.monotonic()
                    rows.append((frame_number(f.to_ndarray(format="bgr24")), t_pkt, t_dec))
    finally:
        c.close()
    out["rows"] = rows
    if asm is not None:
        out["note"] = (f"NAL ends by size {'kept' if asm.early_ok else 'given up'}, "
                       f"{asm.misjudged} misjudged")


def age(a: argparse.Namespace) -> None:
    """`--age`: where a frame's age goes, FFmpeg's parser against edgerun's reader, side by
    side on one camera: capture -> encoded (the camera), encoded -> out of the demuxer (TCP,
    RTP, and FFmpeg's parser holding the frame for the next one's start), -> decoded."""
    w, h = (int(x) for x in a.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp, \
            RtspCamera(Path(tmp), width=w, height=h, key_int=a.key_int) as cam:
        got: dict[str, dict] = {"parser": {}, "edgerun": {}}
        runs = [threading.Thread(target=run_age, args=(cam, k == "parser", a.seconds, got[k]))
                for k in got]
        for t in runs:
            t.start()
        for t in runs:
            t.join(a.seconds + 60)
        times = cam.times()
    print(f"# {w}x{h} H.264 25 fps, both readers at once for {a.seconds:g} s; load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; ms p50/p99 (from 1 s in)")
    print(f"{'reader':8} {'frames':>6} {'capture->encoded':>17} {'encoded->packet':>16} "
          f"{'packet->decoded':>16} {'capture->decoded':>17}")
    for k, g in got.items():
        rows = g.get("rows", [])
        t_first = rows[0][2] + 1.0 if rows else 0.0
        rows = [r for r in rows if r[0] in times and r[2] >= t_first]
        if not rows:
            print(f"{k:8} no frames")
            continue
        cols = [[(times[n][1] - times[n][0]) * 1e3 for n, _, _ in rows],
                [(tp - times[n][1]) * 1e3 for n, tp, _ in rows],
                [(td - tp) * 1e3 for _, tp, td in rows],
                [(td - times[n][0]) * 1e3 for n, _, td in rows]]
        shown = [f"{statistics.median(c):.1f}/{np.percentile(c, 99):.1f}" for c in cols]
        print(f"{k:8} {len(rows):>6} {shown[0]:>17} {shown[1]:>16} {shown[2]:>16} "
              f"{shown[3]:>17}  {g.get('note', '')}")


def _thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each live thread of this process, by its Python name
    (threads of the same name added: a reader per stream; FFmpeg's and ONNX Runtime's own
    threads, which Python does not know, under "other")."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    tck = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        name = names.get(int(tid), "other")
        name = "reader" if name.startswith("reader-") else name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tck
    return out


def _child(role: str, urls: list[str], logs: list[str], seconds: float, cap_hz: float,
           frame_size: tuple[int, ...] = (), decoder: str = "auto") -> dict:
    """One side of `--compare`, in its own process: what it served, at what CPU and age;
    `frame_size`: edgerun's `[source] frame_size`; `decoder`: its `[source] decoder`."""
    import json  # noqa: F401 (the parent reads the dict as JSON)
    import resource

    from support.tiny_ort import tiny_variant

    def cam_times(log: str) -> dict[int, float]:
        out = {}
        with open(log) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3:
                    out[int(parts[0])] = int(parts[2]) / 1e9
        return out

    tmp = Path(tempfile.mkdtemp())
    m, backend, v = tiny_variant(tmp)
    starts: list[tuple[int, int | None, float]] = []  # (stream, frame number, t start)
    lock = threading.Lock()

    def note(i: int, img: np.ndarray, t0: float) -> None:
        n = frame_number(img)
        with lock:
            starts.append((i, n, t0))

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t_begin = time.monotonic()
    served = 0
    decode_s = other_s = 0.0
    settle_s = 0.0  # edgerun, capped: from the start until every reader ran key frames only
    per_stage: dict[str, float] = {}
    threads_s: dict[str, float] = {}  # edgerun: CPU by thread over the window
    if role == "hand":
        stop = threading.Event()
        counts = [0] * len(urls)
        work = [0.0] * len(urls)  # preprocess, inference, frame-number CPU per stream

        def loop(i: int, url: str) -> None:
            session = backend.load(v)
            cap = cv2.VideoCapture(url, cv2.CAP_FFMPEG)
            while not stop.is_set():
                ok, img = cap.read()
                if not ok:
                    break
                c0 = time.thread_time()
                tensor = m.preprocess.apply(img, v.model.input_shape)
                t0 = time.monotonic()
                session.infer(tensor)
                counts[i] += 1
                note(i, img, t0)  # every frame, as on edgerun's side
                # the frame number's reading is the bench's, not decode: kept out of the
                # decode share (edgerun's side pays it inside inference, not in `decode`)
                work[i] += time.thread_time() - c0
            cap.release()

        threads = [threading.Thread(target=loop, args=(i, u)) for i, u in enumerate(urls)]
        for t in threads:
            t.start()
        if cap_hz:  # the same part of the run as edgerun's capped window, roughly (its
            time.sleep(SETTLE_S)  # readers switching to key frames only first)
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t_begin = time.monotonic()
        counts0, work0 = list(counts), list(work)
        time.sleep(seconds)
        ru1, t_end = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        served = sum(counts) - sum(counts0)
        other_s = sum(work) - sum(work0)
        stop.set()
        for t in threads:
            t.join(30)
    else:
        from runtime.config.source import SourceConfig
        from runtime.frames.multisource import Lane, retry_cap_s
        from runtime.frames.pipeline import Active, Pipeline
        from runtime.frames.sources import open_source

        numbers: dict[int, tuple[int, np.ndarray]] = {}
        lane_of = {}

        def pre(img, shape):
            tensor = m.preprocess.apply(img, shape)
            numbers[id(tensor)] = img
            return tensor

        session = backend.load(v)

        class Timed:
            def infer(self, tensor):
                t0 = time.monotonic()
                out = session.infer(tensor)
                img = numbers.pop(id(tensor), None)
                if img is not None and (len(numbers) < 1000):
                    note(lane_of.get(id(img), 0), img, t0)
                return out

            def __getattr__(self, name):
                return getattr(session, name)

        opened: list = []

        def opener(i: int, url: str):
            cfg = SourceConfig(kind="capture", path=url, read_timeout_s=5,
                               frame_size=frame_size, decoder=decoder)
            src = open_source(cfg, tmp / "state")
            opened.append(src)
            read = src.read

            def tagged(timeout_s):
                f = read(timeout_s)
                if f is not None:
                    lane_of[id(f.image)] = i
                    if len(lane_of) > 2000:
                        lane_of.clear()
                return f

            src.read = tagged
            return src

        ls = [Lane(f"cam{i}", (lambda i=i, u=u: opener(i, u)), share=1 / len(urls),
                   retry_cap_s=retry_cap_s(SourceConfig(kind="capture", path=u)))
              for i, u in enumerate(urls)]
        p = Pipeline(ls, m, lambda rs: list(range(len(rs))), lambda e: None, preprocess=pre)
        p.rate_cap_hz = cap_hz * len(urls) if cap_hz else math.inf
        p.start(Active(0, v.id, Timed(), v.model.input_shape))
        time.sleep(1.0)
        if cap_hz:
            # the window is the capped steady state: a PyAV reader decodes every frame until
            # it has measured the key-frame rate (three key frames, ~2-3 s at a 1 s GOP),
            # which a window from 1 s in counted against the key-frames-only decode
            t_open = time.monotonic()
            while time.monotonic() - t_open < 30 and not (
                    len(opened) >= len(urls) and all(
                        getattr(s, "keyframes_only", True) for s in opened)):
                time.sleep(0.05)
            settle_s = time.monotonic() - t_open + 1.0
            time.sleep(1.5)  # the frame served at the switch carries the full decode before
        p.take_stage_cpu()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        th0 = _thread_cpu()
        t_begin = time.monotonic()
        starts.clear()
        time.sleep(seconds)
        served, stages = p.take_stage_cpu()
        ru1, t_end = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        threads_s = {k: v - th0.get(k, 0.0) for k, v in _thread_cpu().items()}
        p.stop()
        decode_s = stages["decode"] or 0.0
        per_stage = {k: (v or 0.0) for k, v in stages.items()}
    span = t_end - t_begin
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    if role == "hand":
        decode_s = max(cpu - other_s, 0.0)  # FFmpeg's threads: all that is not pre/infer
    times = [cam_times(log) for log in logs]
    # from 2 s into the window: the first frames after a connection are the camera's
    # start-up (both sides showed ~1 s there), not the path's steady age
    ages = [(t0 - times[i][n]) * 1e3 for i, n, t0 in starts
            if n is not None and n in times[i] and t0 >= t_begin + 2.0]
    return {"served": served, "span_s": span, "cpu_s": cpu, "decode_s": decode_s,
            "ages_ms": ages, "stages_s": per_stage if role != "hand" else {},
            "threads_s": threads_s if role != "hand" else {}, "settle_s": settle_s}


def compare(a: argparse.Namespace) -> None:
    """`--compare`: edgerun against the hand loop on the same cameras at the same time."""
    import json
    import subprocess

    w, h = (int(x) for x in a.size.split("x"))
    for n in (int(x) for x in a.compare.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            cams = [RtspCamera(Path(tmp), width=w, height=h, key_int=a.key_int,
                               name=f"cam{i}").start() for i in range(n)]
            try:
                # each decoder in turn, `--runs` times over (alternated: the host's load
                # drifts between runs, not between the decoders of one round)
                for run in range(a.runs):
                    for decoder in a.decoders.split(","):
                        for cap_hz in (0.0, 1.0):
                            args = [json.dumps([c.url for c in cams]),
                                    json.dumps([str(c.log) for c in cams]),
                                    str(a.compare_seconds), str(cap_hz), a.frame_size,
                                    decoder]
                            procs = {role: subprocess.Popen(
                                [sys.executable, __file__, "--child", role, *args],
                                stdout=subprocess.PIPE, text=True)
                                for role in ("edgerun", "hand")}
                            got = {}
                            for role, proc in procs.items():
                                out, _ = proc.communicate(timeout=a.compare_seconds + 120)
                                got[role] = json.loads(out.strip().splitlines()[-1])
                            print(f"## run {run + 1}, edgerun's decoder = {decoder!r}")
                            _report(n, cap_hz, got)
            finally:
                for c in cams:
                    c.close()


def _report(n: int, cap_hz: float, got: dict) -> None:
    load = os.getloadavg()[0]
    label = f"{n} stream{'s' if n > 1 else ''}" + (f", edgerun capped at {cap_hz:g} fps/stream"
                                                    if cap_hz else "")
    print(f"# {label} (load {load:.1f})")
    rows = {}
    for role in ("edgerun", "hand"):
        g = got[role]
        served = max(g["served"], 1)
        ages = g["ages_ms"]
        rows[role] = (g["served"] / g["span_s"], g["cpu_s"] / served * 1e3,
                      g["decode_s"] / max(g["cpu_s"], 1e-9), g["decode_s"] / served * 1e3,
                      statistics.median(ages) if ages else float("nan"),
                      float(np.percentile(ages, 99)) if ages else float("nan"))
    print(f"{'':8} {'frames/s':>8} {'CPU ms/frame':>12} {'decode share':>12} "
          f"{'decode ms/frame':>15} {'age p50':>8} {'age p99':>8}")
    for role, r in rows.items():
        print(f"{role:8} {r[0]:>8.1f} {r[1]:>12.2f} {r[2]:>12.2f} {r[3]:>15.2f} "
              f"{r[4]:>8.0f} {r[5]:>8.0f}")
    stages = got["edgerun"].get("stages_s", {})
    served = max(got["edgerun"]["served"], 1)
    print("edgerun's stages, CPU ms per frame: " + ", ".join(
        f"{k} {v / served * 1e3:.2f}" for k, v in stages.items()))
    # by thread (the kernel's clock, 10 ms ticks: +/- 0.03 ms a frame over 15 s at 25/s):
    # what no stage's clock holds shows here (the reader's hand-over, idle polls)
    threads = got["edgerun"].get("threads_s", {})
    print("edgerun's threads, CPU ms per frame: " + ", ".join(
        f"{k} {v / served * 1e3:.2f}" for k, v in sorted(threads.items(), key=lambda kv: -kv[1])
        if v > 0))
    e, hnd = rows["edgerun"], rows["hand"]
    if cap_hz:
        # the hand loop decodes every frame (it must, to stay live): at the cap, one served
        # frame costs it a second's decode of its stream, frames/s per stream x per frame
        full = hnd[3] * hnd[0] / n / cap_hz
        print(f"edgerun at {cap_hz:g} fps: decode CPU per served frame {e[3]:.2f} ms, "
              f"{e[3] / max(full, 1e-9):.2f}x a full decode's per served frame ({full:.2f} ms); "
              f"window from {got['edgerun'].get('settle_s', 0):.1f} s after the start, once "
              "every reader decoded key frames only")
        return
    print(f"edgerun / hand: frames/s {e[0] / max(hnd[0], 1e-9):.2f}x, CPU per frame "
          f"{e[1] / max(hnd[1], 1e-9):.2f}x, decode CPU per frame "
          f"{e[3] / max(hnd[3], 1e-9):.2f}x")


def _keys_reader(url: str, seconds: float, decoder: str = "pyav") -> dict:
    """AvStreamSource (`decoder` "rtp": RtpStreamSource) alone at a 1 fps hint, once it
    decodes key frames only: its reader's CPU per served frame, and of it the key frame's
    decode and its conversion to BGR (timed around those calls only, once a frame: the rest
    of the reader is not touched)."""
    from runtime.config.source import SourceConfig
    from runtime.frames.av_source import AvStreamSource
    from runtime.frames.rtp_source import RtpStreamSource

    spent = {"decode": 0.0, "convert": 0.0}
    base = RtpStreamSource if decoder == "rtp" else AvStreamSource

    class Timed(base):  # type: ignore[valid-type,misc]
        def _decoder(self, keys_only: bool):
            dec = super()._decoder(keys_only)
            if not keys_only:
                return dec

            class Dec:
                def decode(self, packet):
                    c0 = time.thread_time()
                    out = dec.decode(packet)
                    spent["decode"] += time.thread_time() - c0
                    return out

                def __getattr__(self, name):
                    return getattr(dec, name)
            return Dec()

    src = Timed(SourceConfig(kind="capture", path=url, read_timeout_s=5, decoder=decoder))
    bgr = src._bgr

    class Conv:  # the reformat and the array, as the reader makes them
        def reformat(self, frame, **kw):
            c0 = time.thread_time()
            img = bgr.reformat(frame, **kw).to_ndarray()
            if src.keyframes_only:
                spent["convert"] += time.thread_time() - c0

            class Done:
                def to_ndarray(self):
                    return img
            return Done()

    src._bgr = Conv()
    try:
        _to_keyframes_only(src)
        spent.update(decode=0.0, convert=0.0)
        n, cpu, t_end = 0, 0.0, time.monotonic() + seconds
        while time.monotonic() < t_end:
            f = src.read(3.0)
            if f is not None:
                n, cpu = n + 1, cpu + (f.decode_cpu_s or 0.0)
        return {"served": n, "cpu": cpu, **spent, "keys_only": src.keyframes_only}
    finally:
        src.close()


def _demux(url: str, seconds: float) -> tuple[float, int, list]:
    """PyAV's demuxer alone, as AvStreamSource opens H.264 over RTSP (no parser): its CPU a
    second, packets a second, and the packets (for the assembly's replay)."""
    import av

    c = av.open(url, options={"fflags": "noparse+nofillin", "rtsp_transport": "tcp"},
                timeout=(10, 5))
    try:
        packets = c.demux(c.streams.video[0])
        t_end = time.monotonic() + 2
        while time.monotonic() < t_end:
            next(packets)
        kept = []
        c0, t0 = time.thread_time(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            kept.append(next(packets))
        return (time.thread_time() - c0) / seconds, len(kept), kept
    finally:
        c.close()


def _rtp_read(url: str, seconds: float, keep: bool = True) -> tuple[float, int, list]:
    """edgerun's RTSP client alone (RtpStreamSource's reading: large recv()s, RTP and FU-A
    parsed): its CPU a second, payloads a second, and the payloads (for the assembly's
    replay; each kept as bytes, the copy outside the clock)."""
    from runtime.frames.av_source import NalAssembler
    from runtime.frames.rtsp_client import RtspClient

    c = RtspClient(url, 10, 5)
    keys_only = NalAssembler()  # as RtpStreamSource reads in key-frames-only mode
    keys_only.drop_types = frozenset({1, 2, 3, 4})
    c.rtp.follower = keys_only
    try:
        payloads = c.payloads()
        t_end = time.monotonic() + 2
        while time.monotonic() < t_end:
            next(payloads)
        kept, spent = [], 0.0
        c0, t0 = time.thread_time(), time.monotonic()
        n = 0
        while time.monotonic() - t0 < seconds:
            p = next(payloads)
            n += 1
            if keep:
                c1 = time.thread_time()
                kept.append((bytes(p.data), p.pts, p.ends))
                spent += time.thread_time() - c1
        return (time.thread_time() - c0 - spent) / seconds, n, kept
    finally:
        c.close()


def split(a: argparse.Namespace) -> None:
    """`--split`: where a key-frames-only reader's CPU goes at a 1 fps cap, one part after
    another on the same camera (each alone in this process: beside each other, the demuxers'
    GIL hand-overs inflated one another's CPU ~1.5-2x); for each of `--decoders` in turn,
    `--runs` rounds."""
    w, h = (int(x) for x in a.size.split("x"))
    with tempfile.TemporaryDirectory() as tmp, \
            RtspCamera(Path(tmp), width=w, height=h, key_int=a.key_int,
                       preset=a.preset) as cam:
        for run in range(a.runs):
            for decoder in a.decoders.split(","):
                print(f"## run {run + 1}, decoder = {decoder!r}")
                _split_one(a, cam, decoder)


def _split_one(a: argparse.Namespace, cam: RtspCamera, decoder: str) -> None:
    """One `--split` round for one decoder (pyav: FFmpeg's RTSP demuxer; rtp: edgerun's
    client)."""
    from runtime.config.source import SourceConfig
    from runtime.frames.av_source import AccessUnits, NalAssembler
    from runtime.frames.sources import open_source

    w, h = cam.width, cam.height
    keys = _keys_reader(cam.url, a.seconds, decoder)
    if decoder == "rtp":
        demux_s, n_packets, kept = _rtp_read(cam.url, a.seconds)
        units = kept
        reading = "reading (edgerun's client: RTSP, RTP, FU-A)"
    else:
        demux_s, n_packets, packets = _demux(cam.url, a.seconds)
        units = [(memoryview(p), p.pts, None) for p in packets]
        reading = "reading (PyAV's demuxer: RTSP over TCP, RTP)"
    # the NAL and picture assembly of key-frames-only mode, replayed on those packets
    asm, aus = NalAssembler(), AccessUnits()
    asm.drop_types = frozenset({1, 2, 3, 4})
    c0 = time.thread_time()
    for data, pts, ends in units:
        begun = asm.dropped_begun
        for nal, nal_pts in asm.push(data, pts, ends):
            aus.push(nal, nal_pts)
        if asm.dropped_begun != begun:
            aus.boundary()
    assemble_s = (time.thread_time() - c0) / a.seconds
    full = open_source(SourceConfig(kind="capture", path=cam.url, read_timeout_s=5,
                                    decoder=decoder), Path(tempfile.gettempdir()))
    try:
        full.read(5.0)
        n, cpu, t_end = 0, 0.0, time.monotonic() + a.seconds
        while time.monotonic() < t_end:
            f = full.read(3.0)
            if f is not None:
                n, cpu = n + 1, cpu + (f.decode_cpu_s or 0.0)
    finally:
        full.close()
    served = max(keys["served"], 1)
    total = keys["cpu"] / served * 1e3
    full_s = cpu / a.seconds * 1e3
    parts = {reading: demux_s * 1e3,
             "NAL and picture assembly (Python)": assemble_s * 1e3,
             "decoding the key frame": keys["decode"] / served * 1e3,
             "converting it to BGR": keys["convert"] / served * 1e3}
    rest = total - sum(parts.values())
    print(f"# key frames only at a 1 fps hint, {w}x{h}, a key frame every {a.key_int} "
          f"(load {os.getloadavg()[0]:.1f}): {keys['served']} served in {a.seconds:g} s, "
          f"{n_packets / a.seconds:.0f} packets/s; every frame decoded: {n / a.seconds:.1f} "
          "frames/s")
    print(f"reader CPU per served frame {total:.2f} ms = {total / max(full_s, 1e-9):.2f}x "
          f"the same reader decoding every frame for a second ({full_s:.2f} ms)")
    for k, v in parts.items():
        print(f"  {k:48} {v:6.2f} ms  {v / max(total, 1e-9):5.0%}")
    print(f"  {'the rest (hand-over, its packet loop; +/- noise)':48} {rest:6.2f} ms  "
          f"{rest / max(total, 1e-9):5.0%}")


def _pyav_read(url: str, seconds: float, assemble: bool) -> tuple[float, int]:
    """PyAV's demuxer as AvStreamSource reads H.264 over RTSP (TCP, no parser), `assemble`:
    with its NAL and picture assembly in key-frames-only mode (P slices followed, not
    gathered): (thread CPU ms a second, packets a second), after 2 s."""
    import av

    from runtime.frames.av_source import AccessUnits, NalAssembler

    c = av.open(url, options={"fflags": "noparse+nofillin", "rtsp_transport": "tcp"},
                timeout=(10, 5))
    asm, aus = NalAssembler(), AccessUnits()
    asm.drop_types = frozenset({1, 2, 3, 4})
    try:
        packets = c.demux(c.streams.video[0])
        t_end = time.monotonic() + 2
        while time.monotonic() < t_end:
            next(packets)
        n, c0, t0 = 0, time.thread_time(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            packet = next(packets)
            n += 1
            if assemble and packet.size:
                begun = asm.dropped_begun
                for nal, pts in asm.push(memoryview(packet), packet.pts):
                    aus.push(nal, pts)
                if asm.dropped_begun != begun:
                    aus.boundary()
        return (time.thread_time() - c0) / seconds * 1e3, round(n / seconds)
    finally:
        c.close()


def _rtsp_request(sock, buf: bytearray, method: str, url: str, cseq: int, extra: str = ""
                  ) -> tuple[str, str, bytearray]:
    """One RTSP request on `sock`: (reply head, body, the bytes read past it)."""
    import re

    sock.sendall(f"{method} {url} RTSP/1.0\r\nCSeq: {cseq}\r\n{extra}\r\n".encode())
    while b"\r\n\r\n" not in buf:
        buf += sock.recv(65536)
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    m = re.search(rb"Content-Length: *(\d+)", head, re.I)
    size = int(m.group(1)) if m else 0
    while len(rest) < size:
        rest += sock.recv(65536)
    return head.decode(), rest[:size].decode(), bytearray(rest[size:])


def _large_reads(url: str, seconds: float) -> tuple[float, int, int]:
    """A measurement, not a reader: RTSP over TCP (the test camera's: no credentials, no
    keep-alive) read in large recv()s, the interleaved frames, RTP headers and FU-A headers
    parsed in Python, key-frame NALs gathered by their FU start/end bits, P slices skipped:
    (thread CPU ms a second, RTP packets a second, key frames gathered), after 2 s."""
    import re
    import socket

    host, port = re.match(r"rtsp://([^:/]+):(\d+)", url).groups()  # type: ignore[union-attr]
    sock = socket.create_connection((host, int(port)), timeout=5)
    try:
        buf = bytearray()
        _, sdp, buf = _rtsp_request(sock, buf, "DESCRIBE", url, 1,
                                    "Accept: application/sdp\r\n")
        ctrl = re.search(r"a=control:(\S+)", sdp.split("m=video", 1)[1]).group(1)  # type: ignore[union-attr]
        track = ctrl if ctrl.startswith("rtsp") else url.rstrip("/") + "/" + ctrl
        head, _, buf = _rtsp_request(sock, buf, "SETUP", track, 2,
                                     "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n")
        session = re.search(r"Session: *([^;\r\n]+)", head).group(1)  # type: ignore[union-attr]
        _, _, buf = _rtsp_request(sock, buf, "PLAY", url, 3, f"Session: {session}\r\n")
        t_start, c0 = time.monotonic(), -1.0
        packets = keys = 0
        key_nal, in_key = bytearray(), False
        while (now := time.monotonic()) < t_start + 2 + seconds:
            if c0 < 0 and now > t_start + 2:
                c0, packets, keys = time.thread_time(), 0, 0
            chunk = sock.recv(262144)
            if not chunk:
                break
            buf += chunk
            i, n = 0, len(buf)
            while n - i >= 4:
                if buf[i] != 0x24:  # an RTSP reply between the frames: on to the next '$'
                    j = buf.find(b"$", i + 1)
                    i = n if j < 0 else j
                    continue
                size = (buf[i + 2] << 8) | buf[i + 3]
                if n - i < 4 + size:
                    break
                if buf[i + 1] == 0:  # RTP (channel 1: RTCP)
                    p = i + 4
                    h = p + 12 + 4 * (buf[p] & 0x0F)
                    if buf[p] & 0x10:  # a header extension
                        h += 4 + 4 * ((buf[h + 2] << 8) | buf[h + 3])
                    kind = buf[h] & 0x1F
                    packets += 1
                    if kind == 28:  # FU-A: start and end bits
                        fu = buf[h + 1]
                        if fu & 0x80:
                            in_key = (fu & 0x1F) == 5
                        if in_key:
                            key_nal += buf[h + 2:i + 4 + size]
                            if fu & 0x40:
                                keys += 1
                                key_nal.clear()
                    elif kind == 5:
                        keys += 1
                i += 4 + size
            del buf[:i]
        return (time.thread_time() - c0) / seconds * 1e3, round(packets / seconds), keys
    finally:
        sock.close()


def read_floor(a: argparse.Namespace) -> None:
    """`--read-floor`: what reading the stream costs a key-frames-only reader, alone on the
    camera, one way after another, alternated: PyAV's demuxer bare, with AvStreamSource's
    assembly, and large reads parsed in Python (the floor an RTSP client of edgerun's own
    could reach; docs/benchmarks.md)."""
    w, h = (int(x) for x in a.size.split("x"))
    print(f"# {w}x{h} H.264 25 fps, key frame every {a.key_int}; {a.seconds:g} s each after "
          "2 s; thread CPU ms a second")
    with tempfile.TemporaryDirectory() as tmp, \
            RtspCamera(Path(tmp), width=w, height=h, key_int=a.key_int) as cam:
        for _ in range(2):
            for name, run in (("PyAV demuxer", lambda: _pyav_read(cam.url, a.seconds, False)),
                              ("PyAV + assembly", lambda: _pyav_read(cam.url, a.seconds, True)),
                              ("large reads", lambda: _large_reads(cam.url, a.seconds)),
                              ("edgerun's client", lambda: _rtp_read(cam.url, a.seconds,
                                                                     False)[:2])):
                ms, pps, *keys = run()
                if name == "edgerun's client":  # (CPU s a second, payloads)
                    ms, pps = ms * 1e3, round(pps / a.seconds)
                print(f"{name:16} {ms:6.2f} ms/s  {pps:4d} packets/s"
                      f"{f'  {keys[0]} key frames' if keys else ''}  load "
                      f"{os.getloadavg()[0]:.1f}")


def _reader_at(kind, decoder: str, url: str, cap: float, seconds: float) -> tuple:
    """One reader alone at `cap` as the pipeline takes it: (served/s, from the first to the
    last served; reader CPU per served frame; frames passed over per served frame)."""
    from runtime.config.source import SourceConfig

    src = kind(SourceConfig(kind="capture", path=url, read_timeout_s=5, decoder=decoder))
    hint = getattr(src, "rate_hint", None)  # absent from a tree's older reader

    def one():
        if hint is not None:
            hint(cap)  # as the capture thread does before every read
        f = src.read(1.0)
        if f is not None and not getattr(src, "paced", False):
            time.sleep(1 / cap)  # the pipeline waits out the cap
        return f
    try:
        t_end = time.monotonic() + 3
        while time.monotonic() < t_end:
            one()
        times, cpu, passed = [], 0.0, 0
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end:
            if (f := one()) is not None:
                times.append(time.monotonic())
                cpu, passed = cpu + (f.decode_cpu_s or 0.0), passed + f.skipped
    finally:
        src.close()
    n = len(times)
    return ((n - 1) / (times[-1] - times[0]) if n > 2 else math.nan, cpu / max(n, 1) * 1e3,
            passed / max(n, 1))


def reader_caps(a: argparse.Namespace) -> None:
    """Each reader alone under each cap (`--reader-caps`): served/s, reader CPU per served."""
    from runtime.frames.av_source import AvStreamSource, pyav_available
    from runtime.frames.capture_source import CaptureSource

    w, h = (int(x) for x in a.size.split("x"))
    kinds = {"opencv": CaptureSource, **({"pyav": AvStreamSource} if pyav_available() else {})}
    print(f"# {w}x{h} H.264 at 25 fps, key frame every {a.key_int}; {a.seconds:g} s a reader "
          f"and cap after 3 s; the readers of {ROOT}")
    print(f"{'reader':8} {'cap Hz':>6} {'served/s':>8} {'reader CPU ms/served':>20} "
          f"{'passed/served':>13} {'load':>5}")
    with tempfile.TemporaryDirectory() as tmp, \
            RtspCamera(Path(tmp), width=w, height=h, key_int=a.key_int) as cam:
        for name, kind in kinds.items():
            for cap in (float(x) for x in a.reader_caps.split(",")):
                rate, ms, passed = _reader_at(kind, name, cam.url, cap, a.seconds)
                print(f"{name:8} {cap:>6g} {rate:>8.2f} {ms:>20.2f} {passed:>13.1f} "
                      f"{os.getloadavg()[0]:>5.1f}")


def _ab_child(url: str, seconds: float) -> dict:
    """One side of `--ab` (its tree first on sys.path): RtpStreamSource alone at a 1 fps
    hint once it decodes key frames only: served frames, reader CPU, what was served when,
    the client's reads."""
    from runtime.config.source import SourceConfig
    from runtime.frames.rtp_source import RtpStreamSource

    src = RtpStreamSource(SourceConfig(kind="capture", path=url, read_timeout_s=5,
                                       decoder="rtp"))
    try:
        _to_keyframes_only(src)
        client = src._client
        reads0 = getattr(client, "reads", None)
        n, cpu, seen, t0 = 0, 0.0, [], time.monotonic()
        while time.monotonic() - t0 < seconds:
            f = src.read(3.0)
            if f is not None:
                n, cpu = n + 1, cpu + (f.decode_cpu_s or 0.0)
                seen.append((frame_number(f.image), time.monotonic()))
        span = time.monotonic() - t0
        reads = (client.reads - reads0) / span if reads0 is not None else None
        return {"served": n, "cpu_ms": cpu / max(n, 1) * 1e3, "seen": seen,
                "reads_s": reads, "keys_only": src.keyframes_only}
    finally:
        src.close()


def ab(a: argparse.Namespace) -> None:
    """`--ab TREE`: this checkout's rtp reader against TREE's, side by side."""
    import json
    import subprocess

    w, h = (int(x) for x in a.size.split("x"))
    trees = {"this": str(ROOT), "other": str(Path(a.ab).resolve())}
    print(f"# {w}x{h} H.264 25 fps, key frame every {a.key_int}, a 1 fps hint; {a.seconds:g} s "
          f"a round, both at once; this = {trees['this']}, other = {trees['other']}")
    with tempfile.TemporaryDirectory() as tmp, \
            RtspCamera(Path(tmp), width=w, height=h, key_int=a.key_int,
                       preset=a.preset) as cam:
        for run in range(a.runs):
            order = list(trees) if run % 2 == 0 else list(trees)[::-1]
            procs = {k: subprocess.Popen([sys.executable, __file__, "--ab-child", trees[k],
                                          cam.url, str(a.seconds)], stdout=subprocess.PIPE,
                                         text=True) for k in order}
            got = {k: json.loads(p.communicate(timeout=a.seconds + 120)[0]
                                 .strip().splitlines()[-1]) for k, p in procs.items()}
            times = cam.times()
            line = []
            for k in trees:
                g = got[k]
                ages = sorted((t - times[n][0]) * 1e3 for n, t in g["seen"]
                              if n is not None and n in times)
                age = f"{statistics.median(ages):.0f}/{ages[-1]:.0f}" if ages else "n/a"
                reads = f"{g['reads_s']:.1f}" if g["reads_s"] is not None else "n/a"
                line.append(f"{k} {g['cpu_ms']:.2f} ms/served ({g['served']} served, age "
                            f"p50/max {age} ms, {reads} reads/s"
                            f"{'' if g['keys_only'] else ', NOT key frames only'})")
            print(f"round {run + 1} (load {os.getloadavg()[0]:.1f}): " + "; ".join(line),
                  flush=True)


def ab_compare(a: argparse.Namespace) -> None:
    """`--ab-compare TREE`: this checkout's pipeline against TREE's and the hand loop, at
    once, uncapped."""
    import json
    import subprocess

    w, h = (int(x) for x in a.size.split("x"))
    decoder = a.decoders.split(",")[0]
    trees = {"this": str(ROOT), "other": str(Path(a.ab_compare).resolve())}
    print(f"# {w}x{h} H.264 25 fps, key frame every {a.key_int}, decoder {decoder!r}, "
          f"uncapped; {a.compare_seconds:g} s a round, the three at once; this = "
          f"{trees['this']}, other = {trees['other']}")
    rows: dict[str, list[float]] = {"this": [], "other": [], "hand": []}
    with tempfile.TemporaryDirectory() as tmp, \
            RtspCamera(Path(tmp), width=w, height=h, key_int=a.key_int,
                       preset=a.preset) as cam:
        args = [json.dumps([cam.url]), json.dumps([str(cam.log)]), str(a.compare_seconds),
                "0", a.frame_size, decoder]
        for run in range(a.runs):
            order = list(trees) if run % 2 == 0 else list(trees)[::-1]
            procs = {k: subprocess.Popen(
                [sys.executable, str(Path(trees[k]) / "bench" / "streams.py"), "--child",
                 "edgerun", *args], stdout=subprocess.PIPE, text=True) for k in order}
            procs["hand"] = subprocess.Popen([sys.executable, __file__, "--child", "hand",
                                              *args], stdout=subprocess.PIPE, text=True)
            got = {k: json.loads(p.communicate(timeout=a.compare_seconds + 120)[0]
                                 .strip().splitlines()[-1]) for k, p in procs.items()}
            line = []
            for k in ("this", "other", "hand"):
                g = got[k]
                n = max(g["served"], 1)
                rows[k].append(g["cpu_s"] / n * 1e3)
                th = g.get("threads_s", {})
                line.append(f"{k} {g['cpu_s'] / n * 1e3:.2f} ms/frame" + (
                    f" (capture {th.get('capture', 0) / n * 1e3:.2f}, reader "
                    f"{th.get('reader', 0) / n * 1e3:.2f})" if k != "hand" else "")
                    + f" {g['served'] / g['span_s']:.1f}/s")
            print(f"round {run + 1} (load {os.getloadavg()[0]:.1f}): " + "; ".join(line),
                  flush=True)
    for k in ("this", "other"):
        print(f"{k} / hand, CPU per frame: " + ", ".join(
            f"{e / max(hd, 1e-9):.3f}x" for e, hd in zip(rows[k], rows["hand"], strict=True)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--key-int", type=int, default=25)
    ap.add_argument("--to", type=int, default=224)
    ap.add_argument("--preset", default="ultrafast",
                    help="the camera's x264 preset (ultrafast: no deblocking filter)")
    ap.add_argument("--compare", default="", help="stream counts, e.g. 1,4")
    ap.add_argument("--compare-seconds", type=float, default=15.0)
    ap.add_argument("--age", action="store_true", help="where the frame age goes")
    ap.add_argument("--read-floor", action="store_true",
                    help="what reading the stream costs: PyAV's demuxer against large reads")
    ap.add_argument("--split", action="store_true",
                    help="where the key-frames-only reader's CPU goes at a 1 fps cap")
    ap.add_argument("--reader-caps", default="",
                    help="rate caps, e.g. 1,5,10: each reader alone under each")
    ap.add_argument("--frame-size", default="",
                    help="--compare: edgerun's [source] frame_size, e.g. 128x72")
    ap.add_argument("--decoders", default="pyav",
                    help="--compare, --split: edgerun's [source] decoder(s), e.g. pyav,rtp")
    ap.add_argument("--runs", type=int, default=1,
                    help="--compare, --split: rounds over the decoders, alternated")
    ap.add_argument("--ab", default="",
                    help="another checkout's root: its rtp reader against this one's at a "
                    "1 fps hint, side by side, --runs rounds")
    ap.add_argument("--ab-compare", default="",
                    help="another checkout's root: its pipeline (capture thread) against "
                    "this one's and the hand loop, uncapped, at once, --runs rounds")
    ap.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    ap.add_argument("--ab-child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        import json

        role, urls, logs, seconds, cap_hz, size, decoder = a.child
        sys.path.insert(0, str(ROOT))
        print(json.dumps(_child(role, json.loads(urls), json.loads(logs), float(seconds),
                                float(cap_hz),
                                tuple(int(x) for x in size.split("x")) if size else (),
                                decoder)))
        return 0
    if a.ab_child:
        import json

        tree, url, seconds = a.ab_child
        sys.path.insert(0, tree)
        print(json.dumps(_ab_child(url, float(seconds))))
        return 0
    if skip_reason():
        print(f"skipped: {skip_reason()}")
        return 0
    if a.ab:
        ab(a)
        return 0
    if a.ab_compare:
        ab_compare(a)
        return 0
    if a.compare:
        compare(a)
        return 0
    if a.age:
        sys.path.insert(0, str(ROOT))
        age(a)
        return 0
    if a.read_floor:
        sys.path.insert(0, str(ROOT))
        read_floor(a)
        return 0
    if a.split:
        sys.path.insert(0, str(ROOT))
        split(a)
        return 0
    if a.reader_caps:
        sys.path.insert(0, str(ROOT))
        reader_caps(a)
        return 0
    try:
        import av  # noqa: F401
    except ImportError:
        print("skipped: PyAV is not installed (pip install av)")
        return 0
    w, h = (int(x) for x in a.size.split("x"))
    paths = {k: Path_(k) for k in ("cv2", "cv2+resize", "av", "av-scaled", "av-keyframes",
                                   "av-keys-nolf")}
    with tempfile.TemporaryDirectory() as tmp, \
            RtspCamera(Path(tmp), width=w, height=h, key_int=a.key_int,
                       preset=a.preset) as cam:
        stop = threading.Event()
        runs = [threading.Thread(target=run_cv2, args=(cam, paths["cv2"], stop)),
                threading.Thread(target=run_cv2, args=(cam, paths["cv2+resize"], stop, a.to)),
                threading.Thread(target=run_av, args=(cam, paths["av"], stop)),
                threading.Thread(target=run_av, args=(cam, paths["av-scaled"], stop, False,
                                                      a.to)),
                threading.Thread(target=run_av, args=(cam, paths["av-keyframes"], stop, True)),
                threading.Thread(target=run_av, args=(cam, paths["av-keys-nolf"], stop, True,
                                                      0, True))]
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
    print(f"# {w}x{h} H.264 at {fps} fps ({a.preset}), key frame every {a.key_int}; "
          f"{a.seconds:g} s, all "
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
