"""The frame number as the test camera draws it (stdlib only: imported by the camera's server
under the system Python and by the tests' reader, tests/support/rtsp_camera.py).

Across the top of the picture, two bands each `band_h(h)` rows tall of `BITS` blocks
`w // BITS` wide: the number in binary, most significant bit first (white = 1), and below it
the same bits inverted; what is left of a row on the right is mid-grey. Big blocks, full
black against full white: they survive H.264 at any bit rate and scaling to a model's size.
"""

from __future__ import annotations

import math

BITS = 20  # 25 fps for 11.6 hours before it wraps; 320, 640, 1280, 1920 px divide by it
WHITE, BLACK, GREY = 235, 16, 128  # video-range luma
PERIOD = 256  # rows the texture scrolls through, 3 a frame, before it repeats


def band_h(h: int) -> int:
    """Rows in each of the two bands of an `h`-row picture."""
    return max(2, h // 16)


def code_rows(n: int, w: int, h: int) -> bytes:
    """The luma of the two bands (2 * band_h(h) rows of `w` bytes) for frame `n`."""
    bw = w // BITS
    bits = [(n >> (BITS - 1 - i)) & 1 for i in range(BITS)]
    pad = bytes([GREY]) * (w - bw * BITS)
    row = b"".join(bytes([WHITE if b else BLACK]) * bw for b in bits) + pad
    inv = b"".join(bytes([BLACK if b else WHITE]) * bw for b in bits) + pad
    return row * band_h(h) + inv * band_h(h)


def texture(width: int, height: int, period: int = PERIOD) -> bytes:
    """A smooth luma texture `height + period` rows tall (pure Python: no numpy in the
    camera's process)."""
    bank = []
    for k in range(64):
        f, ph = 2 * math.pi / (24 + 3 * k), k * 0.7
        bank.append(bytes(int(128 + 70 * math.sin(x * f + ph) + 30 * math.sin(x * 0.013 * (k + 1)))
                          for x in range(width)))
    rows = [bank[int(31.5 + 31.5 * math.sin(y / 40.0) * math.cos(y / 97.0))]
            for y in range(height + period)]
    return b"".join(rows)


def luma(n: int, w: int, h: int, tex: bytes) -> bytes:
    """Frame `n`'s whole luma plane as the camera encodes it (`tex`: texture(w, h)): the code
    bands over the texture scrolled 3 rows a frame."""
    off = (n * 3) % PERIOD
    return code_rows(n, w, h) + tex[(off + 2 * band_h(h)) * w:(off + h) * w]
