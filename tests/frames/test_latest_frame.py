"""The newest-frame reader of live streams (LatestFrame): under a rate cap a take waits for
the first frame decoded at or after its due time (served as it is decoded, not up to one
frame interval old), counting the frames passed over; without one it hands the newest over."""

from __future__ import annotations

import queue
import time

import numpy as np

from runtime.frames.latest_frame import LatestFrame


def _reader() -> tuple[LatestFrame, queue.Queue]:
    feed: queue.Queue = queue.Queue()

    def read_one() -> np.ndarray:
        return np.full((2, 2, 3), feed.get(timeout=10), np.uint8)

    return LatestFrame(read_one, "test"), feed


def _until(cond, what: str) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < 10, what
        time.sleep(0.001)


def test_without_a_due_time_the_newest_is_taken_at_once():
    r, feed = _reader()
    try:
        feed.put(1)
        feed.put(2)
        _until(lambda: r._n == 2, "two frames decoded")
        img, _, n, _, skipped = r.take(1.0)
        assert img[0, 0, 0] == 2 and n == 2 and skipped == 1
        assert r.take(0.01) is None  # taken once
    finally:
        r.stopping.set()  # then unblock its read: it leaves after this one
        feed.put(0)
        assert r.stop()


def test_a_frame_decoded_before_the_due_time_waits_for_the_next():
    r, feed = _reader()
    try:
        feed.put(1)
        _until(lambda: r._n == 1, "a frame decoded")
        due = time.monotonic() + 1e-3
        time.sleep(2e-3)
        assert r.take(0.05, not_before=due) is None  # held, decoded before it was due
        feed.put(2)
        img, _, n, _, skipped = r.take(5.0, not_before=due)
        assert img[0, 0, 0] == 2 and n == 2 and skipped == 1  # the one before, passed over
    finally:
        r.stopping.set()  # then unblock its read: it leaves after this one
        feed.put(0)
        assert r.stop()


def test_the_frame_interval_is_measured():
    r, feed = _reader()
    try:
        for i in range(6):
            feed.put(i)
            _until(lambda i=i: r._n == i + 1, "decoded")
            time.sleep(0.02)
        assert 0.015 <= r.interval <= 0.5
    finally:
        r.stopping.set()  # then unblock its read: it leaves after this one
        feed.put(0)
        assert r.stop()
