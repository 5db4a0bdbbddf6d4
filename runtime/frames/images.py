"""Image bytes from outside -> a BGR frame, or `BadImage` saying why; sized before decoding.

Frames come from folders and MQTT payloads anyone may write to, so nothing is handed to a
decoder until its header has been read here: a 1 MB PNG can claim 20000x20000 pixels and cost
1.2 GB to decode. Each supported format is parsed just far enough to know its size and to see
that the file is whole (decoders fill a cut file with grey and report success):

| format | size from | truncation / corruption check |
|---|---|---|
| PNG | IHDR | every chunk's CRC-32; the stream must reach IEND |
| JPEG | the SOFn segment | marker walk through every segment and scan; must reach EOI |
| BMP | BITMAPINFOHEADER/CORE | uncompressed pixel array must fit in the file |
| PNM (P1-P6) | the text header | binary forms (P4-P6) must hold every row |
| WebP | VP8 / VP8L / VP8X header | the RIFF length must fit in the file |
| TIFF | IFD0 ImageWidth/ImageLength | every strip/tile must lie inside the file |

Anything else (including empty payloads, text, random bytes, BigTIFF, PAM) is refused as
`undecodable` without calling a decoder. The decoded size must equal the header's.

Kinds (`BadImage.kind`): `too_large` (past the pixel or byte cap), `truncated` (the file ends
early), `corrupt` (a known format whose structure or checksum is wrong, or that the decoder
refused), `undecodable` (not an image format we accept), `unreadable` (the file could not be
read: vanished, permission, not a regular file).
"""

from __future__ import annotations

import os
import re
import stat
import zlib
from pathlib import Path

import cv2
import numpy as np

from runtime.config.source import DEFAULT_MAX_PIXELS

KINDS = ("too_large", "truncated", "corrupt", "undecodable", "unreadable")


class BadImage(Exception):
    """An image that is refused; `kind` is one of KINDS, the message says why."""

    def __init__(self, kind: str, why: str):
        super().__init__(why)
        self.kind = kind


def max_bytes(max_pixels: int) -> int:
    """Largest file accepted for a pixel cap: 4 bytes a pixel (any uncompressed 8-bit form,
    alpha included) plus 1 MiB of headers and metadata."""
    return max_pixels * 4 + (1 << 20)


def read_file(path: str | Path, max_pixels: int = DEFAULT_MAX_PIXELS) -> bytes:
    """The bytes of a regular file no larger than `max_bytes(max_pixels)`; BadImage otherwise.

    Opened non-blocking so a FIFO dropped into a watched folder cannot hang the reader.
    """
    limit = max_bytes(max_pixels)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise BadImage("unreadable", f"cannot open: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadImage("unreadable", "not a regular file")
        if st.st_size > limit:
            raise BadImage("too_large", f"{st.st_size} bytes, more than the {limit} allowed "
                                        f"for source.max_pixels = {max_pixels}")
        # os.read straight into one bytes object: a file object around the descriptor cost
        # more than the read itself for a small PNG. A short read (a file still growing, a
        # pipe-like file system) goes on until EOF or the limit, in chunks: os.read
        # allocates the size it is asked for, and asking for the limit (~200 MB) to find EOF
        # was a third of the capture thread's time
        data = os.read(fd, min(st.st_size, limit) + 1)
        while len(data) <= limit and (more := os.read(fd, min(limit + 1 - len(data),
                                                               1 << 16))):
            data += more
    except OSError as e:
        raise BadImage("unreadable", f"cannot read: {e.strerror or e}") from e
    finally:
        os.close(fd)
    if len(data) > limit:  # grew while we read it
        raise BadImage("too_large", f"more than {limit} bytes")
    return data


def decode(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Check the header (size cap, wholeness), then decode to HxWx3 uint8 BGR."""
    if not data:
        raise BadImage("undecodable", "empty")
    if len(data) > max_bytes(max_pixels):
        raise BadImage("too_large", f"{len(data)} bytes, more than the "
                                    f"{max_bytes(max_pixels)} allowed")
    w, h = probe(data, max_pixels)
    img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if img is None:
        raise BadImage("corrupt", f"the decoder refused a {w}x{h} {sniff(data)}")
    if img.shape[:2] != (h, w):
        raise BadImage("corrupt", f"decoded {img.shape[1]}x{img.shape[0]}, header says {w}x{h}")
    return img


def probe(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[int, int]:
    """(width, height) from the header, refusing oversized, cut or unknown images."""
    fmt = sniff(data)
    if fmt is None:
        # The bytes themselves are never echoed into logs or events: a trigger's path payload
        # may name any file the daemon can read.
        raise BadImage("undecodable", f"{len(data)} bytes that are not PNG, JPEG, BMP, PNM, "
                                      "WebP or TIFF")
    cap = _Cap(max_pixels, fmt)
    return _PARSERS[fmt](data, cap)


class _Cap:
    """Checks a header's size against the cap as soon as it is known."""

    def __init__(self, max_pixels: int, fmt: str):
        self.max_pixels, self.fmt = max_pixels, fmt

    def __call__(self, w: int, h: int) -> tuple[int, int]:
        if w <= 0 or h <= 0:
            raise BadImage("corrupt", f"{self.fmt} header gives a size of {w}x{h}")
        if w * h > self.max_pixels:
            raise BadImage("too_large", f"{self.fmt} of {w}x{h} = {w * h / 1e6:.1f} MP, more "
                                        f"than source.max_pixels = {self.max_pixels / 1e6:g} MP"
                                        " (refused before decoding)")
        return w, h


_PNG_SIG = b"\x89PNG\r\n\x1a\n"


def sniff(data: bytes) -> str | None:
    """The format name from the magic bytes (PNG, JPEG, BMP, PNM, WebP, TIFF), else None."""
    if data.startswith(_PNG_SIG):
        return "PNG"
    if data.startswith(b"\xff\xd8"):
        return "JPEG"
    if data.startswith(b"BM"):
        return "BMP"
    if len(data) >= 2 and data[0:1] == b"P" and data[1:2] in b"123456":
        return "PNM"
    if data.startswith(b"RIFF") and data[8:12] == b"WEBP":
        return "WebP"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "TIFF"
    return None


def _u32(data: bytes, i: int, order: str = "big") -> int:
    return int.from_bytes(data[i:i + 4], order)


def _png(data: bytes, cap: _Cap) -> tuple[int, int]:
    n = len(data)
    if n < 33 or data[12:16] != b"IHDR" or _u32(data, 8) != 13:
        raise BadImage("truncated" if n < 33 else "corrupt", "PNG without a complete IHDR")
    size = cap(_u32(data, 16), _u32(data, 20))
    view = memoryview(data)
    i = 8
    while True:
        if i + 12 > n:
            raise BadImage("truncated", f"PNG ends at byte {n} before IEND")
        length, ctype = _u32(data, i), bytes(view[i + 4:i + 8])
        end = i + 12 + length
        if length > 0x7FFFFFFF:
            raise BadImage("corrupt", f"PNG chunk at byte {i} claims {length} bytes")
        if end > n:
            raise BadImage("truncated", f"PNG {ctype!r} chunk at byte {i} needs {end} bytes, "
                                        f"the file has {n}")
        if zlib.crc32(view[i + 4:end - 4]) != _u32(data, end - 4):
            raise BadImage("corrupt", f"PNG {ctype!r} chunk at byte {i}: CRC mismatch")
        if ctype == b"IEND":
            return size
        i = end


# SOFn markers that carry the frame size (not DHT C4, JPG C8, DAC CC).
_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE,
                  0xCF})


def _jpeg(data: bytes, cap: _Cap) -> tuple[int, int]:
    n, i = len(data), 2
    size: tuple[int, int] | None = None
    while True:
        if i >= n:
            raise BadImage("truncated", f"JPEG ends at byte {n} before EOI")
        if data[i] != 0xFF:
            raise BadImage("corrupt", f"JPEG: expected a marker at byte {i}")
        while i < n and data[i] == 0xFF:  # fill bytes
            i += 1
        if i >= n:
            raise BadImage("truncated", f"JPEG ends at byte {n} before EOI")
        m = data[i]
        i += 1
        if m == 0xD9:  # EOI
            if size is None:
                raise BadImage("corrupt", "JPEG without a frame header")
            return size
        if m == 0x01 or 0xD0 <= m <= 0xD7:  # standalone markers
            continue
        if i + 2 > n:
            raise BadImage("truncated", f"JPEG ends at byte {n} inside a segment header")
        seg = int.from_bytes(data[i:i + 2], "big")
        if seg < 2:
            raise BadImage("corrupt", f"JPEG segment {m:#04x} at byte {i} of length {seg}")
        if i + seg > n:
            raise BadImage("truncated", f"JPEG segment {m:#04x} at byte {i} needs {i + seg} "
                                        f"bytes, the file has {n}")
        if m in _SOF:
            if seg < 8:
                raise BadImage("corrupt", "JPEG frame header too short")
            h, w = (int.from_bytes(data[i + k:i + k + 2], "big") for k in (3, 5))
            size = cap(w, h)  # before anything else is looked at
        i += seg
        if m == 0xDA:  # SOS: entropy-coded data until the next marker that is not RSTn
            if size is None:
                raise BadImage("corrupt", "JPEG scan before the frame header")
            while True:
                j = data.find(b"\xff", i)
                if j < 0 or j + 1 >= n:
                    raise BadImage("truncated", f"JPEG ends at byte {n} inside a scan "
                                                "(no EOI)")
                nxt = data[j + 1]
                if nxt == 0x00 or 0xD0 <= nxt <= 0xD7:  # stuffed byte or restart marker
                    i = j + 2
                elif nxt == 0xFF:  # fill byte before a marker
                    i = j + 1
                else:
                    i = j
                    break


def _bmp(data: bytes, cap: _Cap) -> tuple[int, int]:
    n = len(data)
    if n < 26:
        raise BadImage("truncated", f"BMP of {n} bytes has no complete header")
    offset, hsize = _u32(data, 10, "little"), _u32(data, 14, "little")
    if hsize == 12:  # BITMAPCOREHEADER
        w, h = (int.from_bytes(data[k:k + 2], "little") for k in (18, 20))
        bpp, comp = int.from_bytes(data[24:26], "little"), 0
    elif hsize >= 40 and n >= 34:
        w = int.from_bytes(data[18:22], "little", signed=True)
        h = abs(int.from_bytes(data[22:26], "little", signed=True))  # < 0: top-down rows
        bpp, comp = int.from_bytes(data[28:30], "little"), _u32(data, 30, "little")
    else:
        raise BadImage("corrupt", f"BMP header of {hsize} bytes")
    w, h = cap(w, h)
    if comp in (0, 3) and bpp in (1, 4, 8, 16, 24, 32):  # uncompressed: rows of fixed size
        need = offset + ((bpp * w + 31) // 32) * 4 * h
        if need > n:
            raise BadImage("truncated", f"BMP needs {need} bytes, the file has {n}")
    return w, h


_PNM_TOKEN = re.compile(rb"(?:\s|#[^\n]*\n)*(\d{1,9})(\s)")


def _pnm(data: bytes, cap: _Cap) -> tuple[int, int]:
    kind = data[1] - ord("0")
    pos, nums = 2, []
    for _ in range(2 if kind in (1, 4) else 3):  # width, height and (not bitmaps) maxval
        m = _PNM_TOKEN.match(data, pos, min(len(data), pos + 1024))
        if m is None:
            raise BadImage("truncated" if len(data) < pos + 16 else "corrupt",
                           "PNM header incomplete")
        nums.append(int(m.group(1)))
        pos = m.end()  # just past the single whitespace that ends the number
    w, h = cap(nums[0], nums[1])
    if kind >= 4:  # binary: the raster is exactly sized
        depth = 2 if kind >= 5 and nums[2] > 255 else 1
        row = (w + 7) // 8 if kind == 4 else w * depth * (1 if kind == 5 else 3)
        if pos + row * h > len(data):
            raise BadImage("truncated", f"PNM raster needs {pos + row * h} bytes, the file "
                                        f"has {len(data)}")
    return w, h


def _webp(data: bytes, cap: _Cap) -> tuple[int, int]:
    n = len(data)
    if n < 30:
        raise BadImage("truncated", f"WebP of {n} bytes has no complete header")
    if _u32(data, 4, "little") + 8 > n:
        raise BadImage("truncated", f"WebP RIFF needs {_u32(data, 4, 'little') + 8} bytes, "
                                    f"the file has {n}")
    chunk = data[12:16]
    if chunk == b"VP8 ":
        if data[23:26] != b"\x9d\x01\x2a":
            raise BadImage("corrupt", "WebP VP8 without its start code")
        w = int.from_bytes(data[26:28], "little") & 0x3FFF
        h = int.from_bytes(data[28:30], "little") & 0x3FFF
    elif chunk == b"VP8L":
        if data[20] != 0x2F:
            raise BadImage("corrupt", "WebP VP8L without its signature")
        bits = _u32(data, 21, "little")
        w, h = (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    elif chunk == b"VP8X":
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
    else:
        raise BadImage("corrupt", f"WebP chunk {chunk!r}")
    return cap(w, h)


_TIFF_SIZES = {1: 1, 3: 2, 4: 4}  # BYTE, SHORT, LONG


def _tiff(data: bytes, cap: _Cap) -> tuple[int, int]:
    n = len(data)
    order = "little" if data[:2] == b"II" else "big"
    if n < 8:
        raise BadImage("truncated", "TIFF without a header")
    ifd = _u32(data, 4, order)
    if ifd + 2 > n:
        raise BadImage("truncated", f"TIFF IFD at byte {ifd}, the file has {n}")
    count = int.from_bytes(data[ifd:ifd + 2], order)
    if ifd + 2 + 12 * count > n:
        raise BadImage("truncated", "TIFF IFD runs past the end of the file")
    tags: dict[int, list[int]] = {}
    for k in range(count):
        e = ifd + 2 + 12 * k
        tag, typ = (int.from_bytes(data[e + o:e + o + 2], order) for o in (0, 2))
        cnt = _u32(data, e + 4, order)
        size = _TIFF_SIZES.get(typ)
        if size is None or tag not in (256, 257, 273, 279, 324, 325):
            continue
        if cnt > 1_000_000:
            raise BadImage("corrupt", f"TIFF tag {tag} with {cnt} values")
        at = e + 8 if size * cnt <= 4 else _u32(data, e + 8, order)
        if at + size * cnt > n:
            raise BadImage("truncated", f"TIFF tag {tag} values lie past the end of the file")
        tags[tag] = [int.from_bytes(data[at + size * v:at + size * (v + 1)], order)
                     for v in range(cnt)]
    if 256 not in tags or 257 not in tags:
        raise BadImage("corrupt", "TIFF without ImageWidth/ImageLength")
    size_wh = cap(tags[256][0], tags[257][0])
    for offs, counts in ((273, 279), (324, 325)):  # strips, tiles
        for off, cnt in zip(tags.get(offs, []), tags.get(counts, []), strict=False):
            if off + cnt > n:
                raise BadImage("truncated", f"TIFF data at bytes {off}..{off + cnt}, the file "
                                            f"has {n}")
    return size_wh


_PARSERS = {"PNG": _png, "JPEG": _jpeg, "BMP": _bmp, "PNM": _pnm, "WebP": _webp, "TIFF": _tiff}
