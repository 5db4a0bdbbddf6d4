"""rtsp_client.py: the SDP's H.264 track and control URLs, the Session and Transport headers,
WWW-Authenticate challenges and Digest responses (RFC 2617's own example) table-tested; then
the client against a scripted RTSP server on a real socket: Digest authentication, a wrong
password refused once with no credential said, the keep-alive before the session's timeout,
TEARDOWN on close, a server that never answers timed out by open_timeout_s."""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import re
import socket
import struct
import threading
import time

import pytest

from runtime.frames.frame import CredentialsRefused, OpenTimedOut, SourceError
from runtime.frames.rtsp_client import (
    BATCH_WAIT_S,
    KEY_LEAD_S,
    RtspClient,
    batch_wait,
    challenges,
    digest,
    interleaved_channel,
    parse_head,
    parse_sdp,
    resolve,
    session_of,
)

SPS, PPS = b"\x67\x42\xc0\x1e\xda", b"\x68\xce\x3c\x80"
SPROP = base64.b64encode(SPS).decode() + "," + base64.b64encode(PPS).decode()

GST_SDP = f"""v=0
o=- 1188340656180883 1 IN IP4 127.0.0.1
s=Session streamed with GStreamer
t=0 0
a=tool:GStreamer
a=type:broadcast
a=control:*
a=range:npt=now-
m=video 0 RTP/AVP 96
c=IN IP4 0.0.0.0
b=AS:2000
a=rtpmap:96 H264/90000
a=framerate:25
a=fmtp:96 packetization-mode=1;profile-level-id=42c01e;sprop-parameter-sets={SPROP}
a=control:stream=0
"""

AUDIO_FIRST_SDP = """v=0
s=cam
m=audio 0 RTP/AVP 0
a=rtpmap:0 PCMU/8000
a=control:trackID=0
m=video 0 RTP/AVP 35 97
a=rtpmap:35 H265/90000
a=rtpmap:97 H264/90000
a=fmtp:97 packetization-mode=1;sprop-parameter-sets=!!notbase64
a=control:rtsp://10.0.0.9/live/trackID=1
"""


@pytest.mark.parametrize(("sdp", "base", "want", "play"), [
    (GST_SDP, "rtsp://h:8554/cam/", ("rtsp://h:8554/cam/stream=0", 96, 90000, [SPS, PPS]),
     "rtsp://h:8554/cam/"),
    (GST_SDP.replace("a=control:*\n", ""), "rtsp://h/cam",
     ("rtsp://h/cam/stream=0", 96, 90000, [SPS, PPS]), "rtsp://h/cam"),
    # the H.264 track after an audio one and an H.265 payload; an absolute control; a
    # sprop that is not base64 (the parameter sets come in-band)
    (AUDIO_FIRST_SDP, "rtsp://10.0.0.9/live", ("rtsp://10.0.0.9/live/trackID=1", 97, 90000, []),
     "rtsp://10.0.0.9/live"),
    # no H.264 track
    (AUDIO_FIRST_SDP.replace("H264", "MP4V"), "rtsp://h/x", None, "rtsp://h/x"),
    ("", "rtsp://h/x", None, "rtsp://h/x"),
    ("m=video 0 RTP/SAVP 96\na=rtpmap:96 H264/90000\n", "rtsp://h/x", None, "rtsp://h/x"),
])
def test_the_sdps_h264_track_is_found(sdp, base, want, play):
    track, play_url = parse_sdp(sdp, base)
    got = None if track is None else (track.control, track.payload_type, track.clock_rate,
                                      track.params)
    assert got == want
    assert play_url == play


@pytest.mark.parametrize(("base", "control", "want"), [
    ("rtsp://h/cam", "trackID=1", "rtsp://h/cam/trackID=1"),
    ("rtsp://h/cam/", "trackID=1", "rtsp://h/cam/trackID=1"),
    ("rtsp://h/cam", "*", "rtsp://h/cam"),
    ("rtsp://h/cam", "", "rtsp://h/cam"),
    ("rtsp://h/cam", "RTSP://other/x", "RTSP://other/x"),
])
def test_control_urls_resolve_against_the_base(base, control, want):
    assert resolve(base, control) == want


@pytest.mark.parametrize(("values", "want"), [
    (["12345678;timeout=30"], ("12345678", 30.0)),
    (["abc"], ("abc", 60.0)),
    (["abc; timeout = 1"], ("abc", 2.0)),  # never a keep-alive storm
    ([], ("", 60.0)),
])
def test_the_session_header(values, want):
    assert session_of(values) == want


@pytest.mark.parametrize(("now", "next_key_at", "want"), [
    (10.0, 0.0, 0.0),  # the key frames' period not known: every byte as it comes
    (10.0, 11.0, BATCH_WAIT_S),  # the next key frame 1 s away: the longest wait
    (10.0, 10.3, 0.3 - KEY_LEAD_S),  # up to its lead
    (10.0, 10.0 + KEY_LEAD_S + 0.005, 0.0),  # within its lead (no zero timeval: forever)
    (10.0, 9.5, 0.0),  # overdue: read at once until it comes
])
def test_a_read_waits_between_key_frames_up_to_the_next_ones_lead(now, next_key_at, want):
    assert batch_wait(now, next_key_at) == pytest.approx(want)


def test_headers_challenges_and_transport():
    status, h = parse_head(b"RTSP/1.0 401 Unauthorized\r\nCSeq: 3\r\n"
                           b'WWW-Authenticate: Digest realm="cam", nonce="n1", qop="auth"\r\n'
                           b'WWW-Authenticate: Basic realm="cam"')
    assert status == 401 and h["cseq"] == ["3"]
    assert challenges(h["www-authenticate"]) == {
        "digest": {"realm": "cam", "nonce": "n1", "qop": "auth"}, "basic": {"realm": "cam"}}
    assert parse_head(b"HTTP/1.1 200 OK")[0] == 0
    assert interleaved_channel(["RTP/AVP/TCP;unicast;interleaved=2-3;ssrc=1"]) == 2
    assert interleaved_channel(["RTP/AVP/TCP;unicast"]) is None


def _md5(s: str) -> str:
    return hashlib.md5(s.encode()).hexdigest()


def test_digest_responses():
    # RFC 2617 3.5's own example
    ch = {"realm": "testrealm@host.com", "qop": "auth,auth-int",
          "nonce": "dcd98b7102dd2f0e8b11d0f600bfb0c093",
          "opaque": "5ccc069c403ebaf9f0171e9517f40e41"}
    got = digest("Mufasa", "Circle Of Life", "GET", "/dir/index.html", ch, 1, "0a4f113b")
    assert 'response="6629fae49393a05397450978507c4ef1"' in got
    assert "qop=auth" in got and "nc=00000001" in got and 'cnonce="0a4f113b"' in got
    assert 'opaque="5ccc069c403ebaf9f0171e9517f40e41"' in got and got.startswith("Digest ")
    # without qop: RFC 2069's response, as most cameras ask
    ch = {"realm": "IP Camera", "nonce": "abc123"}
    got = digest("admin", "pw", "DESCRIBE", "rtsp://h/cam", ch, 1, "c")
    ha1, ha2 = _md5("admin:IP Camera:pw"), _md5("DESCRIBE:rtsp://h/cam")
    assert f'response="{_md5(f"{ha1}:abc123:{ha2}")}"' in got and "qop" not in got


class ScriptedCamera:
    """An RTSP server on a real socket, one connection at a time: Digest authentication (or
    none with `user` empty), an SDP with one H.264 track, a session timeout of `timeout_s`,
    a few RTP packets after PLAY; every request kept in `requests`. `mute`: accepts and never
    answers."""

    def __init__(self, user: str = "op", password: str = "pw", timeout_s: int = 60,
                 mute: bool = False):
        self.user, self.password, self.timeout_s, self.mute = user, password, timeout_s, mute
        self.requests: list[str] = []
        self.playing = False
        self._srv = socket.create_server(("127.0.0.1", 0))
        self._srv.settimeout(0.2)
        self.port = self._srv.getsockname()[1]
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def url(self, user: str = "", password: str = "") -> str:
        cred = f"{user}:{password}@" if user else ""
        return f"rtsp://{cred}127.0.0.1:{self.port}/cam"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._srv.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(0.1)
                self.playing = False
                with contextlib.suppress(OSError):
                    self._serve(conn)

    def _serve(self, conn: socket.socket) -> None:
        buf, seq = b"", 0
        while not self._stop.is_set():
            try:
                data = conn.recv(65536)
            except TimeoutError:
                if self.playing:  # a packet every 0.1 s while playing
                    conn.sendall(self._packet(seq))
                    seq += 1
                continue
            if not data:
                return
            buf += data
            while b"\r\n\r\n" in buf:
                req, _, buf = buf.partition(b"\r\n\r\n")
                text = req.decode()
                self.requests.append(text)
                if self.mute:
                    continue
                conn.sendall(self._answer(text))

    def _answer(self, req: str) -> bytes:
        method = req.split()[0]
        cseq = re.search(r"CSeq: (\d+)", req).group(1)  # type: ignore[union-attr]
        head = f"CSeq: {cseq}\r\n"
        if self.user and method not in ("OPTIONS",) and not self._authorized(req, method):
            return (f'RTSP/1.0 401 Unauthorized\r\n{head}WWW-Authenticate: Digest '
                    f'realm="cam", nonce="n0nce"\r\n\r\n').encode()
        if method == "OPTIONS":
            return (f"RTSP/1.0 200 OK\r\n{head}Public: OPTIONS, DESCRIBE, SETUP, PLAY, "
                    "TEARDOWN, GET_PARAMETER\r\n\r\n").encode()
        if method == "DESCRIBE":
            body = GST_SDP.encode()
            return (f"RTSP/1.0 200 OK\r\n{head}Content-Base: {self.url()}/\r\n"
                    f"Content-Type: application/sdp\r\nContent-Length: {len(body)}\r\n\r\n"
                    ).encode() + body
        if method == "SETUP":
            return (f"RTSP/1.0 200 OK\r\n{head}Session: 5e55;timeout={self.timeout_s}\r\n"
                    "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n\r\n").encode()
        if method == "PLAY":
            self.playing = True
            return f"RTSP/1.0 200 OK\r\n{head}Session: 5e55\r\n\r\n".encode()
        return f"RTSP/1.0 200 OK\r\n{head}Session: 5e55\r\n\r\n".encode()

    @staticmethod
    def _packet(seq: int) -> bytes:
        """An interleaved RTP packet: one P slice, 3600 ticks (40 ms) after the last."""
        pkt = (b"\x80\x60" + seq.to_bytes(2, "big") + (seq * 3600).to_bytes(4, "big")
               + b"\x00\x00\x00\x01" + b"\x41\x9a" + bytes(50))
        return b"$\x00" + len(pkt).to_bytes(2, "big") + pkt

    def _authorized(self, req: str, method: str) -> bool:
        m = re.search(r'Authorization: Digest .*uri="([^"]+)".*response="([0-9a-f]+)"', req)
        if not m:
            return False
        ha1 = _md5(f"{self.user}:cam:{self.password}")
        return m.group(2) == _md5(f"{ha1}:n0nce:{_md5(f'{method}:{m.group(1)}')}")

    def close(self) -> None:
        self._stop.set()
        self._srv.close()
        self._t.join(5)


def test_digest_authentication_keep_alive_and_teardown(caplog):
    cam = ScriptedCamera(password="s3cret-pw", timeout_s=2)
    try:
        c = RtspClient(cam.url("op", "s3cret-pw"), open_timeout_s=5, read_timeout_s=5)
        try:
            assert c.track.params == [SPS, PPS]
            assert c.track.control == cam.url() + "/stream=0"
            it = c.payloads()
            got = [next(it) for _ in range(3)]
            assert [p.pts for p in got] == [0, 3600, 7200]
            assert all(p.ends and bytes(p.data[:5]) == b"\x00\x00\x00\x01\x41" for p in got)
            # the keep-alive before the 2 s session timeout (at half of it), as it reads on
            for _ in range(50):
                next(it)
                if any(r.startswith("GET_PARAMETER") for r in cam.requests):
                    break
        finally:
            c.close()
        deadline = time.monotonic() + 5
        while not any(r.startswith("TEARDOWN") for r in cam.requests) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        cam.close()
    methods = [r.split()[0] for r in cam.requests]
    assert methods[:5] == ["OPTIONS", "DESCRIBE", "DESCRIBE", "SETUP", "PLAY"], methods
    assert "GET_PARAMETER" in methods and methods[-1] == "TEARDOWN", methods
    # every request after the challenge carries the Digest answer, never the password
    assert all("Authorization: Digest" in r for r in cam.requests[2:])
    assert not any("s3cret" in r for r in cam.requests)


def test_a_wrong_password_is_refused_once_without_the_credentials():
    cam = ScriptedCamera()
    try:
        with pytest.raises(CredentialsRefused) as e:
            RtspClient(cam.url("op", "wrong-pw-9"), open_timeout_s=5, read_timeout_s=5)
        with pytest.raises(CredentialsRefused) as e2:
            RtspClient(cam.url(), open_timeout_s=5, read_timeout_s=5)  # none given
    finally:
        cam.close()
    msg = str(e.value)
    assert msg.startswith("source.path 'rtsp://***@127.0.0.1:") and "refused" in msg
    assert "wrong-pw-9" not in msg and "op:" not in msg
    assert e.value.__cause__ is None
    assert e.value.__context__ is None or e.value.__suppress_context__
    assert [r.split()[0] for r in cam.requests].count("DESCRIBE") == 2 + 1  # one retry each
    assert "asks for credentials" in str(e2.value) and "user and password" in str(e2.value)


def test_a_server_that_never_answers_is_timed_out_and_one_not_listening_refused():
    cam = ScriptedCamera(mute=True)
    try:
        t0 = time.monotonic()
        with pytest.raises(OpenTimedOut, match="open_timeout_s"):
            RtspClient(cam.url(), open_timeout_s=0.5, read_timeout_s=5)
        assert time.monotonic() - t0 < 3
    finally:
        cam.close()
    with pytest.raises(SourceError, match="cannot open"):
        RtspClient(f"rtsp://127.0.0.1:{cam.port}/cam", open_timeout_s=2, read_timeout_s=5)


class KeyedCamera(ScriptedCamera):
    """ScriptedCamera sending a key frame's slice (2000 bytes) every tenth packet and a small
    P slice between, one packet every 0.1 s on a 90 kHz clock that keeps time with it (a key
    frame a second); nothing once `stalled`. `stall_after_key`: the next key frame's packet and
    the P slice after it, sent at once, are the last, made at `last_sent` (before they are
    sent: the client's last byte comes after it)."""

    stalled = False
    stall_after_key = False
    last_sent = 0.0

    def _packet(self, seq: int) -> bytes:  # type: ignore[override]
        if self.stalled:
            return b""
        if seq % 10 == 0 and self.stall_after_key:
            self.stalled = True
            self.last_sent = time.monotonic()
            return self._one(seq) + self._one(seq + 1)
        return self._one(seq)

    @staticmethod
    def _one(seq: int) -> bytes:
        nal = b"\x65\x88" + bytes(1998) if seq % 10 == 0 else b"\x41\x9a" + bytes(50)
        pkt = (b"\x80\x60" + seq.to_bytes(2, "big") + (seq * 9000).to_bytes(4, "big")
               + b"\x00\x00\x00\x01" + nal)
        return b"$\x00" + len(pkt).to_bytes(2, "big") + pkt


def test_reads_between_key_frames_are_batched_and_a_stall_still_timed_out():
    """Key frames only (the follower drops P slices): once the key frames' period is known,
    the reads between them wait for bytes (fewer reads than packets), each key frame is still
    handed over, and a stream that stops is a TimeoutError read_timeout_s after its last
    byte, not later."""
    from runtime.frames.av_source import NalAssembler

    cam = KeyedCamera(user="")
    try:
        c = RtspClient(cam.url(), open_timeout_s=5, read_timeout_s=1.0)
        try:
            follower = NalAssembler()
            follower.drop_types = frozenset({1})
            c.rtp.follower = follower
            it = c.payloads()
            keys = 0
            while keys < 3:  # two key frames: their period; the third read with it known
                keys += bytes(next(it).data[4:5]) == b"\x65"
            reads, packets = c.reads, c.rtp.packets
            while keys < 5:
                keys += bytes(next(it).data[4:5]) == b"\x65"
            assert c.rtp.packets - packets >= 15
            # ~0.6 a packet here (a read a packet without the batching)
            assert c.reads - reads <= 0.8 * (c.rtp.packets - packets)
            # The stream stops on a P slice right behind a key frame, timed from when the
            # camera made them (the client's last byte follows): the reads after a dropped
            # slice are batched until KEY_LEAD_S before the next key frame is due (0.9 s on),
            # and a read that then armed read_timeout_s from the switch, not from the last
            # byte (before d699061), timed out at 1.9 s at the earliest; from the last byte,
            # at 1.0 on any host, a loaded one adding only this thread's wake-up.
            cam.stall_after_key = True
            with pytest.raises(TimeoutError):
                while True:
                    next(it)
            took = time.monotonic() - cam.last_sent
            print(f"timed out {took:.3f} s after the camera's last packet")
            assert 1.0 <= took <= 1.75
        finally:
            c.close()
    finally:
        cam.close()


class _Kernel:
    """setsockopt as a kernel that takes one struct timeval size (the socket boundary)."""

    def __init__(self, size: int):
        self.size, self.set = size, []

    def setsockopt(self, level, option, value):
        if len(value) != self.size:
            raise OSError(errno.EINVAL, "Invalid argument")
        self.set.append((option, value))


def test_the_timeout_is_set_in_the_size_the_kernel_takes():
    """Found by review (2026-12-07): a struct timeval packed as two C longs is 8 bytes on
    32-bit ARM, where a Python built with a 64-bit time_t (Debian armhf after t64) asks 16:
    every setsockopt of the read timeout would fail and the rtp reader never play."""
    from runtime.frames.rtsp_client import set_timeo

    k = _Kernel(16)  # a 64-bit host: two C longs are 16 bytes
    set_timeo(k, socket.SO_SNDTIMEO, 0.5)
    assert k.set == [(socket.SO_SNDTIMEO, struct.pack("qq", 0, 500000))]
    t64 = _Kernel(16)  # 32-bit longs ("ii"), a kernel asking the 64-bit layout
    set_timeo(t64, socket.SO_RCVTIMEO, 1.25, longs="ii")
    assert t64.set == [(socket.SO_RCVTIMEO, struct.pack("qq", 1, 250000))]
    old = _Kernel(8)  # 32-bit longs, a 32-bit time_t: taken as they are
    set_timeo(old, socket.SO_RCVTIMEO, 1.25, longs="ii")
    assert old.set == [(socket.SO_RCVTIMEO, struct.pack("ii", 1, 250000))]
    with pytest.raises(OSError):  # a refusal of the only layout is not hidden
        set_timeo(_Kernel(4), socket.SO_SNDTIMEO, 0.5)
