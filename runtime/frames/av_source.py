"""A live RTSP/HTTP stream read by PyAV (FFmpeg's libraries): H.264 access units assembled
here, key frames only under a low rate cap."""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import time

import numpy as np

from runtime.config.source import SourceConfig
from runtime.frames.cap_clock import CapClock, spaced
from runtime.frames.frame import CredentialsRefused, Frame, OpenTimedOut, SourceError
from runtime.frames.frame_shape import FrameShape
from runtime.frames.latest_frame import LatestFrame
from runtime.frames.rtp_h264 import RtpPayload
from runtime.frames.stream_url import redact, shown, unresolved

log = logging.getLogger("edgerun.source")


def pyav_available() -> bool:
    """Whether PyAV (the `av` package: FFmpeg's libraries, its wheel's own FFmpeg) imports."""
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


_START4, _START3 = b"\x00\x00\x00\x01", b"\x00\x00\x01"


class NalAssembler:
    """Whole H.264 NAL units out of FFmpeg's RTSP packets read without its parser
    (`fflags noparse`): one packet per RTP packet, a NAL sent whole (or several, STAP-A) begins
    with a start code, a fragmented one (FU-A) begins with one on its first fragment only.

    Why: FFmpeg's H.264 parser, which its RTSP demuxer puts in front of every packet, hands a
    frame over only once the next frame's first bytes arrive: one frame interval (40 ms at
    25 fps) on every frame's age (docs/benchmarks.md). The end of a NAL is known at once from
    its size instead: payloaders (GStreamer's rtph264pay, live555, FFmpeg's) fill every
    fragment but the last to the same size, so a fragment shorter than the largest seen ends
    its NAL. A stream where that is found wrong (a fragment after a NAL taken as ended) is
    cut at the next start code from then on, as the parser does: never a worse age than it,
    and never a NAL cut short twice. `push(data, pts)` returns the NALs it completes (each with
    its start code), each with the PTS of the packet that began it (RTP timestamps: every
    packet of one picture carries its picture's). A NAL past MAX_NAL_BYTES (a broken encoder,
    forged packets) is dropped, counted in `oversize`, and followed to the next start code:
    the camera's input never holds more memory than that."""

    MAX_NAL_BYTES = 8 << 20  # a 4K key frame in one slice is ~1-2 MB at camera bit rates

    def __init__(self) -> None:
        self._nal = bytearray()  # the NAL being gathered (starts with its start code)
        self._pts: int | None = None  # the PTS of the packet that began it
        self._open = False  # a NAL has begun and not ended
        self._dropping = False  # the NAL begun is of a type in drop_types
        self.drop_types: frozenset[int] = frozenset()  # NAL types followed, never returned
        self._full = 0  # the largest continuation fragment seen: the payloader's size
        self.ended_early = False  # the last NAL returned was ended by its size alone
        self.early_ok = True  # ending by size is trusted on this stream
        self.misjudged = 0  # fragments that came after a NAL taken as ended
        self.oversize = 0  # NALs dropped past MAX_NAL_BYTES
        self.dropped_begun = 0  # NALs of drop_types begun: picture boundaries for AccessUnits
        self.keys_begun = 0  # key pictures whose first slice began: a key frame is arriving

    def push(self, data: bytes | memoryview, pts: int | None = None,
             ends: bool | None = None) -> list[tuple[bytes, int | None]]:
        """The NALs completed by one packet's payload (`pts`: the packet's), each with its
        PTS. `ends`: whether the NAL ends with this packet where the reader knows it (an RTP
        depacketizer's: FU-A's end bit, rtp_h264.py); None: judged by its size as above."""
        out: list[tuple[bytes, int | None]] = []
        head = bytes(data[:6])
        if head.startswith(_START4) or head.startswith(_START3):
            if self._nal:  # a new NAL begins: the one gathered is whole
                out.append((bytes(self._nal), self._pts))
            self._nal.clear()
            # an aggregated packet (STAP-A: relays and some cameras bundle AUD, SPS, PPS and
            # small slices) comes as one, a start code ahead of each NAL; read as one NAL, its
            # slice hid behind the AUD/SPS and was decoded with the next picture. A NAL holds
            # no start code (emulation prevention): the packet is cut at each
            whole = bytes(data)
            at = whole.find(b"\x00\x00\x01", 3)
            while at > 0:
                cut = at - 1 if whole[at - 1] == 0 else at  # a 4-byte start code
                self._begin(whole[:cut], pts)
                if self._nal:
                    out.append((bytes(self._nal), pts))
                    self._nal.clear()
                whole = whole[cut:]
                at = whole.find(b"\x00\x00\x01", 3)
            self._begin(whole, pts)
            self._open = True
            self.ended_early = False
            if ends is not None:
                if ends:
                    self._end(out)
                return out
            # a NAL sent whole or a STAP-A is shorter than a first fragment (the payloader's
            # size + the start code and NAL header FFmpeg writes ahead of it)
            full_first = self._full + len(_START4) + 1
            if self.early_ok and self._full and len(data) < full_first:
                self._end(out)
            return out
        if not self._open:  # a fragment of a NAL already handed over (or never begun)
            if self.ended_early and ends is None:
                self.misjudged += 1
                self.early_ok = False  # the size rule does not hold here: the next start
                self.ended_early = False  # code ends a NAL from now on
            return out
        if not self._dropping:
            self._gather(data)
        if ends is not None:
            if ends:
                self._end(out)
            return out
        if len(data) > self._full:
            self._full = len(data)
        elif self.early_ok and len(data) < self._full:  # its last fragment
            self._end(out)
        return out

    def lose(self) -> None:
        """Packets were lost (an RTP sequence gap): the NAL being gathered is dropped, its
        fragments after the gap begin none."""
        self._nal.clear()
        self._open = self._dropping = self.ended_early = False

    def _begin(self, data: bytes | memoryview, pts: int | None) -> None:
        """A NAL begins with `data` (its start code first) in a packet of `pts`: followed or
        gathered."""
        self._pts = pts
        head = bytes(data[:6])
        kind = nal_type(head)
        # a NAL of a type not wanted is followed, not gathered (a P-frame's 10-100 kB
        # copied for nothing while key frames alone are decoded)
        self._dropping = kind in self.drop_types
        if kind == 5 and first_slice(head):
            self.keys_begun += 1
        if self._dropping:
            self.dropped_begun += 1
        else:
            self._gather(data)

    def _gather(self, data: bytes | memoryview) -> None:
        self._nal += data
        if len(self._nal) > self.MAX_NAL_BYTES:
            log.warning("a NAL past %d bytes from the camera: dropped up to the next start "
                        "code (counted as damage)", self.MAX_NAL_BYTES)
            self._nal.clear()
            self._dropping = True
            self.oversize += 1

    def _end(self, out: list[tuple[bytes, int | None]]) -> None:
        if self._nal:
            out.append((bytes(self._nal), self._pts))
        self._nal.clear()
        self._open = False
        self.ended_early = True


Picture = tuple[bytes, bool, "int | None"]  # (its NALs, a key frame or not, its PTS)


class AccessUnits:
    """Pictures out of whole NALs (NalAssembler's), each handed to the decoder as one packet
    with the NALs ahead of it (AUD, SPS, PPS, SEI): a picture of one slice as soon as its
    slice is whole; where the stream is seen to cut pictures into several slices, a picture
    once the next one begins (as FFmpeg's parser does: one frame interval later, but whole).
    Which of the two a stream is cannot be read from its SPS/PPS or from a first slice's header
    (a slice does not say where it ends), only from what follows it: so the first picture of a
    connection is held until the next NAL that is not its own (`multi_slice` None until then),
    a later slice of it (several slices: gathered whole) or the next picture's (one slice:
    handed over, and every one after it at once). Handed over at its first slice instead, the
    first key frame of every connection to a several-slice camera was decoded from that slice
    alone, the rest concealed; the cost of holding it is one frame interval, once a connection.
    Fed NAL by NAL instead (flags2 chunks), FFmpeg's decoder stopped handing over pictures
    for good after the first damaged one (tests/frames/test_rtsp_camera.py's corrupt test).
    `push(nal, pts)` returns the pictures it completes as (bytes, key frame or not, PTS: its
    first slice's)."""

    PREFIX_MAX = 16  # NALs kept ahead of a picture (a stream without AUDs: SEI piling up)
    MAX_SLICES = 256  # a picture past these (slices or bytes) is dropped, counted in oversize
    MAX_PICTURE_BYTES = 16 << 20

    def __init__(self) -> None:
        self._prefix: list[bytes] = []
        self._pic: list[bytes] = []  # slices of the picture being gathered (several-slice)
        self._pic_bytes = 0
        self._key = False
        self._pic_pts: int | None = None
        # pictures of several slices seen on this stream (None: no picture seen whole yet)
        self.multi_slice: bool | None = None
        self.oversize = 0  # pictures dropped past MAX_SLICES / MAX_PICTURE_BYTES

    def push(self, nal: bytes, pts: int | None = None) -> list[Picture]:
        """The pictures completed by one more NAL (`pts`: its PTS)."""
        out: list[Picture] = []
        kind = nal_type(nal)
        if 1 <= kind <= 5:
            first = first_slice(nal)
            if not first and not self.multi_slice:
                log.info("the stream cuts pictures into several slices: each is decoded "
                         "once the next begins%s", "" if self.multi_slice is None else
                         " (one picture after one-slice ones was decoded from its first "
                         "slice alone)")
                self.multi_slice = True
            if first:
                self._flush(out)  # the picture held is whole (one slice: multi_slice False)
            if self.multi_slice is False:
                out.append((b"".join([*self._prefix, nal]), kind == 5, pts))
                self._prefix.clear()
                return out
            if first:
                self._key, self._pic_pts = kind == 5, pts
                self._pic = [*self._prefix, nal]
                self._pic_bytes = sum(map(len, self._pic))
                self._prefix.clear()
            elif self._pic:
                self._pic.append(nal)
                self._pic_bytes += len(nal)
                if len(self._pic) > self.MAX_SLICES or self._pic_bytes > self.MAX_PICTURE_BYTES:
                    log.warning("a picture past %d slices or %d bytes from the camera: dropped "
                                "(counted as damage)", self.MAX_SLICES, self.MAX_PICTURE_BYTES)
                    self._pic, self.oversize = [], self.oversize + 1
            return out  # a later slice of a picture never begun: dropped
        # an AUD begins a picture; an SPS, PPS or SEI does not end one: GStreamer's rtph264pay
        # (config-interval=-1) repeats SPS and PPS ahead of every slice of a key frame, and
        # ending the picture there cut each key frame of a several-slice stream to its first
        # slice (the rest concealed, and the damage carried through its GOP). Kept ahead of
        # the next picture instead, where the decoder reads them again (the same parameters)
        if kind == 9:
            self._flush(out)
            self._prefix.clear()
        self._prefix.append(nal)
        del self._prefix[:-self.PREFIX_MAX]
        return out

    def boundary(self) -> list[Picture]:
        """A NAL the assembler does not hand over began (key frames only: a P slice): the
        picture gathered is whole, and is handed over now rather than at the next AUD/SPS."""
        out: list[Picture] = []
        self._flush(out)
        return out

    def _flush(self, out: list[Picture]) -> None:
        if self._pic:
            if self.multi_slice is None:  # the first picture, whole in its one slice
                self.multi_slice = False
            out.append((b"".join(self._pic), self._key, self._pic_pts))
            self._pic = []


def nal_type(nal: bytes) -> int:
    """An H.264 NAL's type (5: a key frame's slice, 1: another slice, 7/8: SPS/PPS)."""
    i = 4 if nal.startswith(_START4) else 3
    return nal[i] & 0x1F if len(nal) > i else 0


def first_slice(nal: bytes) -> bool:
    """Whether a slice NAL is its picture's first (first_mb_in_slice = 0: the slice header's
    first Exp-Golomb code is the single bit 1)."""
    i = 4 if nal.startswith(_START4) else 3
    return len(nal) > i + 1 and bool(nal[i + 1] & 0x80)


class KeyRate:
    """Key frames a second over the last KEEP, each timed by the stream's own clock (its PTS
    in seconds: RTP timestamps over RTSP) where the stream has one, else by its arrival.

    Why: at a connection the camera's backlog (~1 s of frames) arrives at once, so key frames
    timed by their arrival read ~3 a second against the camera's 1 for the first GOPs, and
    the rate decides whether key frames alone are decoded under a rate cap: a cap above the
    real rate was served from key frames only for seconds. A PTS is not usable where it is
    missing or no later than the last key frame's (a stream without timestamps, or one that
    stamps every packet alike): that key frame is timed by its arrival. The times kept are
    one clock's: a switch of clock, or a clock that steps back or jumps past MAX_GAP_S (a
    camera's timestamps restarted, a stall), starts them again."""

    KEEP = 8
    MAX_GAP_S = 60.0

    def __init__(self) -> None:
        self._times: list[float] = []
        self._by_pts: bool | None = None  # the clock of _times (None: none yet)
        self._last_pts: float | None = None  # the last key frame's PTS, usable or not

    def _after(self, pts_s: float | None, arrival: float
               ) -> tuple[list[float], bool, float | None]:
        """(times, clock, last PTS) with one more key frame at `pts_s` (s, None: none) that
        arrived at `arrival` (monotonic s)."""
        by_pts = pts_s is not None and (self._last_pts is None or pts_s > self._last_pts)
        t = pts_s if by_pts and pts_s is not None else arrival
        times = self._times if by_pts == self._by_pts else []
        if times and not 0 <= t - times[-1] <= self.MAX_GAP_S:
            times = []
        return [*times[1 - self.KEEP:], t], by_pts, pts_s

    def add(self, pts_s: float | None, arrival: float) -> None:
        """A key frame of PTS `pts_s` (seconds; None: it has none) arrived at `arrival`."""
        self._times, self._by_pts, self._last_pts = self._after(pts_s, arrival)

    def hz(self) -> float:
        """Key frames a second (0: fewer than three timed on one clock)."""
        return _rate(self._times)

    def hz_with(self, pts_s: float | None, arrival: float) -> float:
        """The rate once a key frame of `pts_s` arriving at `arrival` is added (nothing
        added)."""
        return _rate(self._after(pts_s, arrival)[0])

    @property
    def by_pts(self) -> bool:
        """Whether the last key frame was timed by the stream's clock."""
        return bool(self._by_pts)


class AvStreamSource:
    """A live RTSP/HTTP stream decoded by PyAV (`decoder = "pyav"`, or "auto" where PyAV is
    installed): measured cheaper than OpenCV's capture per frame (0.8x), with each frame's
    PTS, and able to decode key frames only (docs/benchmarks.md). Read by a reader thread
    that keeps the newest frame (as CaptureSource's). `rate_hint(hz)`: the rate frames are
    taken at (the pipeline's cap); at or below the stream's measured key-frame rate only key
    frames are decoded (FFmpeg's skip_frame NONKEY: P-frames need their references, so a
    reader that serves 1 frame a second from 25 still decodes 25 otherwise), and of those only
    the first after each frame's due time (a stream with 2.5 key frames a second read at
    1 fps decodes 1 a second), served as it is decoded (`paced`). Decoding resumes at every
    frame from the next key frame."""

    live = True

    def __init__(self, cfg: SourceConfig):
        import av

        # every SourceError below is raised `from None`: PyAV's messages carry the URL,
        # credentials and all, and a chained cause would print them in a traceback
        self._av = av
        self._cfg, self._shown = cfg, shown(cfg.path)
        opts = {}
        rtsp = cfg.path.lower().startswith("rtsp")
        if rtsp and cfg.transport != "auto":
            opts["rtsp_transport"] = cfg.transport
        self._c = None  # the container: closed on every way out of here but success
        try:
            self._connect(cfg, opts, rtsp)
            try:
                self._dec = self._decoder(False)
            except av.error.FFmpegError as e:
                raise SourceError(f"source.path {self._shown!r}: cannot set up its decoder "
                                  f"({_why(e)})") from None
            self._packets = self._packet_iter()
            self._bgr = av.video.reformatter.VideoReformatter()  # decoded frames to BGR
            # PyAV 17 gave reformatting threads (sws_scale_frame); before, it ran on the
            # caller's thread and took no `threads`
            self._bgr_kw: dict = {"threads": 1} if _av_major(av) >= 17 else {}
            if cfg.frame_size:  # scaled in the same swscale pass (AREA: the cheapest measured)
                self._bgr_kw.update(width=cfg.frame_size[0], height=cfg.frame_size[1],
                                    interpolation="AREA")
            self._shape = FrameShape(self._shown, cfg.frame_size)
            self._params: dict[int, bytes] = {}  # last SPS and PPS: a new decoder's first NALs
            self._units: collections.deque = collections.deque()  # NALs (or packets) to decode
            # decoded, unread: (BGR image, decoded from damaged data: _read_one)
            self._ready: collections.deque[tuple[np.ndarray, bool]] = collections.deque()
            self._tainted = False  # damage met since the last clean key frame
            self._lost = False  # RTP packets lost: the next picture queued is damaged
            self._take_key = True  # key frames only: the key frame being read is decoded
            self.damaged = 0  # packets the decoder refused and frames it concealed damage in
            self.converted = 0  # frames converted to BGR (those passed over are not)
            self._damaged_told = 0  # of those, already handed over with a frame
            self._keys = KeyRate()  # key frames seen, on the stream's clock where it has one
            # PTS units to seconds (packets of a demuxed stream carry its time base)
            self._tb = self._time_base()
            self._hint_hz = 0.0
            self._skip = False  # decoding key frames only
            # under a rate cap: when the next frame is due (key frames only: none is decoded
            # before it), planned at each frame served and again when the cap changes
            self._clock = CapClock()
            self._leave = False  # key frames only: left at the key picture begun (_next_unit)
            self.keyframes_only = False  # what the reader does now (said in the log)
            self._reader = LatestFrame(self._read_one, self._shown, start=False)
            self._reader.start()  # _read_one reads self._reader
        except BaseException:
            # the connection is open (its RTSP socket, its session on the camera): left to the
            # garbage collector, each failed open held one until a collection ran
            self._close_container()
            raise

    def _connect(self, cfg: SourceConfig, opts: dict, rtsp: bool) -> None:
        """Open the stream: self._c, its video stream, and for H.264 over RTSP the NAL and
        picture assemblers (SourceError when it cannot be opened)."""
        av = self._av
        t0 = time.monotonic()
        try:
            # H.264 over RTSP is read without FFmpeg's parser (NalAssembler: a frame is
            # decoded as its last packet arrives, not one frame interval later); another
            # codec is opened again with the parser
            self._c = self._open(cfg, dict(opts, fflags="noparse+nofillin") if rtsp else opts)
            self._stream = self._c.streams.video[0]
            self._asm: NalAssembler | None = None
            if rtsp and self._stream.codec_context.name == "h264":
                self._asm = NalAssembler()
                self._aus = AccessUnits()
            elif rtsp:
                self._close_container()
                self._c = self._open(cfg, opts)
                self._stream = self._c.streams.video[0]
        except av.error.HTTPUnauthorizedError:
            raise CredentialsRefused(f"source.path {self._shown!r}: the server refused the "
                                     "credentials (401 Unauthorized): check the user and password "
                                     "in the URL") from None
        except (av.error.FFmpegError, OSError, IndexError) as e:
            if time.monotonic() - t0 >= cfg.open_timeout_s * 0.9:
                raise OpenTimedOut(f"source.path {self._shown!r}: no stream within "
                                   f"{cfg.open_timeout_s:g} s (open_timeout_s): the server "
                                   "does not answer") from None  # PyAV holds no lock
            why = ("cannot open (no video stream)" if isinstance(e, IndexError) else
                   unresolved(cfg.path) or f"cannot open ({_why(e)})")
            raise SourceError(f"source.path {self._shown!r}: {why}") from None

    def _packet_iter(self):
        """The stream's packets (av.Packet; RtpStreamSource: RtpPayload)."""
        return self._c.demux(self._stream)

    def _time_base(self) -> float:
        """Seconds a PTS unit (0: none known)."""
        return float(self._stream.time_base or 0)

    def _extradata(self) -> bytes | None:
        """The decoder's extradata (SPS/PPS as the demuxer read them)."""
        return self._stream.codec_context.extradata

    def _close_container(self) -> None:
        c, self._c = self._c, None
        if c is not None:
            with contextlib.suppress(Exception):
                c.close()

    @staticmethod
    def _open(cfg: SourceConfig, opts: dict):
        import av

        c = av.open(cfg.path, options=opts, timeout=(cfg.open_timeout_s, cfg.read_timeout_s))
        if not c.streams.video:
            c.close()
            raise IndexError("no video stream")
        return c

    def _decoder(self, keys_only: bool):
        """A decoder for this stream; `keys_only`: key frames only (skip_frame NONKEY) and
        without the deblocking filter: a key frame decoded alone is no frame's reference, and
        the filter was 17 % of its decode at 720p (docs/benchmarks.md)."""
        if self._asm is None and not keys_only:
            cc = self._stream.codec_context
        else:
            cc = self._av.CodecContext.create("h264", "r")
            cc.extradata = self._extradata()
            opts = {}
            if keys_only:
                opts["skip_loop_filter"] = "all"
                cc.skip_frame = "NONKEY"
            cc.options = opts
        cc.thread_count = 1  # the reader's thread: its CPU clock is the decode's
        return cc

    def key_frame_hz(self) -> float:
        """Key frames a second, measured over the last few by the stream's clock (0: fewer
        than three seen)."""
        return self._keys.hz()

    def _seconds(self, pts: int | None) -> float | None:
        """A PTS in seconds (None: none, or no time base to read it by)."""
        return pts * self._tb if pts is not None and self._tb > 0 else None

    def _wants_keys(self, kf: float) -> bool:
        """Whether key frames alone are to be decoded at `kf` key frames a second: 10 % slack
        (a 1 s GOP read at a 1 fps cap measures 0.95-1.05 key frames/s); back to every frame
        only past 25 % (no flapping at the edge)."""
        return 0 < self._hint_hz <= kf * (1.25 if self._skip else 1.1)

    def rate_hint(self, hz: float) -> None:
        """The rate frames will be taken at (0 or inf: as they come). A new rate applies at
        once: the next frame's due time is planned again, as if the last frame had been
        served under it (planned at a 0.1 Hz cap, it held the frames of a 5 Hz cap set
        after it up to 10 s)."""
        if hz == self._hint_hz:
            return
        self._hint_hz = hz
        self._clock.replan(self._step(), hz)

    def _step(self) -> float:
        """next_due's step: the interval between frames decoded under the cap (0: unpaced)."""
        kf, hint = self.key_frame_hz(), self._hint_hz
        return 1 / kf if self.keyframes_only and kf > 0 and hint > 0 else self._spaced()

    @property
    def paced(self) -> bool:
        """It serves at the hinted rate itself, the first frame decoded after each frame's due
        time, handed over as it is decoded (key frames only: the first key frame after it;
        every frame: where the rate is at most 2/3 of the stream's, so that a frame comes
        between two due times): the pipeline does not wait out the rate cap after its frames,
        or each would be served a wait late. Measured at 720p: decode to inference p50
        17-22 ms at 5 and 12.5 Hz caps when the newest frame waited for the cap's tick, one
        frame interval at worst (docs/sources.md)."""
        return self.keyframes_only or self._spaced() > 0

    def _spaced(self) -> float:
        """Every frame decoded under a rate cap: the stream's frame interval, else 0."""
        return spaced(self._reader.interval, self._hint_hz)

    def _never_served(self) -> bool:
        """Every frame decoded under a rate cap: whether a frame decoded now is never served
        (CapClock.never_served)."""
        return not self._skip and self._clock.never_served(time.monotonic(), self._spaced())

    def _next_unit(self, t0: float) -> tuple[object, str, int | None, bool]:
        """The next picture to decode (a packet, or bytes from AccessUnits), whether it is
        a key frame ("key") or not ("slice"), its PTS (None: none), and whether packets were
        lost ahead of it (an RTP sequence gap: RtpStreamSource): it or a picture it needs
        is damaged."""
        av = self._av
        while not self._units:
            try:
                packet = next(self._packets)
            except StopIteration:
                raise SourceError(f"{self._shown}: the stream ended") from None
            except (av.error.FFmpegError, OSError) as e:
                if time.monotonic() - t0 >= self._cfg.read_timeout_s * 0.9:
                    raise SourceError(f"{self._shown}: no frame for "
                                      f"{self._cfg.read_timeout_s:g} s (read_timeout_s): the "
                                      "stream stalled") from None
                raise SourceError(f"{self._shown}: the stream failed ({_why(e)})") \
                    from None
            if packet.size == 0:
                continue
            pts = packet.pts
            if self._asm is None:
                self._units.append((packet, "key" if packet.is_keyframe else "slice", pts,
                                    False))
                continue
            asm, aus = self._asm, self._aus
            if isinstance(packet, RtpPayload):  # the NAL's end known from the RTP packet
                data, ends = packet.data, packet.ends
                if packet.lost:  # the NAL being gathered is dropped, and the next picture
                    asm.lose()   # handed over (the one it was in, or a later one) is
                    self._lost = True  # marked: damaged until the next clean key frame
            else:
                data, ends = memoryview(packet), None
            begun, keys, oversize = asm.dropped_begun, asm.keys_begun, asm.oversize + aus.oversize
            for nal, nal_pts in asm.push(data, pts, ends):
                kind = nal_type(nal)
                if kind in (7, 8):  # a new decoder's first NALs (key frames only)
                    self._params[kind] = nal
                self._queue(aus.push(nal, nal_pts))
            if asm.dropped_begun != begun:  # the key picture before it is whole
                self._queue(aus.boundary())
            if asm.oversize + aus.oversize != oversize:  # a NAL or picture dropped
                self.damaged += asm.oversize + aus.oversize - oversize
                self._tainted = True
            if asm.keys_begun != keys and self._skip:
                # whether key frames only is left at this key frame is decided here, once, as
                # its first slice begins (the rate as _read_one will see it), and _read_one
                # follows it: the picture after it is gathered from its first slice on. Where
                # the camera sends no AUDs, a several-slice key picture ends only where that
                # picture begins; dropped, every frame to the next key frame was decoded from a
                # missing reference: wrong pictures, none flagged corrupt (docs/sources.md).
                # Decided again when the picture is whole, a rate or cap that moved in between
                # dropped it anyway. Its time: this packet's PTS (the key picture's first)
                self._leave = not self._wants_keys(
                    self._keys.hz_with(self._seconds(pts), time.monotonic()))
                if self._leave:
                    asm.drop_types = frozenset()
        return self._units.popleft()

    def _queue(self, pictures: list[Picture]) -> None:
        """Pictures to decode, the first marked where packets were lost before it."""
        for pic, key, pts in pictures:
            self._units.append((pic, "key" if key else "slice", pts, self._lost))
            self._lost = False

    def _read_one(self) -> tuple[np.ndarray, bool]:
        """On the reader thread: the next decoded frame (a key frame alone when skipping) and
        whether it was decoded from damaged data (a damage since the last clean key frame)."""
        t0 = time.monotonic()
        av = self._av
        while not self._ready:
            unit, what, pts, lost = self._next_unit(t0)
            if lost:
                self.damaged += 1
                self._tainted = True
            if what == "key":
                self._keys.add(self._seconds(pts), time.monotonic())
                kf = self.key_frame_hz()
                # leaving key frames only was decided as this picture began (_next_unit)
                want = (not self._leave if self._asm is not None and self._skip
                        else self._wants_keys(kf))
                self._leave = False
                if want != self._skip:  # switched at a key frame: no P-frame misses its
                    self._skip = want   # references when every frame is decoded again
                    if self._asm is not None:  # a decoder of its own, given the last SPS/PPS
                        self._dec = self._decoder(want)
                        for nal in self._params.values():
                            with contextlib.suppress(av.error.FFmpegError):
                                self._dec.decode(av.Packet(nal))
                    else:
                        self._dec.skip_frame = "NONKEY" if want else "DEFAULT"
                    self.keyframes_only = want
                    log.info("%s: %s (frames taken at %.3g/s, %.3g key frames/s)",
                             self._shown, "decoding key frames only" if want else
                             "decoding every frame again", self._hint_hz, kf)
                if self._asm is not None:  # at every key frame: set early above, or not
                    self._asm.drop_types = _P_SLICES if want else frozenset()
                self._take_key = not (want and time.monotonic() < self._clock.due)
                if self._reader.stopping.is_set():
                    raise SourceError(f"{self._shown}: closing")
            if what == "key" and not self._take_key:
                continue  # before the next frame is due: not decoded either
            if what == "slice" and self._skip:
                if self._reader.stopping.is_set():
                    raise SourceError(f"{self._shown}: closing")
                continue  # not even handed to the decoder
            try:
                frames = self._dec.decode(
                    unit if isinstance(unit, av.Packet) else av.Packet(unit))
            except av.error.FFmpegError:
                self.damaged += 1  # the decoder resynchronises at the next one
                self._tainted = True  # the pictures after it miss a reference
                continue
            for f in frames:
                # FFmpeg flags only the picture it concealed damage in (is_corrupt); those
                # that reference it carry the damage unflagged up to the next key frame
                # (measured: 30-53 % of their pixels off, docs/sources.md). So every frame
                # from a damage to the next key frame decoded clean is not judged
                if f.is_corrupt:
                    self.damaged += 1
                    self._tainted = True
                elif f.key_frame and not lost:
                    self._tainted = False
                if self._never_served():
                    # counted and numbered as decoded and passed over, not converted (~0.4 ms
                    # a 720p frame: 4 of 5 frames at a 5 Hz cap of 25 fps were converted for
                    # nothing)
                    self._reader.passed()
                    if self._reader.stopping.is_set():
                        raise SourceError(f"{self._shown}: closing")
                    t0 = time.monotonic()  # the stall timeout counts from the last frame
                    continue
                # one converter for the stream, on this thread: `to_ndarray(format=...)` made
                # a swscale context per frame with a thread pool of its own (PyAV 17+), two
                # threads started and ended each frame, their CPU on no stage's clock
                # (~0.4 ms a 720p frame beside the reader's own, docs/sources.md)
                self._shape.check(f.width, f.height)
                self._ready.append((self._bgr.reformat(f, format="bgr24", **self._bgr_kw)
                                    .to_ndarray(), self._tainted))
                self.converted += 1
        return self._ready.popleft()

    def read(self, timeout_s: float) -> Frame | None:
        """The newest decoded frame (a key frame just decoded, when skipping; under a rate
        cap, the first decoded after its due time)."""
        got = self._reader.take(timeout_s, self._clock.due if self.paced else -math.inf)
        if got is None:
            return None
        (img, tainted), t0, n, cpu, skipped = got
        d = self.damaged  # read once: the reader thread adds to it
        damaged, self._damaged_told = d - self._damaged_told, d
        self._clock.served(time.monotonic(), self._step(), self._hint_hz)
        return Frame(img, f"frame-{n}", t=t0, decode_cpu_s=cpu, decoded_apart=True,
                     skipped=skipped, damaged=damaged, not_judged=_DAMAGED if tainted else "")

    def done(self, frames: list[Frame]) -> None:
        """Nothing to remember."""

    def close(self) -> None:
        """Stop the reader, then close the connection."""
        if not self._reader.stop():
            log.warning("%s: the reader is still inside a read after %.0f s; the stream is "
                        "left to it", self._shown, LatestFrame.JOIN_S)
            return
        self._close_container()


_P_SLICES = frozenset({1, 2, 3, 4})  # NAL types of slices other than a key frame's
_DAMAGED = ("decoded from damaged stream data (FFmpeg concealed damage in this picture or in "
            "one it references): not judged until the next clean key frame")


def _rate(times: list[float]) -> float:
    """Events a second over ascending `times` (0: fewer than three, or no time between)."""
    if len(times) < 3 or times[-1] <= times[0]:
        return 0.0
    return (len(times) - 1) / (times[-1] - times[0])


def _av_major(av) -> int:
    """PyAV's major version (0 where it cannot be read)."""
    try:
        return int(str(av.__version__).split(".")[0])
    except ValueError:
        return 0


def _why(e: BaseException) -> str:
    """An FFmpeg/OS error's reason without the URL it names (credentials)."""
    return redact(str(getattr(e, "strerror", None) or type(e).__name__))[:200]
