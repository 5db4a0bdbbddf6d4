"""RTSP over TCP (RFC 2326), edgerun's own client for `[source] decoder = "rtp"`: OPTIONS,
DESCRIBE (Basic or Digest MD5 authentication, RFC 2617/7616), the SDP's H.264 track, SETUP
interleaved on the RTSP connection, PLAY, a keep-alive before the session times out,
TEARDOWN on close; then the interleaved RTP packets read in large recv()s and turned into
NAL units (rtp_h264.py). While key frames alone are decoded, the reads between key pictures
wait for bytes to gather in the socket (SO_RCVLOWAT: RtpH264.wake, batch_wait), up to a
lead before the next key frame is due: each read is a wake-up of the reader thread, and the
camera's packets come a few at a time.

Why: FFmpeg's RTSP demuxer reads an interleaved RTP packet in three small reads, 6.2-7.0 ms
of CPU a second of a 720p25 stream, more than a key-frames-only reader's decode at a 1 fps
cap; read here in 256 kB recv()s it measured 2.5-3.6 ms (docs/benchmarks.md). Every reply
and frame is bounded and checked (the camera is hostile input); no credential is ever in a
message or log line (stream_url.shown)."""

from __future__ import annotations

import base64
import binascii
import errno
import hashlib
import logging
import os
import re
import socket
import struct
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from runtime.frames.frame import CredentialsRefused, OpenTimedOut, SourceError
from runtime.frames.rtp_h264 import FramingError, Interleaved, RtpH264, RtpPayload
from runtime.frames.stream_url import shown, unresolved

log = logging.getLogger("edgerun.source")

RECV_BYTES = 256 << 10  # one recv(): ~1/3 s of a 720p25 stream at 6 Mbit/s
SDP_LINES_MAX = 500
DEFAULT_SESSION_TIMEOUT_S = 60.0  # RFC 2326 12.37
# a read waiting for RtpH264.wake() bytes takes what came after this long (batch_wait)
BATCH_WAIT_S = 0.25
KEY_LEAD_S = 0.1  # every byte read at once from this long before the next key frame is due
KEY_PERIOD_MAX_S = 20.0  # a longer gap between key pictures is not taken as their period
_NO_PAYLOADS: list[RtpPayload] = []


@dataclass
class Track:
    """The SDP's H.264 video track: its control URL, RTP payload type, clock rate and the
    SPS/PPS from sprop-parameter-sets (each a NAL without start code)."""

    control: str
    payload_type: int
    clock_rate: int
    params: list[bytes] = field(default_factory=list)


def resolve(base: str, control: str) -> str:
    """A control attribute's URL against the presentation's base (RFC 2326 C.1.1): an
    absolute URL as it is, "*" the base itself, a relative one below the base (cameras give
    "trackID=1" or "stream=0" and expect it after a '/')."""
    if not control or control == "*":
        return base
    if re.match(r"(?i)rtsps?://", control):
        return control
    return base + control if base.endswith("/") else f"{base}/{control}"


def parse_sdp(sdp: str, base: str) -> tuple[Track | None, str]:
    """The SDP's first H.264 video track (None: none) and the URL PLAY is sent to (the
    session-level control, else the base)."""
    session_ctrl, track, media = "", None, None  # media: the m= section being read
    pts: list[int] = []
    rtpmap: dict[int, tuple[str, int]] = {}
    fmtp: dict[int, str] = {}
    ctrl = ""
    found: Track | None = None

    def close_media() -> None:
        nonlocal found
        if found is not None or media != "video":
            return
        for pt in pts:
            name, rate = rtpmap.get(pt, ("", 0))
            if name.upper() == "H264":
                found = Track(resolve(base, ctrl), pt, rate or 90000, _sprop(fmtp.get(pt, "")))
                return

    for line in sdp.splitlines()[:SDP_LINES_MAX]:
        line = line.strip()
        if line.startswith("m="):
            close_media()
            parts = line[2:].split()
            media = parts[0] if parts else ""
            pts = [int(p) for p in parts[3:] if p.isdigit() and int(p) < 128]
            if len(parts) < 3 or parts[2] != "RTP/AVP":
                media = "other"
            rtpmap, fmtp, ctrl = {}, {}, ""
        elif line.startswith("a=control:"):
            if media is None:
                session_ctrl = line[10:].strip()
            else:
                ctrl = line[10:].strip()
        elif line.startswith("a=rtpmap:") and media is not None:
            m = re.match(r"a=rtpmap:(\d+) +([\w.-]+)/(\d+)", line)
            if m and int(m.group(1)) < 128:
                rtpmap[int(m.group(1))] = (m.group(2), min(int(m.group(3)), 10**7))
        elif line.startswith("a=fmtp:") and media is not None:
            m = re.match(r"a=fmtp:(\d+) +(.*)", line)
            if m:
                fmtp[int(m.group(1))] = m.group(2)
    close_media()
    track = found
    return track, resolve(base, session_ctrl)


def _sprop(fmtp: str) -> list[bytes]:
    """The SPS/PPS NALs of an fmtp's sprop-parameter-sets (none where it is missing or not
    base64: they also come in-band)."""
    for item in fmtp.split(";"):
        key, _, value = item.strip().partition("=")
        if key.strip().lower() == "sprop-parameter-sets":
            try:
                nals = [base64.b64decode(v, validate=True) for v in value.split(",") if v]
            except (binascii.Error, ValueError):
                return []
            return [n for n in nals if n and len(n) <= 4096]
    return []


def parse_head(head: bytes) -> tuple[int, dict[str, list[str]]]:
    """An RTSP reply's status and headers (names lower-cased, every value of each); status 0
    where the head is not an RTSP/1.0 reply."""
    lines = head.decode("latin-1").split("\r\n")
    m = re.match(r"RTSP/1\.0 (\d{3})", lines[0])
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers.setdefault(name.strip().lower(), []).append(value.strip())
    return (int(m.group(1)) if m else 0), headers


def challenges(values: list[str]) -> dict[str, dict[str, str]]:
    """WWW-Authenticate values by scheme (lower-cased) with their parameters:
    {"digest": {"realm": ..., "nonce": ..., "qop": ..., "algorithm": ...}, "basic": {...}}."""
    out: dict[str, dict[str, str]] = {}
    for v in values:
        scheme, _, rest = v.strip().partition(" ")
        params = {k.lower(): (q if q or not t else t) for k, q, t in
                  re.findall(r'([\w-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))', rest)}
        out.setdefault(scheme.lower(), params)
    return out


def digest(user: str, password: str, method: str, uri: str, ch: dict[str, str], nc: int,
           cnonce: str) -> str:
    """An Authorization header's value for Digest (RFC 2617, RFC 7616 with MD5): with
    qop=auth where the challenge offers it, else RFC 2069's form."""
    def md5(s: str) -> str:
        return hashlib.md5(s.encode()).hexdigest()  # the protocol's own hash

    realm, nonce = ch.get("realm", ""), ch.get("nonce", "")
    ha1 = md5(f"{user}:{realm}:{password}")
    if ch.get("algorithm", "MD5").upper() == "MD5-SESS":
        ha1 = md5(f"{ha1}:{nonce}:{cnonce}")
    ha2 = md5(f"{method}:{uri}")
    qops = [q.strip() for q in ch.get("qop", "").split(",")]
    parts = [f'username="{_quoted(user)}"', f'realm="{_quoted(realm)}"',
             f'nonce="{_quoted(nonce)}"', f'uri="{uri}"']
    if "auth" in qops:
        parts += [f'response="{md5(f"{ha1}:{nonce}:{nc:08x}:{cnonce}:auth:{ha2}")}"',
                  "qop=auth", f"nc={nc:08x}", f'cnonce="{cnonce}"']
    else:
        parts.append(f'response="{md5(f"{ha1}:{nonce}:{ha2}")}"')
    if "algorithm" in ch:
        parts.append(f"algorithm={ch['algorithm']}")
    if "opaque" in ch:
        parts.append(f'opaque="{_quoted(ch["opaque"])}"')
    return "Digest " + ", ".join(parts)


def _quoted(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


def session_of(values: list[str]) -> tuple[str, float]:
    """A Session header's id and timeout in seconds (RFC 2326 12.37: 60 s if not said)."""
    sid, _, rest = (values[0] if values else "").partition(";")
    m = re.search(r"timeout\s*=\s*(\d+)", rest)
    timeout = float(m.group(1)) if m else DEFAULT_SESSION_TIMEOUT_S
    return sid.strip(), max(timeout, 2.0)


def batch_wait(now: float, next_key_at: float) -> float:
    """How long a read between key pictures (key frames alone decoded) may wait for
    RtpH264.wake() bytes at `now`: until KEY_LEAD_S before the next key picture is due at
    `next_key_at` (the last one's arrival and the stream's key-frame period; 0: not known),
    at most BATCH_WAIT_S; 0: not at all (every byte read as it comes).

    Why the lead: bytes left in the socket are acknowledged late (the delayed ACK, 40 ms on
    Linux), and a camera whose TCP holds small writes until the last is acknowledged (Nagle)
    then sent the key frame up to 48 ms late (half the key frames, measured on the test
    camera); read at once from before it is due, the key frame comes as it did."""
    if next_key_at <= 0:
        return 0.0
    wait = min(BATCH_WAIT_S, next_key_at - KEY_LEAD_S - now)
    return wait if wait >= 0.01 else 0.0  # SO_RCVTIMEO: a zero timeval waits forever


def set_timeo(sock: Any, option: int, seconds: float, longs: str = "ll") -> None:
    """Set SO_RCVTIMEO or SO_SNDTIMEO to `seconds`: a struct timeval of two C longs, or of two
    64-bit integers where the kernel refuses that size (EINVAL): a 32-bit ARM Python built
    with a 64-bit time_t (Debian's armhf after its t64 transition) asks SO_*TIMEO_NEW's
    layout under the old name. On 64-bit Linux both are the same 16 bytes. (`longs`: the
    struct format of two C longs, "ii" where a test stands for a 32-bit host.)"""
    whole = int(seconds)
    usec = int((seconds - whole) * 1e6)
    try:
        sock.setsockopt(socket.SOL_SOCKET, option, struct.pack(longs, whole, usec))
    except OSError as e:
        if e.errno != errno.EINVAL or struct.calcsize(longs) == 16:
            raise
        sock.setsockopt(socket.SOL_SOCKET, option, struct.pack("qq", whole, usec))


def interleaved_channel(values: list[str]) -> int | None:
    """The RTP channel the server chose in its Transport header (None: not said)."""
    m = re.search(r"interleaved=(\d+)", values[0] if values else "")
    return int(m.group(1)) if m and int(m.group(1)) < 256 else None


class RtspClient:
    """One RTSP session over TCP playing a camera's H.264 track (module doc). Opened at
    construction (SourceError: CredentialsRefused, OpenTimedOut, or why it failed; the socket
    closed on every way out but success); `payloads()` yields its RtpPayloads; `close()`
    ends the session."""

    def __init__(self, url: str, open_timeout_s: float, read_timeout_s: float) -> None:
        self._shown = shown(url)
        self.read_timeout_s = read_timeout_s
        u = urllib.parse.urlsplit(url)
        self._user = urllib.parse.unquote(u.username or "")
        self._password = urllib.parse.unquote(u.password or "")
        netloc = u.netloc.rpartition("@")[2]
        self.url = urllib.parse.urlunsplit((u.scheme, netloc, u.path, u.query, ""))
        try:
            port = u.port or 554
        except ValueError:
            raise SourceError(f"source.path {self._shown!r}: the port is not a number") \
                from None
        self._cseq = 0
        self._auth: tuple[str, dict[str, str]] | None = None  # scheme and its challenge
        self._nc = 0
        self._session = ""
        self._play_url = self.url
        self._framing = Interleaved()
        self._pending: list[tuple[int, memoryview]] = []  # frames read with PLAY's reply
        self.reads = 0  # recv()s that returned bytes while playing (batch_wait's measure)
        self._sock: socket.socket | None = None
        self._deadline = time.monotonic() + open_timeout_s
        self._open_timeout_s = open_timeout_s
        try:
            self._sock = socket.create_connection((u.hostname or "", port),
                                                  timeout=open_timeout_s)
            self._play()
        except TimeoutError:
            self.close(teardown=False)
            raise OpenTimedOut(f"source.path {self._shown!r}: no stream within "
                               f"{open_timeout_s:g} s (open_timeout_s): the server does not "
                               "answer") from None
        except socket.gaierror:
            self.close(teardown=False)
            why = unresolved(url) or "cannot open (the host name does not resolve)"
            raise SourceError(f"source.path {self._shown!r}: {why}") from None
        except OSError as e:
            self.close(teardown=False)
            raise SourceError(f"source.path {self._shown!r}: cannot open "
                              f"({e.strerror or type(e).__name__})") from None
        except BaseException:
            self.close(teardown=False)
            raise

    def _play(self) -> None:
        """OPTIONS, DESCRIBE, SETUP, PLAY; the track and keep-alive planned."""
        _, h, _ = self._request("OPTIONS", self.url)
        public = ",".join(h.get("public", [])).upper()
        self._keepalive = "GET_PARAMETER" if "GET_PARAMETER" in public else "OPTIONS"
        _, h, body = self._request("DESCRIBE", self.url, "Accept: application/sdp\r\n")
        base = (h.get("content-base") or h.get("content-location") or [self.url])[0]
        if not re.match(r"(?i)rtsps?://", base):
            base = self.url
        track, play_url = parse_sdp(body.decode("utf-8", "replace"), base)
        if track is None:
            raise SourceError(f"source.path {self._shown!r}: no H.264 video track in the "
                              "camera's SDP (decoder = 'rtp' reads H.264 only)")
        self.track = track
        _, h, _ = self._request("SETUP", track.control,
                                "Transport: RTP/AVP/TCP;unicast;interleaved=0-1\r\n")
        self._session, self._session_timeout = session_of(h.get("session", []))
        if not self._session or len(self._session) > 256:
            raise SourceError(f"source.path {self._shown!r}: the camera gave no session")
        chan = interleaved_channel(h.get("transport", []))
        self._channel = 0 if chan is None else chan
        self._play_url = play_url
        self._request("PLAY", play_url, "Range: npt=0.000-\r\n")
        self._next_keepalive = time.monotonic() + self._session_timeout / 2
        self.rtp = RtpH264(track.payload_type)

    def _authorization(self, method: str, uri: str) -> str:
        if self._auth is None:
            return ""
        scheme, ch = self._auth
        if scheme == "basic":
            token = base64.b64encode(f"{self._user}:{self._password}".encode()).decode()
            return f"Authorization: Basic {token}\r\n"
        self._nc += 1
        value = digest(self._user, self._password, method, uri, ch, self._nc,
                       os.urandom(8).hex())
        return f"Authorization: {value}\r\n"

    def _send(self, method: str, uri: str, extra: str = "") -> int:
        assert self._sock is not None
        self._cseq += 1
        session = f"Session: {self._session}\r\n" if self._session else ""
        msg = (f"{method} {uri} RTSP/1.0\r\nCSeq: {self._cseq}\r\n"
               f"User-Agent: edgerun\r\n{session}{self._authorization(method, uri)}{extra}\r\n")
        self._sock.sendall(msg.encode())
        return self._cseq

    def _request(self, method: str, uri: str, extra: str = ""
                 ) -> tuple[int, dict[str, list[str]], bytes]:
        """One request during the opening and its reply (status, headers, body): a 401
        answered once with the credentials (Digest where offered, else Basic); another
        status than 2xx a SourceError."""
        for attempt in range(2):
            cseq = self._send(method, uri, extra)
            status, h, body = self._reply(cseq)
            if status != 401:
                break
            offered = challenges(h.get("www-authenticate", []))
            if not self._user:
                raise CredentialsRefused(
                    f"source.path {self._shown!r}: the server asks for credentials (401 "
                    "Unauthorized): give the user and password in the URL")
            if attempt or not offered:
                raise CredentialsRefused(
                    f"source.path {self._shown!r}: the server refused the credentials (401 "
                    "Unauthorized): check the user and password in the URL")
            if "digest" in offered and offered["digest"].get("algorithm", "MD5").upper() in (
                    "MD5", "MD5-SESS"):
                self._auth = ("digest", offered["digest"])
            elif "basic" in offered:
                self._auth = ("basic", {})
            else:
                raise SourceError(f"source.path {self._shown!r}: the server asks for an "
                                  f"authentication edgerun does not speak ({sorted(offered)})")
        if not 200 <= status < 300:
            raise SourceError(f"source.path {self._shown!r}: cannot open ({method} answered "
                              f"{status})")
        return status, h, body

    def _reply(self, cseq: int) -> tuple[int, dict[str, list[str]], bytes]:
        """The reply of CSeq `cseq` (replies to others and the server's requests passed
        over; frames that came with it kept for payloads())."""
        assert self._sock is not None
        while True:
            self._sock.settimeout(max(0.01, self._deadline - time.monotonic()))
            chunk = self._sock.recv(RECV_BYTES)
            if not chunk:
                raise SourceError(f"source.path {self._shown!r}: cannot open (the server "
                                  "closed the connection)")
            try:
                frames, replies = self._framing.feed(chunk)
            except FramingError as e:
                raise SourceError(f"source.path {self._shown!r}: cannot open (not RTSP: "
                                  f"{e})") from None
            self._pending += frames
            for head, body in replies:
                status, h = parse_head(head)
                if status and h.get("cseq", [""])[0] == str(cseq):
                    return status, h, body

    def payloads(self) -> Iterator[RtpPayload]:
        """The track's RTP payloads as they come (ends when the server closes the
        connection; TimeoutError past read_timeout_s without a byte; SourceError where the
        stream is not interleaved RTSP or the session is gone). Between key pictures while
        key frames alone are decoded, each read waits for RtpH264.wake() bytes for as long
        as batch_wait() gives (then it takes what came)."""
        assert self._sock is not None
        sock, rtp, chan = self._sock, self.rtp, self._channel
        # blocking, each recv() bounded by SO_RCVTIMEO in the kernel: one system call a read
        # where the timeout mode polled before each, and SO_RCVLOWAT is honoured by it
        sock.settimeout(None)
        set_timeo(sock, socket.SO_SNDTIMEO, self.read_timeout_s)
        frames, self._pending = self._pending, []
        buf = bytearray(RECV_BYTES)
        view = memoryview(buf)
        out = [p for ch, data in frames if ch == chan for p in rtp.push(data)]
        wake, timeo = 0, -1.0  # SO_RCVLOWAT and SO_RCVTIMEO as set (none yet)
        last_byte = time.monotonic()
        key_pts, key_at, period = -1, 0.0, 0.0  # the last key picture: RTP time, arrival
        while True:
            yield from out
            out = _NO_PAYLOADS
            now = time.monotonic()
            if now >= self._next_keepalive:
                self._next_keepalive = now + self._session_timeout / 2
                self._send(self._keepalive, self._play_url if self._keepalive ==
                           "GET_PARAMETER" else self.url)
            want = rtp.wake()
            wait = batch_wait(now, key_at + period if period else 0.0) if want > 1 else 0.0
            if not wait:  # every byte as it comes: a stall is read_timeout_s after the last
                want, wait = 1, max(0.01, self.read_timeout_s - (now - last_byte))
            if want != wake:
                wake = want
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, wake)
            # set again where it moved (a read a frame with every byte read at once: the time
            # since the last byte moves it by less than the 50 ms let pass)
            if wait != timeo and (wake > 1 or abs(wait - timeo) > 0.05):
                timeo = wait
                set_timeo(sock, socket.SO_RCVTIMEO, wait)
            # into one buffer, then copied out at its size: recv(RECV_BYTES) allocated 256 kB
            # (an mmap past glibc's threshold) for each ~5 kB read, +3 ms CPU a second
            try:
                got = sock.recv_into(buf)
            except BlockingIOError:  # SO_RCVTIMEO passed without a byte
                if time.monotonic() - last_byte < self.read_timeout_s:
                    continue
                raise TimeoutError(f"no byte for {self.read_timeout_s:g} s") from None
            if not got:
                return
            self.reads += 1
            last_byte = time.monotonic()
            chunk = bytes(view[:got])
            try:
                out, replies = self._framing.feed_rtp(chunk, rtp, chan)
            except FramingError as e:
                raise SourceError(f"{self._shown}: the stream failed (not RTSP: {e})") \
                    from None
            if rtp.key_pts != key_pts:  # a key picture began in this read
                step = (rtp.key_pts - key_pts) / self.track.clock_rate
                period = step if key_pts >= 0 and 0 < step <= KEY_PERIOD_MAX_S else 0.0
                key_pts, key_at = rtp.key_pts, last_byte
            for head, _ in replies:
                status, _h = parse_head(head)
                if status in (454, 459):  # Session Not Found: the keep-alive came too late
                    raise SourceError(f"{self._shown}: the camera ended the session "
                                      f"({status})")

    def interrupt(self) -> None:
        """From another thread: TEARDOWN, then the socket shut down, so that a recv() in
        payloads() returns at once (the stream ends) rather than after read_timeout_s."""
        import contextlib

        sock = self._sock
        if sock is None:
            return
        with contextlib.suppress(OSError):
            if self._session:
                self._send("TEARDOWN", self._play_url)
        self._session = ""  # said
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def close(self, teardown: bool = True) -> None:
        """TEARDOWN (not waited for), then the socket closed."""
        sock, self._sock = self._sock, None
        if sock is None:
            return
        try:
            if teardown and self._session:
                sock.settimeout(0.5)
                self._sock = sock
                self._send("TEARDOWN", self._play_url)
        except OSError:
            pass
        finally:
            self._sock = None
            sock.close()
