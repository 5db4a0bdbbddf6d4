"""A real IP camera in tests and benches: tests/support/rtsp_camera_server.py (GStreamer's RTSP
server, live H.264, the frame number drawn into each picture) run by the system Python as a
process of its own, and what a test needs around it.

- `RtspCamera(tmp_path, width=..., height=...).start()`: a camera on a free port; `url`,
  `kill()` + `start()` on the same port (a reboot, at another size too), `pause()` /
  `resume()` (SIGSTOP/SIGCONT: a stalled stream), `close()` (reaps it; also done by the
  parent-death signal of tests/support/children.py when the worker dies); `slices=N`: x264
  cuts each picture into N slices (as cameras do, so that a lost packet costs a slice).
- `frame_number(img)`: the number read back from a decoded frame (None when the code does not
  check out: a half-decoded or foreign picture); `damage(img, n)`: how much of it differs
  from the camera's frame n.
- `times()`: frame number -> (capture, encoded) on this host's CLOCK_MONOTONIC (seconds), what
  the camera logged: a result's age is `t_inference_start - times()[n][0]`.
- `skip_reason()`: why no camera can run here (no system python3-gi, no RTSP server, no
  x264enc), or "" when one can.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
from pathlib import Path

import cv2
import numpy as np

from support.rtsp_camera_code import BITS, band_h, code_rows, luma, texture

SYSTEM_PYTHON = "/usr/bin/python3"
SERVER = Path(__file__).with_name("rtsp_camera_server.py")

_PROBE = """
import gi
gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import Gst, GstRtspServer
Gst.init(None)
missing = [e for e in ("appsrc", "x264enc", "rtph264pay", "queue")
           if not Gst.ElementFactory.find(e)]
print("missing GStreamer elements: " + ", ".join(missing) if missing else "ok")
"""


@functools.cache
def skip_reason() -> str:
    """"" when a camera can run here, else why not (for pytest.skip)."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        return f"no system Python at {SYSTEM_PYTHON} (Debian's python3-gi lives there)"
    try:
        out = subprocess.run([SYSTEM_PYTHON, "-c", _PROBE], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"probing GStreamer failed: {e}"
    text = (out.stdout + out.stderr).strip()
    if out.returncode != 0:
        return ("GStreamer's RTSP server is not usable from the system Python (apt: "
                "python3-gi gir1.2-gst-rtsp-server-1.0): " + text.splitlines()[-1][:200])
    if text != "ok":
        return f"{text} (apt: gstreamer1.0-plugins-base/-good/-ugly)"
    return ""


def frame_number(img: np.ndarray) -> int | None:
    """The frame number drawn into `img` (BGR or gray, any size the camera's was scaled to):
    the centre of each block of the top band, checked against the inverted band below it."""
    h, w = img.shape[:2]
    # the server's geometry, in fractions (the picture may have been scaled); a few pixels
    # around each block's centre, green alone (it carries most of the luma): cheap enough
    # to read on every frame of a 1080p stream
    band = band_h(h)
    bw = w / BITS
    green = img[..., 1] if img.ndim == 3 else img
    rows_top = slice(int(band * 0.3), int(band * 0.7) + 1)
    rows_low = slice(int(band * 1.3), int(band * 1.7) + 1)
    n = 0
    for i in range(BITS):
        cols = slice(int(i * bw + bw * 0.35), int(i * bw + bw * 0.65) + 1)
        top = float(green[rows_top, cols].mean())
        low = float(green[rows_low, cols].mean())
        if abs(top - low) < 80:  # neither clearly black/white nor inverted: not our code
            return None
        n = n << 1 | (top > low)
    return n


@functools.cache
def _texture(w: int, h: int) -> bytes:
    return texture(w, h)


def damage(img: np.ndarray, n: int) -> float:
    """The share of `img`'s pixels (BGR, the camera's size) more than 40 levels off the
    camera's frame `n` (0.0: the picture as sent, up to coding noise; a picture decoded from
    a damaged one, or referencing one, reads 0.05-0.5 at 320x180)."""
    h, w = img.shape[:2]
    y = np.frombuffer(luma(n, w, h, _texture(w, h)), np.uint8).reshape(h, w).astype(np.int32)
    full = np.clip((y - 16) * 255 // 219, 0, 255)  # video range -> the BGR frame's full range
    return float((np.abs(img[..., 1].astype(np.int32) - full) > 40).mean())


def picture(n: int, w: int, h: int) -> np.ndarray:
    """A BGR picture carrying frame `n` as the camera draws it (on mid-grey)."""
    img = np.full((h, w), 128, np.uint8)
    rows = np.frombuffer(code_rows(n, w, h), np.uint8).reshape(-1, w)
    img[:len(rows)] = rows
    return cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)


class RtspCamera:
    """One camera process (see module doc)."""

    def __init__(self, tmp: Path, width: int = 1280, height: int = 720, fps: int = 25,
                 key_int: int = 25, user: str = "", password: str = "", name: str = "cam",
                 preset: str = "ultrafast", slices: int = 1, aud: bool = True,
                 aggregate: str = "none"):
        self.dir = Path(tmp)
        self.width, self.height, self.fps, self.key_int = width, height, fps, key_int
        self.user, self.password, self.preset = user, password, preset
        self.slices = slices  # x264's slices per picture (cameras cut pictures for resilience)
        self.aud = aud  # access-unit delimiters ahead of each picture (many cameras send none)
        self.aggregate = aggregate  # rtph264pay's STAP-A bundling (relays bundle small NALs)
        self.name = name
        self.log = self.dir / f"{name}-frames.log"
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self._times: dict[int, tuple[float, float]] = {}
        self._read_to = 0

    @property
    def url(self) -> str:
        """rtsp://127.0.0.1:<port>/cam (without credentials)."""
        return f"rtsp://127.0.0.1:{self.port}/cam"

    def url_with(self, user: str, password: str) -> str:
        """The URL carrying credentials."""
        return f"rtsp://{user}:{password}@127.0.0.1:{self.port}/cam"

    def start(self, timeout_s: float = 30.0, **changes) -> RtspCamera:
        """Start the camera (again on the same port, after `kill`); `changes`: width, height,
        fps, key_int for this start (a reboot into another resolution)."""
        for k, v in changes.items():
            setattr(self, k, v)
        args = [SYSTEM_PYTHON, str(SERVER), "--port", str(self.port), "--width",
                str(self.width), "--height", str(self.height), "--fps", str(self.fps),
                "--key-int", str(self.key_int), "--preset", self.preset, "--log", str(self.log),
                "--slices", str(self.slices)]
        if not self.aud:
            args.append("--no-aud")
        if self.aggregate != "none":
            args += ["--aggregate", self.aggregate]
        if self.user:
            args += ["--user", self.user, "--password", self.password]
        err = open(self.dir / f"{self.name}-server.err", "ab")  # noqa: SIM115
        deadline = time.monotonic() + timeout_s
        while True:
            self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, text=True)
            line = self._ready_line(deadline)
            if line.startswith("READY "):
                self.port = int(line.split()[1])
                err.close()
                return self
            self.close()
            if not line.startswith("FAILED") or time.monotonic() > deadline:
                err.close()
                raise RuntimeError(f"the RTSP camera did not start: {line!r} "
                                   f"({self.dir / (self.name + '-server.err')})")
            time.sleep(0.2)  # the port of a killed camera is not free yet: again

    def _ready_line(self, deadline: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            if sel.select(max(0.0, deadline - time.monotonic())):
                return self.proc.stdout.readline().strip()
            return "no READY line in time"
        finally:
            sel.close()

    def kill(self) -> None:
        """SIGKILL the camera and reap it (a power cut / reboot)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self._reap()

    def pause(self) -> None:
        """SIGSTOP: the connection stays open, nothing more arrives (a stalled stream)."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after `pause`."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self) -> None:
        """Stop the camera (SIGCONT first: a paused one would not see its SIGTERM) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None:
            self.proc.wait(10)
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None

    def times(self) -> dict[int, tuple[float, float]]:
        """Frame number -> (captured, encoded), CLOCK_MONOTONIC seconds, as logged so far."""
        if self.log.exists():
            with open(self.log, "rb") as f:
                f.seek(self._read_to)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line being written is read next time
            self._read_to += end
            for line in data[:end].splitlines():
                n, cap, enc = line.split()
                self._times[int(n)] = (int(cap) / 1e9, int(enc) / 1e9)
        return self._times

    def __enter__(self) -> RtspCamera:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.close()


def hardware_decode() -> tuple[dict[str, list[str]], str]:
    """What this box has for hardware H.264 decode, and why edgerun does not use it here:
    VAAPI (a DRM render node and an FFmpeg built with VAAPI) and V4L2 M2M (a video4linux
    memory-to-memory decoder and FFmpeg's h264_v4l2m2m). Returns (what was found, the reason
    none is usable: "" when one is)."""
    found: dict[str, list[str]] = {
        "render_nodes": sorted(str(p) for p in Path("/dev/dri").glob("renderD*")),
        "v4l2_devices": [], "pyav_hwdevices": [], "pyav_h264_decoders": []}
    v4l = Path("/sys/class/video4linux")
    for dev in sorted(v4l.glob("video*")) if v4l.is_dir() else []:
        name = (dev / "name").read_text().strip() if (dev / "name").exists() else "?"
        found["v4l2_devices"].append(f"{dev.name}: {name}")
    try:
        import av
        from av.codec.hwaccel import hwdevices_available

        found["pyav_hwdevices"] = sorted(hwdevices_available())
        found["pyav_h264_decoders"] = sorted(c for c in av.codecs_available
                                             if c.startswith("h264") and
                                             _decodes(av, c))
    except ImportError:
        pass
    why = []
    if not found["render_nodes"]:
        why.append("VAAPI: no DRM render node (/dev/dri/renderD*)")
    elif "vaapi" not in found["pyav_hwdevices"]:
        why.append("VAAPI: PyAV's FFmpeg is built without it "
                   f"(hw devices: {', '.join(found['pyav_hwdevices']) or 'none'})")
    else:
        return found, ""
    m2m = [d for d in found["v4l2_devices"] if "dec" in d.lower()]
    if not m2m:
        why.append("V4L2 M2M: no video4linux decoder device"
                   + (f" ({', '.join(found['v4l2_devices'])})" if found["v4l2_devices"] else ""))
    elif "h264_v4l2m2m" not in found["pyav_h264_decoders"]:
        why.append("V4L2 M2M: PyAV's FFmpeg has no h264_v4l2m2m")
    else:
        return found, ""
    return found, "; ".join(why)


def _decodes(av, name: str) -> bool:
    try:
        return av.Codec(name, "r") is not None
    except Exception:  # an encoder-only name (h264_nvenc)
        return False


class DamagingProxy:
    """A TCP proxy in front of the camera for RTSP over TCP (interleaved): requests pass
    untouched; from the camera, RTSP replies pass and every `every`-th RTP packet of channel 0
    has bytes of its payload flipped while `damaging` is set (the RTP header, the H.264
    NAL/FU headers and the `$` framing left whole: damage in flight, as a bad link's, that the
    transport does not see). `drop`: those packets are left out instead (a sequence gap, as
    a relay that drops packets under load). `url` is the camera's through the proxy;
    `damaged` counts the packets flipped or dropped; `close()` stops it and joins its
    threads."""

    def __init__(self, camera: RtspCamera, every: int = 7, drop: bool = False):
        import socket
        import threading

        self.camera, self.every, self.drop = camera, every, drop
        self.damaging = threading.Event()
        self.damaged = 0
        self._srv = socket.create_server(("127.0.0.1", 0))
        self._srv.settimeout(0.2)
        self.port = self._srv.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._socks: list = []
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)

    @property
    def url(self) -> str:
        """The camera's URL through the proxy."""
        return f"rtsp://127.0.0.1:{self.port}/cam"

    def _accept(self) -> None:
        import socket
        import threading

        while not self._stop.is_set():
            try:
                client, _ = self._srv.accept()
            except (TimeoutError, OSError):
                continue
            upstream = socket.create_connection(("127.0.0.1", self.camera.port), timeout=10)
            upstream.settimeout(None)
            self._socks += [client, upstream]
            for args in ((client, upstream, False), (upstream, client, True)):
                t = threading.Thread(target=self._pump, args=args, daemon=True)
                t.start()
                self._threads.append(t)

    def _pump(self, src, dst, from_camera: bool) -> None:
        buf = bytearray()
        n = 0
        try:
            while not self._stop.is_set():
                data = src.recv(65536)
                if not data:
                    break
                if not from_camera:
                    dst.sendall(data)
                    continue
                buf += data
                out = bytearray()
                while buf:
                    if buf[0] == 0x24:  # '$' channel len16: one interleaved packet
                        if len(buf) < 4:
                            break
                        size = int.from_bytes(buf[2:4], "big")
                        if len(buf) < 4 + size:
                            break
                        pkt = bytearray(buf[:4 + size])
                        del buf[:4 + size]
                        # RTP header 12 bytes + FU indicator and header 2: flip past them
                        if pkt[1] == 0 and size > 40 and self.damaging.is_set():
                            n += 1
                            if n % self.every == 0:
                                self.damaged += 1
                                if self.drop:
                                    continue
                                for i in range(4 + 30, 4 + size, 97):
                                    pkt[i] ^= 0x5A
                        out += pkt
                    else:  # an RTSP reply: headers, then Content-Length bytes of body
                        end = buf.find(b"\r\n\r\n")
                        if end < 0:
                            break
                        head = bytes(buf[:end + 4])
                        length = 0
                        for line in head.split(b"\r\n"):
                            if line.lower().startswith(b"content-length:"):
                                length = int(line.split(b":")[1])
                        if len(buf) < end + 4 + length:
                            break
                        out += buf[:end + 4 + length]
                        del buf[:end + 4 + length]
                dst.sendall(out)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(2)

    def close(self) -> None:
        """Stop accepting, cut every connection, join the threads."""
        self._stop.set()
        self._srv.close()
        for s in self._socks:
            with contextlib.suppress(OSError):
                s.shutdown(2)
            s.close()
        for t in self._threads:
            t.join(5)
