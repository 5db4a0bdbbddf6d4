"""NalAssembler: whole H.264 NALs out of FFmpeg's RTSP packets read without its parser, a NAL
ended by its last fragment's size (not by the next frame's start), the size rule given up on
a stream where it is found wrong, unwanted NAL types followed but not gathered. AccessUnits:
pictures out of those NALs, a one-slice picture at once, several-slice pictures whole."""

from __future__ import annotations

import pytest

from runtime.frames.av_source import (
    AccessUnits,
    KeyRate,
    NalAssembler,
    first_slice,
    nal_type,
)

SC = b"\x00\x00\x00\x01"
FULL = 100  # the payloader's fragment size in these tables


class Nals(NalAssembler):
    """The assembler with the PTS of its NALs left off: the tables below are about where
    NALs end (the PTS carried: test_the_pts_of_a_packet_is_carried_to_its_nals_and_picture)."""

    def push(self, data, pts=None):  # type: ignore[override]
        return [nal for nal, _ in super().push(data, pts)]


class Pics(AccessUnits):
    """AccessUnits with the PTS of its pictures left off (as Nals)."""

    def push(self, nal, pts=None):  # type: ignore[override]
        return [(pic, key) for pic, key, _ in super().push(nal, pts)]

    def boundary(self):  # type: ignore[override]
        return [(pic, key) for pic, key, _ in super().boundary()]


def frag_nal(kind: int, sizes: list[int], fill: int = 7) -> list[bytes]:
    """A NAL of `kind` as FFmpeg hands over its FU-A fragments: the first with a start code
    and the NAL header, the rest bare; `sizes`: each fragment's data length."""
    first = SC + bytes([0x60 | kind, 0x80]) + bytes([fill]) * (sizes[0] - 1)
    return [first] + [bytes([fill]) * n for n in sizes[1:]]


def test_a_fragmented_nal_ends_at_its_short_last_fragment():
    a = Nals()
    pkts = frag_nal(5, [FULL, FULL, FULL, 40])
    got = [a.push(p) for p in pkts]
    assert got[:3] == [[], [], []]
    assert got[3] == [b"".join(pkts)]  # at once, not when the next NAL begins
    assert a.ended_early and a.misjudged == 0


@pytest.mark.parametrize(("packets", "ends_at"), [
    # before any full fragment is seen, a NAL sent whole ends only at the next start code
    ([SC + b"\x67abc", SC + b"\x68de"], [[], [SC + b"\x67abc"]]),
    # a last fragment exactly full size: ended by the next start code, as the parser does
    # (the next, a short NAL sent whole, is handed over with it)
    ([*frag_nal(1, [FULL, FULL, FULL]), SC + b"\x09\x10"],
     [[], [], [], [b"".join(frag_nal(1, [FULL, FULL, FULL])), SC + b"\x09\x10"]]),
])
def test_a_nal_not_known_whole_waits_for_the_next_start_code(packets, ends_at):
    a = Nals()
    assert [a.push(p) for p in packets] == ends_at


def test_once_the_fragment_size_is_known_a_small_nal_is_handed_over_at_once():
    a = Nals()
    for p in frag_nal(5, [FULL, FULL, 10]):
        a.push(p)
    assert a.push(SC + b"\x67sps") == [SC + b"\x67sps"]
    assert a.push(SC + b"\x68pps") == [SC + b"\x68pps"]


def test_a_stream_breaking_the_size_rule_falls_back_to_start_codes():
    a = Nals()
    for p in frag_nal(5, [FULL, FULL, 10]):
        a.push(p)
    # a payloader that sends a short fragment mid-NAL: taken as the end, then found wrong
    pkts = frag_nal(1, [FULL, 50, FULL, 20])
    assert a.push(pkts[0]) == [] and a.push(pkts[1]) == [b"".join(pkts[:2])]
    assert a.push(pkts[2]) == [] and a.misjudged == 1 and not a.early_ok
    assert a.push(pkts[3]) == []  # the rest of the NAL cut short: dropped
    nxt = frag_nal(1, [FULL, 30])
    assert [a.push(p) for p in nxt] == [[], []]  # ended by the next start code only
    assert a.push(SC + b"\x09\x10") == [b"".join(nxt)]
    assert a.misjudged == 1


def test_dropped_types_are_followed_not_gathered():
    a = Nals()
    a.drop_types = frozenset({1})
    for p in frag_nal(5, [FULL, FULL, 10]):
        a.push(p)
    assert [a.push(p) for p in frag_nal(1, [FULL, FULL, 5])] == [[], [], []]
    assert a.misjudged == 0
    key = frag_nal(5, [FULL, 9])
    assert [a.push(p) for p in key] == [[], [b"".join(key)]]


@pytest.mark.parametrize("drop", [frozenset(), frozenset({1})])
def test_an_aggregated_packet_is_cut_into_its_nals(drop):
    """STAP-A as FFmpeg hands it over: one packet, a start code (4 or 3 bytes) ahead of each
    NAL; a dropped type inside it is left out and counted as begun."""
    a = Nals()
    a.drop_types = drop
    for p in frag_nal(5, [FULL, FULL, 10]):
        a.push(p)
    aud, sps, p_slice = SC + b"\x09\x10", b"\x00\x00\x01\x67sps", SC + b"\x41\x9a\x01"
    key = SC + b"\x65\x88\x02"
    got = a.push(aud + sps + p_slice)
    assert got == ([aud, sps] if drop else [aud, sps, p_slice])
    assert a.dropped_begun == (1 if drop else 0)
    begun = a.keys_begun
    assert a.push(sps + key) == [sps, key] and a.keys_begun == begun + 1


def test_nal_type_and_first_slice():
    assert nal_type(SC + b"\x65\x88") == 5 and first_slice(SC + b"\x65\x88")
    assert nal_type(b"\x00\x00\x01\x41\x9a") == 1 and first_slice(b"\x00\x00\x01\x41\x9a")
    assert not first_slice(SC + b"\x65\x40")  # first_mb_in_slice > 0: a later slice


AUD, SPS, PPS = SC + b"\x09\xf0", SC + b"\x67\x42", SC + b"\x68\xce"
IDR, P1 = SC + b"\x65\x88\x01", SC + b"\x41\x9a\x02"  # first slices (first_mb_in_slice 0)
P1_LATER = SC + b"\x41\x40\x03"  # a later slice of the same picture


def test_a_one_slice_picture_is_handed_over_with_its_prefix_at_once():
    """Once the first picture is seen whole in one slice (the next one began), each picture
    is handed over as soon as its slice is: the first of a connection waits for the next
    NAL that is not its own, once."""
    aus = Pics()
    assert [aus.push(n) for n in (AUD, SPS, PPS)] == [[], [], []]
    assert aus.push(IDR) == [] and aus.multi_slice is None  # one slice or the first of several
    assert aus.push(AUD) == [(AUD + SPS + PPS + IDR, True)]
    assert aus.multi_slice is False
    assert aus.push(P1) == [(AUD + P1, False)]
    assert aus.push(AUD) == []
    assert aus.push(P1) == [(AUD + P1, False)]


def test_the_first_picture_of_a_one_slice_stream_without_auds_ends_at_the_next_slice():
    aus = Pics()
    assert [aus.push(n) for n in (SPS, PPS, IDR)] == [[], [], []]
    assert aus.push(P1) == [(SPS + PPS + IDR, True), (P1, False)]
    assert aus.push(P1) == [(P1, False)] and aus.multi_slice is False


def test_several_slice_pictures_are_handed_over_whole_when_the_next_begins():
    """The first picture of a connection too: it is held until the next NAL that is not its
    own, so its later slices join it (handed over at its first slice, it was decoded from
    that slice alone, the rest concealed)."""
    aus = Pics()
    aus.push(AUD)
    assert aus.push(P1) == [] and aus.push(P1_LATER) == [] and aus.multi_slice
    assert aus.push(AUD) == [(AUD + P1 + P1_LATER, False)]
    assert aus.push(IDR) == [] and aus.push(SC + b"\x65\x40\x04") == []
    assert aus.push(AUD) == [(AUD + IDR + SC + b"\x65\x40\x04", True)]
    assert aus.push(P1) == [] and aus.push(P1_LATER) == []
    assert aus.push(P1) == [(AUD + P1 + P1_LATER, False)]  # ended by the next first slice


def test_parameter_sets_repeated_between_the_slices_of_a_key_picture_do_not_cut_it():
    """GStreamer's rtph264pay (config-interval=-1) sends SPS and PPS ahead of every slice of
    a key frame: the picture still ends at the next AUD or first slice, with all its slices;
    the repeated parameter sets go ahead of the next picture (where no AUD clears them)."""
    later = SC + b"\x65\x40\x04"
    for first_of_connection in (True, False):
        aus = Pics()
        if not first_of_connection:
            aus.multi_slice = True  # seen earlier on this stream
        got = [p for n in (SPS, PPS, IDR, SPS, PPS, later, SPS, PPS, later, P1)
               for p in aus.push(n)]
        assert got == [(SPS + PPS + IDR + later + later, True)]
        assert aus.multi_slice
        assert aus.push(P1_LATER) == [] and aus.push(AUD) == [
            (SPS + PPS + SPS + PPS + P1 + P1_LATER, False)]


def test_a_connection_begun_mid_picture_drops_the_rest_of_it_and_knows_it_is_several_slice():
    aus = Pics()
    assert aus.push(P1_LATER) == [] and aus.multi_slice
    assert aus.push(P1) == [] and aus.push(P1_LATER) == []
    assert aus.push(AUD) == [(P1 + P1_LATER, False)]


def test_the_prefix_is_bounded_on_a_stream_without_auds():
    aus = Pics()
    for _ in range(100):
        aus.push(SC + b"\x06\x05")  # SEI after SEI, no picture
    aus.push(P1)  # the first picture of a connection: held until the next begins
    (pic, _), = aus.push(AUD)
    assert pic.count(SC) == AccessUnits.PREFIX_MAX + 1


def test_a_nal_without_end_is_dropped_at_its_bound_and_counted():
    """Equal-size fragments after one start code never end a NAL by size: past MAX_NAL_BYTES
    it is dropped (counted) and followed to the next start code, so a broken encoder or forged
    packets never hold more memory than the bound."""
    a = Nals()
    a.MAX_NAL_BYTES = 10 * FULL
    first, *_ = frag_nal(5, [FULL])
    assert a.push(first) == []
    for _ in range(1000):
        assert a.push(bytes(FULL)) == []
    assert a.oversize == 1 and len(a._nal) == 0
    nxt = SC + b"\x67sps"
    assert a.push(nxt) == [nxt]  # short, so whole at once; nothing of the dropped NAL


def test_a_picture_of_endless_slices_is_dropped_at_its_bound_and_counted():
    aus = Pics()
    aus.push(P1)
    aus.push(P1_LATER)  # several slices a picture: gathered until the next
    aus.push(P1)
    for _ in range(AccessUnits.MAX_SLICES + 5):
        assert aus.push(P1_LATER) == []
    assert aus.oversize == 1
    assert aus.push(P1) == []  # the dropped picture is not handed over
    assert aus.push(P1) == [(P1, False)]


def test_key_frames_only_a_several_slice_key_picture_ends_where_a_dropped_slice_begins():
    """Key frames alone: the P slices are dropped before AccessUnits sees them, so with no
    AUD a several-slice key picture would wait a whole GOP for the next SPS; the assembler's
    count of dropped NALs begun is the boundary that hands it over."""
    a, aus = Nals(), Pics()
    a.drop_types = frozenset({1})
    aus.multi_slice = True  # seen earlier on this stream
    pics = []
    for pkt in (IDR, SC + b"\x65\x40\x04", SC + b"\x41\x9a\x05", SC + b"\x41\x40\x06"):
        begun = a.dropped_begun
        for nal in a.push(pkt):
            pics += aus.push(nal)
        if a.dropped_begun != begun:
            pics += aus.boundary()
    assert pics == [(IDR + SC + b"\x65\x40\x04", True)]


def test_the_pts_of_a_packet_is_carried_to_its_nals_and_picture():
    """A NAL carries the PTS of the packet that began it (FU-A fragments of one picture share
    its RTP timestamp; a NAL ended by the next start code is handed over with the next
    packet, not at its PTS); a picture carries its first slice's; each NAL of an aggregated
    packet, the packet's."""
    a, aus = NalAssembler(), AccessUnits()
    got = [a.push(p, 3600) for p in frag_nal(5, [FULL, FULL])]  # ended only by what follows
    got += [a.push(SC + b"\x09\x10" + SC + b"\x41\x9a\x01", 7200)]  # STAP-A: AUD + P slice
    got += [a.push(p, 10800) for p in frag_nal(1, [FULL, 30])]
    nals = [n for g in got for n in g]
    assert [pts for _, pts in nals] == [3600, 7200, 7200, 10800]
    pics = [p for nal, pts in nals for p in aus.push(nal, pts)]
    pics += aus.push(SC + b"\x09\x10", 14400)
    assert [(key, pts) for _, key, pts in pics] == [(True, 3600), (False, 7200), (False, 10800)]


@pytest.mark.parametrize("keys, hz", [
    # (PTS s or None, arrival s) of each key frame -> key frames a second
    # a connection's backlog: three GOPs of 1 s arrive within 10 ms, then one a second: the
    # stream's clock reads 1.0 from the third (arrival read 2.95, 1.79, 1.49, ...)
    ([(0.0, 5.0), (1.0, 5.0), (2.0, 5.01), (3.0, 5.68)], 1.0),
    ([(0.0, 5.0), (1.0, 5.0), (2.0, 5.68)], 1.0),
    # fewer than three: not known
    ([(0.0, 5.0), (1.0, 5.0)], 0.0),
    # no PTS: by arrival
    ([(None, 0.0), (None, 0.4), (None, 0.8), (None, 1.2)], 2.5),
    # every packet stamped alike: not usable, by arrival (history restarted on that clock)
    ([(7.0, 0.0), (7.0, 0.5), (7.0, 1.0), (7.0, 1.5)], 2.0),
    # a PTS after arrival-timed ones: a clock of its own, counted again from it
    ([(None, 0.0), (None, 0.5), (None, 1.0), (10.0, 1.5), (11.0, 2.5), (12.0, 3.5)], 1.0),
    ([(None, 0.0), (None, 0.5), (None, 1.0), (10.0, 1.5), (11.0, 2.5)], 0.0),
    # the camera's timestamps restarted (stepped back): by arrival once, then from its new PTS
    ([(100.0, 0.0), (101.0, 1.0), (0.0, 2.0), (1.0, 3.0), (2.0, 4.0), (3.0, 5.0)], 1.0),
    # a jump past MAX_GAP_S: the times before it are forgotten (not one slow interval)
    ([(0.0, 0.0), (1.0, 1.0), (2.0, 2.0), (500.0, 3.0), (501.0, 4.0), (502.0, 5.0)], 1.0),
    # at most KEEP kept: a GOP that shortened reads its new rate once the old ones left
    ([(i * 2.0, 0.0) for i in range(8)] + [(14.0 + i, 0.0) for i in range(1, 8)], 1.0),
])
def test_key_frame_rate(keys, hz):
    r = KeyRate()
    for pts, arrival in keys[:-1]:
        r.add(pts, arrival)
    ahead = r.hz_with(*keys[-1])  # the rate a key frame about to be added would make
    r.add(*keys[-1])
    assert r.hz() == pytest.approx(hz) and ahead == pytest.approx(hz)


def test_a_connections_backlog_fed_at_once_reads_the_streams_key_frame_rate():
    """Packets fed as FFmpeg hands over a connection's first seconds from the test camera:
    a backlog of 35 frames (1.4 s at 25 fps, a key frame a second, RTP clock 90 kHz) within
    10 ms, then live. Key pictures out of NalAssembler and AccessUnits, timed by the PTS
    carried through them, read 1 a second from the third; timed by their arrival they read
    3.1, 1.8, 1.5 (as seen on the camera)."""
    a, aus, rate, by_arrival = NalAssembler(), AccessUnits(), KeyRate(), KeyRate()
    rates: list[tuple[float, float]] = []
    for n in range(25 * 5):
        # the backlog, then live (each frame a frame interval after its capture)
        arrival = 10.0 + n * 0.0003 if n < 35 else 10.0 + (n - 35) / 25 + 0.04
        pts = n * 3600
        kind = 5 if n % 25 == 0 else 1
        for pkt in [SC + b"\x09\x10", *frag_nal(kind, [FULL, FULL, 20 + n % 7])]:
            for nal, nal_pts in a.push(pkt, pts):
                for _, key, pic_pts in aus.push(nal, nal_pts):
                    if key:
                        rate.add(pic_pts / 90000, arrival)
                        by_arrival.add(None, arrival)
                        if rate.hz():
                            rates.append((rate.hz(), by_arrival.hz()))
    assert [r for r, _ in rates] == pytest.approx([1.0, 1.0, 1.0])
    assert [round(r, 1) for _, r in rates] == [3.1, 1.8, 1.5]  # what arrival said (the bug)
