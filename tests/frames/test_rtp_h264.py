"""rtp_h264.py: RTSP's interleaved framing split from its replies whatever the recv() sizes,
RTP headers parsed (CSRCs, extension, padding, sequence and timestamp wraps), single NAL /
STAP-A / FU-A packets turned into NAL units with where each ends, a sequence gap dropping the
NAL it cut and marking what comes next, hostile bytes dropped and counted, never read past;
and NalAssembler taking those payloads (their ends known) back into whole NALs."""

from __future__ import annotations

import pytest

from runtime.frames.av_source import NalAssembler
from runtime.frames.rtp_h264 import (
    REPLY_BODY_MAX,
    REPLY_HEAD_MAX,
    WAKE_MAX,
    FramingError,
    Interleaved,
    RtpH264,
    wake_bytes,
)

SC = b"\x00\x00\x00\x01"
PT = 96


def rtp(seq: int, payload: bytes, ts: int = 9000, pt: int = PT, ssrc: int = 0x1234,
        csrc: int = 0, ext: bytes = b"", pad: int = 0, version: int = 2) -> bytes:
    """An RTP packet (RFC 3550 5.1)."""
    b0 = (version << 6) | (0x20 if pad else 0) | (0x10 if ext else 0) | csrc
    head = bytes([b0, pt]) + seq.to_bytes(2, "big") + ts.to_bytes(4, "big") + \
        ssrc.to_bytes(4, "big") + b"\x00\x00\x00\x07" * csrc
    if ext:
        head += b"\xbe\xde" + (len(ext) // 4).to_bytes(2, "big") + ext
    tail = bytes(pad - 1) + bytes([pad]) if pad else b""
    return head + payload + tail


def fu(nal: bytes, size: int) -> list[bytes]:
    """`nal` (header first) as FU-A payloads of `size` bytes of its body each."""
    ind, body = (nal[0] & 0xE0) | 28, nal[1:]
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    out = []
    for i, part in enumerate(parts):
        h = (nal[0] & 0x1F) | (0x80 if i == 0 else 0) | (0x40 if i == len(parts) - 1 else 0)
        out.append(bytes([ind, h]) + part)
    return out


def stap(*nals: bytes) -> bytes:
    return b"\x18" + b"".join(len(n).to_bytes(2, "big") + n for n in nals)


IDR = b"\x65\x88" + bytes(range(256)) * 3  # a key frame's slice, 770 bytes
P = b"\x41\x9a" + b"\x11" * 300
SPS, PPS = b"\x67\x42\xc0\x1e\xda", b"\x68\xce\x3c\x80"


def payloads(r: RtpH264, packets: list[bytes]) -> list[tuple[bytes, bool, int]]:
    return [(bytes(p.data), p.ends, p.lost) for pkt in packets for p in r.push(pkt)]


@pytest.mark.parametrize(("packets", "want", "lost", "malformed"), [
    # one NAL whole: its start code, it ends there
    ([rtp(1, P)], [(SC + P, True, 0)], 0, 0),
    # STAP-A: each NAL its own, each whole
    ([rtp(1, stap(SPS, PPS, P))], [(SC + SPS, True, 0), (SC + PPS, True, 0), (SC + P, True, 0)],
     0, 0),
    # FU-A: the NAL header rebuilt ahead of the first fragment, the rest bare, ends on the last
    ([rtp(1 + i, p) for i, p in enumerate(fu(IDR, 300))],
     [(SC + IDR[:1] + IDR[1:301], False, 0), (IDR[301:601], False, 0), (IDR[601:], True, 0)],
     0, 0),
    # a middle fragment lost: the NAL is never finished, the next NAL is marked
    ([rtp(1, fu(IDR, 300)[0]), rtp(3, fu(IDR, 300)[2]), rtp(4, P)],
     [(SC + IDR[:301], False, 0), (SC + P, True, 1)], 1, 0),
    # joined mid-NAL: its later fragments begin nothing
    ([rtp(7, fu(IDR, 300)[1]), rtp(8, fu(IDR, 300)[2]), rtp(9, P)], [(SC + P, True, 0)], 0, 0),
    # the sequence number wraps: no gap
    ([rtp(0xFFFF, P), rtp(0, P)], [(SC + P, True, 0), (SC + P, True, 0)], 0, 0),
    # 3 lost across the wrap, told once with the next payload
    ([rtp(0xFFFE, P), rtp(2, P)], [(SC + P, True, 0), (SC + P, True, 3)], 3, 0),
    # a repeated or late packet: dropped, no gap
    ([rtp(5, P), rtp(5, P), rtp(4, P), rtp(6, P)], [(SC + P, True, 0), (SC + P, True, 0)], 0, 0),
    # CSRCs, a header extension and padding are skipped
    ([rtp(1, P, csrc=2, ext=b"\x01\x02\x03\x04", pad=5)], [(SC + P, True, 0)], 0, 0),
    # not version 2, another payload type, too short, a header past the packet: dropped
    ([rtp(1, P, version=1), rtp(2, P, pt=97), b"\x80\x60\x00", rtp(3, b"", csrc=3)[:20]],
     [], 0, 4),
    # a STAP-A size past its end, FU-B, NAL type 0: dropped, the stream goes on
    ([rtp(2, stap(P)[:50]), rtp(3, b"\x1d\x85abc"), rtp(4, b"\x00abc"), rtp(5, P)],
     [(SC + P, True, 0)], 0, 3),
])
def test_rtp_packets_become_nal_units(packets, want, lost, malformed):
    r = RtpH264(PT)
    assert payloads(r, packets) == want
    assert (r.lost, r.malformed) == (lost, malformed)


def test_padding_past_the_payload_is_dropped():
    pkt = bytearray(rtp(1, b"\x41\x9a"))
    pkt[0] |= 0x20
    pkt[-1] = 200  # 200 bytes of padding in a 14-byte packet
    r = RtpH264(PT)
    assert r.push(bytes(pkt)) == [] and r.malformed == 1


def test_timestamps_are_unwrapped_past_2_32():
    r = RtpH264(PT)
    got = [r.push(rtp(i, P, ts=ts))[0].pts for i, ts in
           enumerate([0xFFFFFF00, 0xFFFFFFF0, 0x10, 0x100, 0x80])]
    assert got == [0, 0xF0, 0x110, 0x200, 0x180]  # a step back stays a step back


def test_a_new_ssrc_is_a_new_stream_and_damage():
    r = RtpH264(PT)
    r.push(rtp(100, fu(IDR, 300)[0]))
    (p,) = r.push(rtp(5, P, ssrc=0x9999))
    assert p.lost == 1 and p.ends
    assert r.push(rtp(6, fu(IDR, 300)[1], ssrc=0x9999)) == []  # the old NAL is not continued


@pytest.mark.parametrize("size", [100, 300, 1000])
def test_nal_assembler_takes_the_payloads_back_into_whole_nals(size):
    """The payloads with their ends known: each NAL whole as its last packet comes, whatever
    the fragment sizes (the size rule of FFmpeg's packets not used); P slices followed and
    not gathered where key frames alone are wanted."""
    r, a = RtpH264(PT), NalAssembler()
    packets = [rtp(1, stap(SPS, PPS))]
    packets += [rtp(2 + i, p) for i, p in enumerate(fu(IDR, size))]
    packets += [rtp(50 + i, p) for i, p in enumerate(fu(P, size))]
    got = []
    for pkt in packets:
        for pl in r.push(pkt):
            got.append([n for n, _ in a.push(pl.data, pl.pts, pl.ends)])
    assert [n for g in got for n in g] == [SC + SPS, SC + PPS, SC + IDR, SC + P]
    ends = [i for i, g in enumerate(got) if g]
    assert len(ends) == 4  # each NAL as its last packet came, none waited for the next
    a2, r2 = NalAssembler(), RtpH264(PT)
    a2.drop_types = frozenset({1})
    out = [n for pkt in packets for pl in r2.push(pkt) for n, _ in a2.push(pl.data, pl.pts,
                                                                          pl.ends)]
    assert out == [SC + SPS, SC + PPS, SC + IDR]


def test_a_followed_nals_later_fragments_are_not_handed_over():
    """Key frames only: of a P slice (a type the assembler follows, not gathers) only its
    first fragment, where it begins; the key frame's slice whole; the assembler counts the
    P slice begun (a picture boundary) and returns the same NALs as with every fragment."""
    packets = [rtp(1 + i, p) for i, p in enumerate(fu(IDR, 300))]
    packets += [rtp(10 + i, p) for i, p in enumerate(fu(P, 100))]
    packets += [rtp(20 + i, p) for i, p in enumerate(fu(IDR, 300))]
    runs = {}
    for follow in (False, True):
        a = NalAssembler()
        a.drop_types = frozenset({1})
        r = RtpH264(PT, a if follow else None)
        handed, nals = 0, []
        for pkt in packets:
            for pl in r.push(pkt):
                handed += 1
                nals += [n for n, _ in a.push(pl.data, pl.pts, pl.ends)]
        runs[follow] = (handed, nals, a.dropped_begun)
    assert runs[True][1] == runs[False][1] == [SC + IDR, SC + IDR]
    assert runs[True][2] == runs[False][2] == 1
    assert runs[False][0] - runs[True][0] == len(fu(P, 100)) - 1


def test_a_lost_packet_drops_the_nal_being_gathered():
    r, a = RtpH264(PT), NalAssembler()
    frags = fu(IDR, 300)
    out = []
    for pkt in [rtp(1, frags[0]), rtp(2, frags[1]), rtp(4, P)]:
        for pl in r.push(pkt):
            if pl.lost:
                a.lose()
            out += [n for n, _ in a.push(pl.data, pl.pts, pl.ends)]
    assert out == [SC + P]  # not the key frame's slice cut short, nor glued to the P


def _stream() -> tuple[bytes, list[tuple[int, bytes]], list[tuple[bytes, bytes]]]:
    frames = [(0, rtp(1, P)), (1, b"\x80\xc8" + bytes(26)), (0, rtp(2, IDR)), (0, b"")]
    reply = (b"RTSP/1.0 200 OK\r\nCSeq: 5\r\nContent-Length: 4", b"abcd")
    req = (b"GET_PARAMETER rtsp://x RTSP/1.0\r\nCSeq: 1", b"")
    wire = b"".join(b"$" + bytes([c]) + len(d).to_bytes(2, "big") + d for c, d in frames[:2])
    wire += reply[0] + b"\r\n\r\n" + reply[1]
    wire += b"".join(b"$" + bytes([c]) + len(d).to_bytes(2, "big") + d for c, d in frames[2:])
    wire += req[0] + b"\r\n\r\n"
    return wire, frames, [reply, req]


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5, 7, 13, 100, 10_000])
def test_interleaved_frames_are_split_whatever_the_recv_sizes(chunk):
    wire, frames, replies = _stream()
    it = Interleaved()
    got_f, got_r = [], []
    for i in range(0, len(wire), chunk):
        f, r = it.feed(wire[i:i + chunk])
        got_f += [(c, bytes(d)) for c, d in f]
        got_r += r
    assert got_f == frames
    assert got_r == replies


@pytest.mark.parametrize("chunk", [1, 3, 4, 17, 100, 1500, 100_000])
def test_framing_and_rtp_in_one_pass_equal_them_apart(chunk):
    """Interleaved.feed_rtp (the reader's loop: a skipped NAL's later fragments passed over
    without a call) gives the payloads feed + RtpH264.push give, wherever recv() cuts the
    stream: key frames gathered, P slices followed from their first fragment, a gap inside a
    skipped NAL and one inside a gathered NAL marked on the next payload, RTCP ignored."""
    seqs = iter(range(1, 1000))
    pkts = [rtp(next(seqs), stap(SPS, PPS))]
    pkts += [rtp(next(seqs), p) for p in fu(IDR, 200)]
    for k in range(3):
        pkts += [rtp(next(seqs), p, ts=9000 + 3600 * k) for p in fu(P, 40)]
    next(seqs)  # lost inside nothing: before the next NAL
    frags = fu(P, 40)
    pkts += [rtp(next(seqs), frags[0]), rtp(next(seqs), frags[1])]
    next(seqs)  # lost inside a skipped P slice
    pkts += [rtp(next(seqs), p) for p in frags[3:]]
    frags = fu(IDR, 200)
    pkts += [rtp(next(seqs), frags[0])]
    next(seqs)  # lost inside the key frame's slice
    pkts += [rtp(next(seqs), p) for p in frags[2:]] + [rtp(next(seqs), P)]
    wire = b"".join(b"$\x00" + len(p).to_bytes(2, "big") + p for p in pkts)
    rtcp = b"$\x01\x00\x08" + bytes(8)
    wire = rtcp + wire + rtcp

    def follower():
        a = NalAssembler()
        a.drop_types = frozenset({1})
        return a

    apart, r = [], RtpH264(PT, follower())
    frames, _ = Interleaved().feed(wire)
    for ch, data in frames:
        if ch == 0:
            apart += [(bytes(p.data), p.pts, p.ends, p.lost) for p in r.push(data)]
    one, r1, it = [], RtpH264(PT, follower()), Interleaved()
    for i in range(0, len(wire), chunk):
        out, _ = it.feed_rtp(wire[i:i + chunk], r1, 0)
        one += [(bytes(p.data), p.pts, p.ends, p.lost) for p in out]
    assert one == apart
    assert (r1.packets, r1.lost) == (r.packets, r.lost) == (len(pkts), 3)
    assert [x[3] for x in one if x[3]] == [1, 1, 1]


@pytest.mark.parametrize(("wire", "why"), [
    (b"\x00\x01garbage-not-rtsp", "neither"),
    (b"RTSP/1.0 200 OK\r\n" + b"X: y\r\n" * (REPLY_HEAD_MAX // 6 + 1), "head past"),
    (b"RTSP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % (REPLY_BODY_MAX + 1), "body of"),
    (b"RTSP/1.0 200 OK\r\nContent-Length: -5\r\n\r\n", "not a size"),
    (b"RTSP/1.0 200 OK\r\nContent-Length: 99999999999999\r\n\r\n", "not a size"),
])
def test_what_is_not_interleaved_rtsp_is_refused_within_bounds(wire, why):
    it = Interleaved()
    with pytest.raises(FramingError, match=why):
        for i in range(0, len(wire), 1000):
            it.feed(wire[i:i + 1000])


@pytest.mark.parametrize(("holding", "key_bytes", "want"), [
    (False, 80_000, 1),  # every frame decoded (or a key picture being read): every byte
    (True, 0, 1),  # no key frame measured yet
    (True, 80_000, 40_000),  # half the last key slice: the next one wakes the reader
    (True, 3, 1),
    (True, 10 << 20, WAKE_MAX),
])
def test_the_bytes_a_read_waits_for(holding, key_bytes, want):
    assert wake_bytes(holding, key_bytes) == want


def test_the_reader_waits_for_bytes_only_between_key_pictures_while_p_slices_are_dropped():
    """wake(): one byte while a key picture is read or every slice is kept; half the last key
    slice (its size measured from its FU-A fragments, or sent whole) while the slice begun
    last is a P slice the follower drops; the last key slice's RTP time kept."""
    a = NalAssembler()
    a.drop_types = frozenset({1})
    r = RtpH264(PT, a)
    seqs = iter(range(1, 1000))

    def wakes(packets: list[bytes]) -> list[int]:
        out = []
        for pkt in packets:
            r.push(pkt)
            out.append(r.wake())
        return out

    assert wakes([rtp(next(seqs), stap(SPS, PPS))]) == [1]
    key = [rtp(next(seqs), p, ts=9000) for p in fu(IDR, 300)]
    assert wakes(key) == [1, 1, 1] and r.key_bytes == len(IDR) and r.key_pts == 0
    p_frags = fu(P, 100)
    assert wakes([rtp(next(seqs), p, ts=12600) for p in p_frags]) == [len(IDR) // 2] * len(p_frags)
    assert wakes([rtp(next(seqs), P, ts=16200)]) == [len(IDR) // 2]  # sent whole
    small = IDR[:101]
    assert wakes([rtp(next(seqs), small, ts=99000)]) == [1]  # a key slice sent whole
    assert r.key_bytes == len(small) and r.key_pts == 90000
    assert wakes([rtp(next(seqs), P, ts=102600)]) == [len(small) // 2]
    a.drop_types = frozenset()  # every frame decoded again: every byte at once
    assert r.wake() == 1
    assert RtpH264(PT).wake() == 1  # no follower: nothing dropped
