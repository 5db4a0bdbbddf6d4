"""An IP camera for tests and benches: GStreamer's RTSP server serving live H.264, each frame's
number drawn into the picture, run by the SYSTEM Python (`/usr/bin/python3`, where Debian's
python3-gi and gir1.2-gst-rtsp-server-1.0 live) as the camera's own process. Never imported by
the project or the tests (only rtsp_camera_code.py, beside it, is shared):
tests/support/rtsp_camera.py starts it and reads what it writes.

    /usr/bin/python3 rtsp_camera_server.py --port 0 --width 1280 --height 720 --fps 25 \
        --key-int 25 --log frames.log [--slices N] [--no-aud] [--aggregate MODE] \
        [--user U --password P]

It prints `READY <port>` on stdout once it listens (port 0: the kernel picks one; a restart
names the port again). The picture: a luma texture scrolling 3 rows a frame (so the encoder
and the decoder meet motion, as on a conveyor), and across the top eighth the frame number as
black/white blocks (tests/support/rtsp_camera_code.py). The number follows the
camera's own clock (frame n is due at start + n / fps), whether or not anyone watches, as a
camera's counter does. Each frame is logged when its encoded form leaves x264, as
`<n> <CLOCK_MONOTONIC ns at capture> <CLOCK_MONOTONIC ns when encoded>`, so a result is
mapped to its exact frame and its age measured on the same host's monotonic clock.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

# the code module lies beside this script: on sys.path even under PYTHONSAFEPATH (CI sets it,
# and then Python leaves the script's folder off)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rtsp_camera_code import PERIOD, band_h, luma, texture  # noqa: E402

X264_OFFSET = 1000 * 3600 * Gst.SECOND


class Camera:
    """Frames on the camera's clock into whichever media is playing (one at a time: shared)."""

    def __init__(self, a: argparse.Namespace):
        self.w, self.h, self.fps = a.width, a.height, a.fps
        self.period = PERIOD
        self.tex = texture(self.w, self.h, self.period)
        self.chroma = bytes([128]) * (2 * ((self.w // 2) * (self.h // 2)))
        self.band_h = band_h(self.h)
        self.t0 = time.monotonic()
        self.log = open(a.log, "a", buffering=1)  # noqa: SIM115 (lives as long as the process)
        self.lock = threading.Lock()
        self.captured: dict[int, int] = {}  # pts ns -> (n, capture ns) until encoded
        self.src = None
        self.gen = 0

    def picture(self, n: int) -> bytes:
        """Frame `n` in I420: the code bands (rtsp_camera_code.py) over the texture."""
        return luma(n, self.w, self.h, self.tex) + self.chroma

    def attach(self, src) -> None:
        """A new media is playing: push into its appsrc from now on."""
        with self.lock:
            self.src = src
            self.gen += 1
            gen = self.gen
        threading.Thread(target=self.push, args=(src, gen), daemon=True).start()

    def push(self, src, gen: int) -> None:
        interval = 1.0 / self.fps
        first = None
        while True:
            now = time.monotonic()
            n = int((now - self.t0) / interval) + 1  # the next frame due on the camera's clock
            time.sleep(max(0.0, self.t0 + n * interval - time.monotonic()))
            with self.lock:
                if self.gen != gen:
                    return
            cap = time.monotonic_ns()
            if first is None:
                first = n
            buf = Gst.Buffer.new_wrapped(self.picture(n))
            pts = (n - first) * Gst.SECOND // self.fps
            buf.pts, buf.duration = pts, Gst.SECOND // self.fps
            with self.lock:
                self.captured[pts] = (n, cap)
                if len(self.captured) > 500:  # frames the encoder dropped: forget them
                    for k in sorted(self.captured)[:250]:
                        del self.captured[k]
            if src.emit("push-buffer", buf) != Gst.FlowReturn.OK:
                return  # the media was torn down (last client left)

    def encoded(self, pad, info) -> Gst.PadProbeReturn:
        buf = info.get_buffer()
        with self.lock:  # x264enc shifts every timestamp by 1000 hours (for its B-frames)
            got = self.captured.pop(buf.pts % X264_OFFSET, None)
        if got is not None:
            self.log.write(f"{got[0]} {got[1]} {time.monotonic_ns()}\n")
        return Gst.PadProbeReturn.OK


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--width", type=int, default=1280)
    p.add_argument("--height", type=int, default=720)
    p.add_argument("--fps", type=int, default=25)
    p.add_argument("--key-int", type=int, default=25)
    p.add_argument("--bitrate", type=int, default=0, help="kbit/s (0: by size)")
    p.add_argument("--preset", default="ultrafast")
    p.add_argument("--slices", type=int, default=1, help="slices per picture (x264's slices)")
    # many cameras send no access-unit delimiters: a picture's end is then seen only from
    # the next picture's first NAL
    p.add_argument("--no-aud", action="store_true", help="no access-unit delimiters")
    # relays and some cameras bundle small NALs into STAP-A packets (rtph264pay's modes)
    p.add_argument("--aggregate", default="none", help="none, zero-latency or max-stap")
    p.add_argument("--mount", default="/cam")
    p.add_argument("--log", required=True)
    p.add_argument("--user", default="")
    p.add_argument("--password", default="")
    a = p.parse_args()
    Gst.init(None)
    if Gst.ElementFactory.find("x264enc") is None:
        print("MISSING x264enc (gstreamer1.0-plugins-ugly)", flush=True)
        return 3
    cam = Camera(a)
    kbps = a.bitrate or max(500, a.width * a.height * a.fps // 11000)
    caps = f"video/x-raw,format=I420,width={a.width},height={a.height},framerate={a.fps}/1"
    launch = (f"( appsrc name=src is-live=true format=time do-timestamp=false block=false "
              f"max-bytes={a.width * a.height * 6} caps={caps} ! queue max-size-buffers=2 "
              f"leaky=downstream ! x264enc name=enc tune=zerolatency speed-preset={a.preset} "
              f"key-int-max={a.key_int} bitrate={kbps} threads=1 aud={str(not a.no_aud).lower()} "
              f"option-string=slices={a.slices} ! "
              f"rtph264pay name=pay0 pt=96 config-interval=-1 aggregate-mode={a.aggregate} )")
    server = GstRtspServer.RTSPServer()
    server.set_service(str(a.port))
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(launch)
    factory.set_shared(True)  # every client sees the same frames, as from one camera

    def configure(_factory, media) -> None:
        element = media.get_element()
        element.get_by_name("enc").get_static_pad("src").add_probe(
            Gst.PadProbeType.BUFFER, cam.encoded)
        cam.attach(element.get_by_name("src"))

    factory.connect("media-configure", configure)
    if a.user:
        auth = GstRtspServer.RTSPAuth()
        token = GstRtspServer.RTSPToken()
        token.set_string("media.factory.role", "user")
        auth.add_basic(GstRtspServer.RTSPAuth.make_basic(a.user, a.password), token)
        server.set_auth(auth)
        perms = GstRtspServer.RTSPPermissions()
        perms.add_permission_for_role("user", "media.factory.access", True)
        perms.add_permission_for_role("user", "media.factory.construct", True)
        factory.set_permissions(perms)
    server.get_mount_points().add_factory(a.mount, factory)
    if server.attach(None) == 0:
        print(f"FAILED to listen on port {a.port}", flush=True)
        return 2
    print(f"READY {server.get_bound_port()}", flush=True)
    loop = GLib.MainLoop()
    GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, 15, loop.quit)  # SIGTERM: leave cleanly
    loop.run()
    os._exit(0)  # pusher threads may sit in a push: do not wait for them


if __name__ == "__main__":
    sys.exit(main())
