"""A live H.264 RTSP stream read by edgerun's own RTSP client (`[source] decoder = "rtp"`) and
decoded by PyAV's H.264 decoder: AvStreamSource with its packets from rtsp_client.py in
place of FFmpeg's RTSP demuxer (the same NAL and picture assembly, key frames only under a low
rate cap, damage rules); a sequence gap marks the picture damaged."""

from __future__ import annotations

import contextlib

from runtime.config.source import SourceConfig
from runtime.frames.av_source import AccessUnits, AvStreamSource, NalAssembler
from runtime.frames.rtsp_client import RtspClient

_START4 = b"\x00\x00\x00\x01"


class RtpStreamSource(AvStreamSource):
    """AvStreamSource reading RTSP over TCP itself (module doc; docs/sources.md): its CPU a
    second of a 720p25 stream is about half FFmpeg's demuxer's (docs/benchmarks.md)."""

    def _connect(self, cfg: SourceConfig, opts: dict, rtsp: bool) -> None:
        """Open the RTSP session (SourceError when it cannot be opened) and the NAL and
        picture assemblers."""
        self._client: RtspClient | None = None
        self._client = RtspClient(cfg.path, cfg.open_timeout_s, cfg.read_timeout_s)
        self._asm = NalAssembler()
        self._aus = AccessUnits()
        # the later fragments of a P slice followed but not gathered (key frames only) are
        # not handed over at all
        self._client.rtp.follower = self._asm

    def _packet_iter(self):
        """The H.264 track's RTP payloads."""
        assert self._client is not None
        return self._client.payloads()

    def _time_base(self) -> float:
        """Seconds a PTS unit: the RTP clock's (90 kHz for video)."""
        assert self._client is not None
        return 1.0 / self._client.track.clock_rate

    def _extradata(self) -> bytes | None:
        """The SDP's SPS and PPS (sprop-parameter-sets) in Annex B (None: not given, they
        come in-band)."""
        assert self._client is not None
        return b"".join(_START4 + p for p in self._client.track.params) or None

    def _close_container(self) -> None:
        client, self._client = getattr(self, "_client", None), None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def close(self) -> None:
        """Wake the reader out of its recv() (the socket shut down: the stream ends), stop
        it, then TEARDOWN and close."""
        client = getattr(self, "_client", None)
        if client is not None:
            client.interrupt()
        super().close()
