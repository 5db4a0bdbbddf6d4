"""H.264 over RTP (RFC 3550, RFC 6184) read from RTSP's interleaved frames: the `$` framing
(RFC 2326 10.12) split from the RTSP replies that come between its frames, RTP headers
parsed, and single NAL units, STAP-A and FU-A packets turned back into NAL units as
NalAssembler (av_source.py) takes them, each with where it ends. The camera is hostile
input: every length is checked against what is there, and what does not parse is dropped and
counted, never read past."""

from __future__ import annotations

from dataclasses import dataclass

_START4 = b"\x00\x00\x00\x01"

REPLY_HEAD_MAX = 16 << 10  # an RTSP reply's head between interleaved frames, at most
REPLY_BODY_MAX = 64 << 10  # and its body (a keep-alive's reply has none)
WAKE_MAX = 64 << 10  # the most bytes a batched read waits for (wake_bytes)


class FramingError(Exception):
    """The stream is not RTSP's interleaved framing (a reply past its bounds, garbage)."""


@dataclass(slots=True)
class RtpPayload:
    """What one RTP packet gives NalAssembler: `data` (a NAL's first bytes begin with a start
    code; a later fragment's do not), `pts` (the RTP timestamp, unwrapped), `ends` (the NAL
    ends with this packet), and `lost` (packets lost right before it: the picture being
    gathered is damaged)."""

    data: bytes | memoryview
    pts: int
    ends: bool
    lost: int = 0

    @property
    def size(self) -> int:
        """Its bytes (av.Packet's `size`)."""
        return len(self.data)


class Interleaved:
    """RTSP's interleaved frames out of a TCP byte stream fed in chunks of any size: `feed`
    returns the whole frames in it as (channel, payload) and the RTSP messages between them
    (a keep-alive's reply, a server's request) as (head, body); a frame or message cut by a
    chunk's end is kept for the next chunk. A message past REPLY_HEAD_MAX/REPLY_BODY_MAX, or
    bytes that are neither, raise FramingError: a peer that does not speak the protocol is
    not followed."""

    def __init__(self) -> None:
        self._rest = b""

    def feed(self, chunk: bytes
             ) -> tuple[list[tuple[int, memoryview]], list[tuple[bytes, bytes]]]:
        """The frames and RTSP messages (head, body) completed by `chunk`."""
        buf = self._rest + chunk if self._rest else chunk
        view = memoryview(buf)
        frames: list[tuple[int, memoryview]] = []
        replies: list[tuple[bytes, bytes]] = []
        i, n = 0, len(buf)
        while i < n:
            if buf[i] == 0x24:  # '$', channel, length16, payload
                if n - i < 4:
                    break
                size = (buf[i + 2] << 8) | buf[i + 3]
                if n - i < 4 + size:
                    break
                frames.append((buf[i + 1], view[i + 4:i + 4 + size]))
                i += 4 + size
                continue
            at = self._message(buf, i, replies)
            if at is None:  # not whole yet
                break
            i = at
        self._rest = bytes(buf[i:]) if i < n else b""
        return frames, replies

    def feed_rtp(self, chunk: bytes, rtp: RtpH264, channel: int
                 ) -> tuple[list[RtpPayload], list[tuple[bytes, bytes]]]:
        """`feed` with the frames of `channel` handed to `rtp` as they are split: its
        payloads (other channels' frames, RTCP, dropped) and the RTSP messages. The later
        fragments of a NAL that `rtp` does not hand over are passed here, from their first
        bytes, without a call or a slice (RtpH264.skipping: most of a stream's packets while
        key frames alone are decoded; a call and a slice each cost more than the reads)."""
        buf = self._rest + chunk if self._rest else chunk
        view = memoryview(buf)
        out: list[RtpPayload] = []
        replies: list[tuple[bytes, bytes]] = []
        i, n = 0, len(buf)
        while i < n:
            if buf[i] == 0x24:
                if n - i < 4:
                    break
                size = (buf[i + 2] << 8) | buf[i + 3]
                if n - i < 4 + size:
                    break
                p = i + 4
                i = p + size
                if buf[p - 3] != channel:
                    continue
                # the fast path: RTP without CSRC/extension/padding, the payload type and
                # sequence expected, a FU-A's later fragment of a NAL not handed over
                if (size > 14 and rtp.skipping and buf[p] == 0x80
                        and buf[p + 12] & 0x1F == 28 and not buf[p + 13] & 0x80
                        and ((buf[p + 2] << 8) | buf[p + 3]) == rtp.expect
                        and buf[p + 1] & 0x7F == rtp.payload_type):
                    rtp.packets += 1
                    rtp.expect = (rtp.expect + 1) & 0xFFFF
                    if buf[p + 13] & 0x40:  # its last
                        rtp.skipping = rtp.in_fu = False
                    continue
                out += rtp.push(view[p:i])
                continue
            at = self._message(buf, i, replies)
            if at is None:  # not whole yet
                break
            i = at
        self._rest = bytes(buf[i:]) if i < n else b""
        return out, replies

    @staticmethod
    def _message(buf: bytes, i: int, replies: list[tuple[bytes, bytes]]) -> int | None:
        """The RTSP message at `i`, added to `replies`: where the next thing begins (None:
        not whole yet)."""
        n = len(buf)
        if not 0x41 <= buf[i] <= 0x5A:  # a reply ("RTSP/1.0 ...") or a request's method
            raise FramingError(f"bytes that are neither an interleaved frame nor an RTSP "
                               f"message ({bytes(buf[i:i + 8])!r})")
        end = buf.find(b"\r\n\r\n", i, i + REPLY_HEAD_MAX + 4)
        if end < 0:
            if n - i > REPLY_HEAD_MAX:
                raise FramingError(f"an RTSP reply's head past {REPLY_HEAD_MAX} bytes")
            return None
        head = bytes(buf[i:end])
        length = content_length(head)
        if length > REPLY_BODY_MAX:
            raise FramingError(f"an RTSP reply's body of {length} bytes "
                               f"(at most {REPLY_BODY_MAX})")
        if n - end - 4 < length:
            return None
        replies.append((head, bytes(buf[end + 4:end + 4 + length])))
        return end + 4 + length


def content_length(head: bytes) -> int:
    """An RTSP message head's Content-Length (0: none); FramingError where it is not a
    number."""
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            v = value.strip()
            if not v.isdigit() or len(v) > 9:
                raise FramingError(f"an RTSP Content-Length that is not a size ({v[:20]!r})")
            return int(v)
    return 0


class RtpH264:
    """NAL units out of one H.264 RTP stream's packets (`payload_type` from the SDP):
    `push(packet)` returns the RtpPayloads one RTP packet gives (none, one, or one per NAL of
    a STAP-A). A sequence number that skips marks the next payload `lost` and drops the NAL
    being gathered (its fragments after the gap begin no NAL); a packet that is not RTP
    version 2 of this payload type, or whose lengths do not add up, is dropped and counted in
    `malformed`. Timestamps are unwrapped past 2^32 (a 90 kHz clock wraps every 13 h).

    `follower`: an object whose `drop_types` are the NAL types its reader follows but does
    not gather (NalAssembler: P slices while key frames alone are decoded): of a NAL of one
    of those, only the first fragment is handed over (where it begins: a picture boundary),
    not the ~90 % of a stream's packets that follow it. Why: at 230 packets a second, a
    payload made and handed over for each cost more CPU than the reads (docs/benchmarks.md).

    `wake()`: how many bytes the reader may wait for before it reads again (wake_bytes):
    more than one while the slice begun last is one the follower drops (key frames only,
    between key pictures), from the size of the last key frame's slice (`key_bytes`)."""

    def __init__(self, payload_type: int, follower=None) -> None:
        self.payload_type = payload_type
        self.follower = follower
        # the next sequence number expected (-1: none yet); inside a FU-A NAL whose later
        # fragments are not handed over (Interleaved.feed_rtp passes them: it reads both)
        self.expect = -1
        self.skipping = False
        self._ssrc = b""
        self._ts: int | None = None  # the last 32-bit timestamp, and its unwrapped value
        self._ts_ext = 0
        self.in_fu = False  # a FU-A NAL has begun and not ended
        self._fu_kept = True  # and its fragments are handed over
        self._lost = 0  # packets lost, told with the next payload
        self.malformed = 0
        self.lost = 0  # packets lost in all (sequence gaps)
        self.packets = 0
        self.held = False  # the slice NAL begun last is of a type the follower drops
        self.key_bytes = 0  # the size of the last key-frame slice NAL gathered whole
        self.key_pts = -1  # the (unwrapped) RTP timestamp of the last key slice begun
        self._nal_bytes = -1  # of the key slice being gathered (FU-A; -1: none)

    def push(self, pkt: memoryview | bytes) -> list[RtpPayload]:
        """The payloads of one RTP packet (its bytes, the interleaved frame's)."""
        n = len(pkt)
        if n < 12:
            self.malformed += 1
            return _NONE
        b0 = pkt[0]
        if b0 & 0xC0 != 0x80 or (pkt[1] & 0x7F) != self.payload_type:
            self.malformed += 1
            return _NONE
        h = 12 + 4 * (b0 & 0x0F)
        if b0 & 0x10:  # a header extension: 4 bytes, then its length in words
            if n < h + 4:
                self.malformed += 1
                return _NONE
            h += 4 + 4 * ((pkt[h + 2] << 8) | pkt[h + 3])
        end = n - pkt[n - 1] if b0 & 0x20 else n  # padding: its count in the last byte
        if h >= end:
            self.malformed += 1
            return _NONE
        self.packets += 1
        seq = (pkt[2] << 8) | pkt[3]
        if (seq != self.expect or pkt[8:12] != self._ssrc) and not self._resync(
                seq, bytes(pkt[8:12])):
            return _NONE
        self.expect = (seq + 1) & 0xFFFF
        if pkt[h] & 0x1F == 28 and not pkt[h + 1] & 0x80 and h + 2 < end:
            # a later fragment of a FU-A NAL: the hot path (most of a stream's packets)
            if not self.in_fu:  # the rest of a NAL begun before a gap (or before we came)
                return _NONE
            ends = bool(pkt[h + 1] & 0x40)
            if ends:
                self.in_fu = self.skipping = False
            if not self._fu_kept:
                return _NONE
            if self._nal_bytes >= 0:  # a key slice's size (wake)
                self._nal_bytes += end - h - 2
                if ends:
                    self.key_bytes = self._nal_bytes
            p = RtpPayload(pkt[h + 2:end], self._stamp(pkt), ends, self._lost)
            self._lost = 0
            return [p]
        return self._nals(pkt[h:end], self._stamp(pkt))

    def _resync(self, seq: int, ssrc: bytes) -> bool:
        """A packet out of sequence or of another source: a gap counted (False: a late or
        repeated packet, dropped)."""
        if ssrc != self._ssrc:  # a new stream (or the first packet): no gap to judge
            if self._ssrc:
                self._gap(1)
            self._ssrc, self._ts = ssrc, None
            return True
        behind = (self.expect - seq) & 0xFFFF
        if behind and behind < 0x100:  # a late or repeated packet (not over TCP)
            return False
        self._gap((seq - self.expect) & 0xFFFF)
        return True

    def _stamp(self, pkt: memoryview | bytes) -> int:
        """The packet's timestamp, unwrapped."""
        ts = (pkt[4] << 24) | (pkt[5] << 16) | (pkt[6] << 8) | pkt[7]
        if self._ts is not None and ts != self._ts:
            self._ts_ext += ((ts - self._ts + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
        self._ts = ts
        return self._ts_ext

    def _gap(self, lost: int) -> None:
        self.lost += lost
        self._lost += lost
        self.in_fu = self.skipping = False

    def _out(self, data: bytes | memoryview, pts: int, ends: bool) -> RtpPayload:
        p = RtpPayload(data, pts, ends, self._lost)
        self._lost = 0
        return p

    def wake(self) -> int:
        """The bytes the reader may wait for before its next read (wake_bytes)."""
        f = self.follower
        return wake_bytes(self.held and f is not None and bool(f.drop_types), self.key_bytes)

    def _slice(self, kind: int, size: int, pts: int) -> None:
        """A NAL of `kind` and `size` bytes begins in a packet of `pts`: whether the follower
        drops it (held), and a key frame's slice sent whole measured, its time kept."""
        if 1 <= kind <= 5:
            f = self.follower
            self.held = f is not None and kind in f.drop_types
            if kind == 5:
                self.key_pts = pts
                if size:
                    self.key_bytes = size

    def _nals(self, pay: memoryview | bytes, pts: int) -> list[RtpPayload]:
        kind = pay[0] & 0x1F
        if 1 <= kind <= 23:  # one NAL, whole
            self.in_fu = self.skipping = False
            self._slice(kind, len(pay), pts)
            return [self._out(_START4 + bytes(pay), pts, True)]
        if kind == 24:  # STAP-A: NALs, each behind its 16-bit size
            out, i, n = [], 1, len(pay)
            while i + 2 < n:
                size = (pay[i] << 8) | pay[i + 1]
                if size == 0 or i + 2 + size > n:
                    self.malformed += 1
                    break
                self._slice(pay[i + 2] & 0x1F, size, pts)
                out.append(self._out(_START4 + bytes(pay[i + 2:i + 2 + size]), pts, True))
                i += 2 + size
            self.in_fu = self.skipping = False
            return out
        if kind == 28 and len(pay) > 2:  # FU-A's first fragment (push takes the others)
            fu = pay[1]
            self.in_fu = not fu & 0x40
            follower = self.follower
            self._fu_kept = follower is None or (fu & 0x1F) not in follower.drop_types
            self.skipping = self.in_fu and not self._fu_kept
            # a key slice measured from here to its end (wake); not measured: -1
            self._nal_bytes = len(pay) - 1 if fu & 0x1F == 5 and self._fu_kept else -1
            if not self.in_fu and self._nal_bytes > 0:
                self.key_bytes = self._nal_bytes
            self._slice(fu & 0x1F, 0, pts)
            head = bytes(((pay[0] & 0xE0) | (fu & 0x1F),))
            return [self._out(_START4 + head + bytes(pay[2:]), pts, not self.in_fu)]
        # STAP-B, MTAP, FU-B (interleaved mode only), reserved types, a FU-A without payload
        self.malformed += 1
        return _NONE


_NONE: list[RtpPayload] = []  # returned empty, never appended to


def wake_bytes(holding: bool, key_bytes: int) -> int:
    """How many bytes the reader may let the socket gather before it reads (SO_RCVLOWAT):
    one (every byte at once) unless it is `holding`, between key pictures while key frames
    alone are decoded, where nothing it reads is decoded until the next key frame comes; then
    half the last key frame's slice (`key_bytes`, 0: none seen yet: one), at most WAKE_MAX.
    Why: each read is a wake-up of the reader thread, ~60 us of CPU on the hosts measured
    whatever it reads, and the camera's packets come a few at a time (54 reads a second of
    ~5 kB at 720p25): between key frames, at a 1 fps cap, those wake-ups were most of the
    reading's CPU. Half a key slice: the next key frame wakes the reader within its own burst
    (the reader then reads every byte at once until the key picture is whole)."""
    if not holding or key_bytes <= 0:
        return 1
    return max(1, min(WAKE_MAX, key_bytes // 2))
