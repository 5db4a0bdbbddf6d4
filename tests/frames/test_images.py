"""Frames from outside: sized from the header before decoding, cut files refused, every bad
frame counted by kind and reported at most once per kind per minute (issue 12, findings
13 and 14)."""

from __future__ import annotations

import functools
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.under_test import child_env

from models.synthetic import samples
from runtime.config.source import SourceConfig
from runtime.frames import images
from runtime.frames.badframes import FRAME_KINDS, BadFrames
from runtime.frames.folder_source import FolderSource
from runtime.frames.frame import BadFrame
from runtime.frames.images import BadImage
from runtime.frames.trigger_source import decode_payload

FORMATS = (".png", ".jpg", ".bmp", ".ppm", ".pgm", ".pbm", ".tiff", ".webp")


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


@functools.lru_cache(maxsize=4)
def huge_png(w: int = 20000, h: int = 20000) -> bytes:
    """A valid greyscale PNG of w x h black pixels: ~0.4 MB on disk, w*h*3 bytes decoded."""
    z = zlib.compressobj(1)
    row = bytes(w + 1)  # filter byte + w zero pixels
    body = b"".join(z.compress(row) for _ in range(h)) + z.flush()
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
            + _chunk(b"IDAT", body) + _chunk(b"IEND", b""))


def encoded(ext: str, shape=(40, 50)) -> tuple[bytes, np.ndarray]:
    img = cv2.resize(next(samples(seed=3, count=1)).image, shape[::-1])
    src = img[:, :, 0] if ext in (".pgm", ".pbm") else img
    ok, buf = cv2.imencode(ext, src)
    assert ok
    return buf.tobytes(), img


@pytest.mark.parametrize("ext", FORMATS)
def test_every_accepted_format_is_sized_decoded_and_refused_when_cut(ext):
    data, _ = encoded(ext)
    assert images.probe(data) == (50, 40)
    assert images.decode(data).shape == (40, 50, 3)
    for cut in (len(data) // 3, len(data) * 2 // 3, len(data) - 1):
        with pytest.raises(BadImage) as e:
            images.decode(data[:cut])
        assert e.value.kind in ("truncated", "corrupt"), (cut, e.value)
    with pytest.raises(BadImage, match="max_pixels") as e:  # 2000 px > cap of 1999
        images.decode(data, max_pixels=1999)
    assert e.value.kind == "too_large"


@pytest.mark.parametrize("params", [[], [cv2.IMWRITE_JPEG_PROGRESSIVE, 1],
                                    [cv2.IMWRITE_JPEG_RST_INTERVAL, 2]])
def test_a_jpeg_cut_to_a_third_is_refused_not_scored(params, tmp_path):
    img = cv2.resize(next(samples(seed=4, count=1)).image, (640, 480))
    data = cv2.imencode(".jpg", img, params)[1].tobytes()
    assert images.decode(data).shape == (480, 640, 3)
    cut = data[:len(data) // 3]
    # what the old folder source did: cv2.imread decodes the cut file "successfully" (a grey
    # bottom, one libjpeg warning on stderr) and the frame was scored
    (tmp_path / "cut.jpg").write_bytes(cut)
    assert cv2.imread(str(tmp_path / "cut.jpg"), cv2.IMREAD_COLOR).shape == (480, 640, 3)
    with pytest.raises(BadImage, match="no EOI") as e:
        images.decode(cut)
    assert e.value.kind == "truncated"


def test_png_with_a_flipped_bit_is_corrupt():
    data = bytearray(encoded(".png")[0])
    data[len(data) // 2] ^= 0x01
    with pytest.raises(BadImage, match="CRC") as e:
        images.decode(bytes(data))
    assert e.value.kind == "corrupt"


@pytest.mark.parametrize(("payload", "kind"), [
    (b"", "undecodable"), (b"hello, this is text\n", "undecodable"),
    (np.random.default_rng(1).bytes(5000), "undecodable"), (b"\x89PNG\r\n\x1a\n", "truncated"),
    (b"\xff\xd8\xff", "truncated"), (b"RIFF\x00\x00\x00\x00WEBPVP8X", "truncated"),
    (b"P6\n20000 20000\n255\n", "too_large"), (b"P5 1 1 255 ", "truncated"),
])
def test_garbage_is_refused_with_its_kind(payload, kind):
    with pytest.raises(BadImage) as e:
        images.decode(payload)
    assert e.value.kind == kind


@functools.lru_cache(maxsize=1)
def _oversized_headers() -> dict[str, bytes]:
    """Small valid files whose headers are patched to claim 20000 x 20000 (WebP: 16384^2)."""
    out = {}
    bmp = bytearray(encoded(".bmp")[0])
    bmp[18:26] = struct.pack("<ii", 20000, 20000)
    out["bmp"] = bytes(bmp)
    jpg = bytearray(encoded(".jpg")[0])
    sof = jpg.find(b"\xff\xc0")
    jpg[sof + 5:sof + 9] = struct.pack(">HH", 20000, 20000)
    out["jpeg"] = bytes(jpg)
    tif = encoded(".tiff")[0]
    out["tiff"] = tif.replace(struct.pack("<HHII", 256, 3, 1, 50),
                              struct.pack("<HHII", 256, 4, 1, 20000 * 20000), 1)
    webp = bytearray(encoded(".webp")[0])
    # VP8L holds 14-bit sizes: 16384 x 16384 is its largest (268 MP)
    bits = 0x3FFF | (0x3FFF << 14) | (int.from_bytes(webp[21:25], "little") & ~0xFFFFFFF)
    webp[21:25] = bits.to_bytes(4, "little")
    out["webp"] = bytes(webp)
    out["png"] = huge_png(20000, 20000)
    return out


@pytest.mark.parametrize("fmt", ["bmp", "jpeg", "tiff", "webp", "png"])
def test_oversized_headers_are_refused_before_decoding(fmt):
    data = _oversized_headers()[fmt]
    with pytest.raises(BadImage, match="before decoding") as e:
        images.decode(data)
    assert e.value.kind == "too_large"


_RSS_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
from runtime.config.source import SourceConfig
from runtime.frames.folder_source import FolderSource
from runtime.frames.frame import BadFrame
src = FolderSource(SourceConfig(kind="folder", path=sys.argv[1], watch=False), Path(sys.argv[2]))
FolderSource.SETTLE_S = 0
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
try:
    frame = src.read(1.0)
    out = {"decoded": None if frame is None else list(frame.image.shape)}
except BadFrame as e:
    out = {"refused": e.kind, "why": e.why}
out["ms"] = (time.perf_counter() - t0) * 1e3
out["rss_growth_mb"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps(out))
"""


def test_a_20000_by_20000_png_costs_no_memory(tmp_path):
    """Finding 13: the daemon's own folder path, in a child process, peak RSS measured. Decoding
    would need 20000*20000*3 = 1.2 GB; refusing from the header must cost next to nothing."""
    import json

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "huge.png").write_bytes(huge_png())
    os.utime(inbox / "huge.png", (0, 0))  # settled
    r = subprocess.run([sys.executable, "-c", _RSS_CHILD, str(inbox), str(tmp_path / "st")],
                       capture_output=True, text=True, timeout=120,
                       env=child_env())
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out.get("refused") == "too_large", out
    assert out["rss_growth_mb"] < 50, out  # the file is 0.4 MB; decoding needs 1200 MB
    assert out["ms"] < 500, out


def test_trigger_payloads_bytes_or_path(tmp_path):
    data, img = encoded(".png")
    assert np.array_equal(decode_payload(data, 10**6), img)
    p = tmp_path / "part.png"
    p.write_bytes(data)
    assert np.array_equal(decode_payload(str(p).encode(), 10**6), img)
    with pytest.raises(BadImage) as e:
        decode_payload(str(tmp_path / "missing.png").encode(), 10**6)
    assert e.value.kind == "undecodable"
    (tmp_path / "secret.txt").write_text("root:x:0:0:hunter2\n")
    with pytest.raises(BadImage) as e:  # a path to a non-image: refused, content not echoed
        decode_payload(str(tmp_path / "secret.txt").encode(), 10**6)
    assert "root" not in str(e.value) and "hunter2" not in str(e.value)
    os.mkfifo(tmp_path / "fifo.png")  # must not block
    with pytest.raises(BadImage) as e:
        images.read_file(tmp_path / "fifo.png")
    assert e.value.kind == "unreadable"


def _fill_inbox(inbox: Path) -> tuple[list[str], dict[str, str]]:
    """Good files and one of each kind of bad file; all settled."""
    good = []
    for i, s in enumerate(samples(seed=5, count=3)):
        cv2.imwrite(str(inbox / f"good{i}.png"), s.image)
        good.append(f"good{i}.png")
    jpg = cv2.imencode(".jpg", cv2.resize(next(samples(seed=6, count=1)).image, (320, 240)))[1]
    bad = {"cut.jpg": "truncated", "empty.png": "undecodable", "notes.jpg": "undecodable",
           "huge.png": "too_large", "flipped.png": "corrupt"}
    (inbox / "cut.jpg").write_bytes(jpg.tobytes()[:len(jpg) // 3])
    (inbox / "empty.png").write_bytes(b"")
    (inbox / "notes.jpg").write_text("this is not an image\n")
    (inbox / "huge.png").write_bytes(huge_png(8000, 8000))
    flipped = bytearray(encoded(".png")[0])
    flipped[60] ^= 0x10
    (inbox / "flipped.png").write_bytes(bytes(flipped))
    for f in inbox.iterdir():
        os.utime(f, (0, 0))
    return good, bad


def _drain(src: FolderSource) -> tuple[list[str], dict[str, str]]:
    frames, refused = [], {}
    for _ in range(50):
        try:
            f = src.read(0.05)
        except BadFrame as e:
            assert e.ref not in refused, f"{e.ref} refused twice"
            refused[e.ref] = e.kind
            continue
        if f is None:
            break
        frames.append(f)
    src.done(frames)
    return [f.ref for f in frames], refused


@pytest.mark.parametrize("done_dir", [False, True])
def test_folder_source_refuses_each_bad_file_once_even_across_restarts(tmp_path, done_dir):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    good, bad = _fill_inbox(inbox)
    cfg = SourceConfig(kind="folder", path=str(inbox), watch=False, max_pixels=100_000,
                       done_dir=str(tmp_path / "done") if done_dir else "")
    src = FolderSource(cfg, tmp_path / "state")
    refs, refused = _drain(src)
    assert sorted(refs) == good
    assert refused == bad
    assert _drain(src) == ([], {})  # never looped on
    src.close()
    if done_dir:
        assert sorted(p.name for p in (tmp_path / "done" / "rejected").iterdir()) == sorted(bad)
        assert sorted(p.name for p in inbox.iterdir()) == []
    else:
        assert sorted(p.name for p in inbox.iterdir()) == sorted([*good, *bad])
    src = FolderSource(cfg, tmp_path / "state")  # a restart: nothing again
    assert _drain(src) == ([], {})
    src.close()


def test_bad_frames_counted_by_kind_and_reported_once_a_minute():
    now = [1000.0]
    got: list[dict] = []
    bad = BadFrames(got.append, window_s=60, clock=lambda: now[0])
    assert bad.counts() == {**dict.fromkeys(FRAME_KINDS, 0), "total": 0}  # always present
    for i in range(100):
        bad.record("truncated", f"f{i}", "cut")
        now[0] += 0.1
    bad.record("too_large", "big", "huge")
    assert [(e["kind"], e["ref"], e["suppressed"], e["total"]) for e in got] == [
        ("truncated", "f0", 0, 1), ("too_large", "big", 0, 1)]
    bad.flush()  # window not over: nothing yet
    assert len(got) == 2
    now[0] += 60
    bad.flush()  # the tail of the burst is reported, once
    bad.flush()
    assert [(e["kind"], e["ref"], e["suppressed"], e["total"]) for e in got[2:]] == [
        ("truncated", "f99", 98, 100)]
    now[0] += 61
    bad.record("truncated", "late", "cut")
    assert got[-1]["ref"] == "late" and got[-1]["suppressed"] == 0
    assert bad.counts()["truncated"] == 101 and bad.counts()["total"] == 102
    assert all(e["type"] == "frame_bad" and e["severity"] == "warning" for e in got)


def test_with_done_dir_a_new_file_of_a_moved_files_name_is_inspected(tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    cfg = SourceConfig(kind="folder", path=str(inbox), watch=False, done_dir=str(tmp_path / "d"))
    src = FolderSource(cfg, tmp_path / "state")
    first, second = (s.image for s in samples(seed=7, count=2))
    for i, img in enumerate((first, second)):  # a camera that always writes "part.png"
        cv2.imwrite(str(inbox / "part.png"), img)
        (inbox / "bad.png").write_bytes(b"garbage")
        os.utime(inbox / "part.png", (i, i))  # settled; a new mtime as a new file would have
        os.utime(inbox / "bad.png", (i, i))
        refs, refused = _drain(src)
        assert refs == ["part.png"] and refused == {"bad.png": "undecodable"}
        assert np.array_equal(cv2.imread(str(tmp_path / "d" / "part.png")), img)
    src.close()
