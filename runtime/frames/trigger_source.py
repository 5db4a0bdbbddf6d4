"""Frames on a trigger: an MQTT message carrying the image (or its path), or a PLC's edge
(EdgeTriggered)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path

import numpy as np

from runtime.config.source import SourceConfig
from runtime.frames import images
from runtime.frames.edges import EdgeBoard, EdgeBoards
from runtime.frames.frame import BadFrame, Frame, Source, SourceError
from runtime.frames.images import BadImage

log = logging.getLogger("edgerun.source")


class TriggerSource:
    """Inspect on an MQTT message (e.g. from a PLC bridge). The payload is the image itself
    (PNG/JPEG bytes) or a path to one. The subscription is a persistent QoS 1 session so
    triggers sent while the daemon restarts still arrive. Messages are queued up to
    MAX_QUEUED of them and MAX_QUEUED_BYTES: past either (a publisher faster than the
    device, for longer than the queue covers) a new one is dropped, counted and logged, so
    a flood from the publisher's identity costs its own triggers, not the daemon's memory."""

    live = False
    MAX_QUEUED = 20_000  # a broker's replay of a weekend's triggers (persistent session)
    MAX_QUEUED_BYTES = 256 << 20

    def __init__(self, cfg: SourceConfig, broker, client_id: str):
        from runtime.wire.brokerauth import for_connection
        from runtime.wire.mqtt import Connection
        from runtime.wire.quarantine import RateLimitedLog

        self._q: queue.Queue = queue.Queue()
        self._cfg = cfg
        self._topic = cfg.topic
        self.received = self.dropped = 0  # counts (read by tests and the log)
        self._bytes = 0  # payload bytes queued
        self._bytes_lock = threading.Lock()
        self._said = RateLimitedLog(log)
        # The shared connection thread (backoff, protocol probe, exception containment); a
        # fixed client id with a persistent session, so triggers sent while the daemon
        # restarts are queued by the broker.
        self._conn = Connection(  # its own broker identity (client ids bound to usernames)
            for_connection(broker, "trigger"), client_id, name="trigger-mqtt",
            subscriptions=[(self._topic, 1)],
            on_message=lambda c, m: self._queue(m.payload), clean=False,
            session_expiry_s=7 * 24 * 3600,
            on_takeover=lambda why: log.error("trigger source: %s", why)).start()
        self._n = 0

    def _queue(self, payload: bytes) -> None:
        """On the connection's thread: queue a message, or drop it past the bounds."""
        self.received += 1
        with self._bytes_lock:
            full = self._q.qsize() >= self.MAX_QUEUED or \
                self._bytes + len(payload) > self.MAX_QUEUED_BYTES
            if not full:
                self._bytes += len(payload)
                self._q.put(payload)
                return
        self.dropped += 1
        self._said.log("full", "trigger source: %d messages (%d MB) queued on %s, its bound; "
                       "dropped a trigger (%d dropped so far): they arrive faster than this "
                       "device inspects them", self._q.qsize(), self._bytes >> 20,
                       self._topic, self.dropped)

    def read(self, timeout_s: float) -> Frame | None:
        """The next triggered image; a refused payload raises BadFrame (counted, skipped)."""
        try:
            payload = self._q.get(timeout=timeout_s)
        except queue.Empty:
            return None
        with self._bytes_lock:
            self._bytes -= len(payload)
        self._n += 1
        ref = f"trigger-{self._n}"
        c0 = time.thread_time()
        try:
            img = decode_payload(bytes(payload), self._cfg.max_pixels)
        except BadImage as e:
            raise BadFrame(ref, e.kind, f"on {self._topic}: {e}") from e
        return Frame(img, ref, decode_cpu_s=time.thread_time() - c0)

    def done(self, frames: list[Frame]) -> None:
        """Nothing to remember."""

    def close(self) -> None:
        """Stop the trigger's MQTT connection."""
        self._conn.stop()


class EdgeTriggered:
    """One frame of a camera (or the synthetic conveyor) per PLC edge (runtime/frames/edges.py):
    the capture thread waits for the next edge of this source, reads one frame and hands it
    over as `plc-<n>`, stamped with the edge's time (so its e2e is trigger to verdict).
    Never dropped (not live); an edge whose capture failed is put back first and the failure
    raised as a SourceError (the pipeline reopens the camera and the edge is captured then)."""

    live = False
    CAPTURE_TIMEOUT_S = 5.0  # a camera that gives no frame this long after an edge failed

    def __init__(self, camera: Source, edges: EdgeBoard | EdgeBoards, name: str):
        self._camera, self._edges, self._name = camera, edges, name

    def read(self, timeout_s: float) -> Frame | None:
        """The frame of the next edge, or None when no edge came within the timeout."""
        edge = self._edges.take(self._name, timeout_s)
        if edge is None:
            return None
        try:
            frame = self._camera.read(self.CAPTURE_TIMEOUT_S)
        except BaseException:
            self._edges.put_back(self._name, edge)
            raise
        if frame is None:
            self._edges.put_back(self._name, edge)
            raise SourceError(f"no frame from the camera within {self.CAPTURE_TIMEOUT_S:g} s "
                              f"of PLC edge {edge.n} (kept; captured once the camera is back)")
        frame.ref, frame.t = edge.ref, edge.t
        return frame

    def done(self, frames: list[Frame]) -> None:
        """The camera's own bookkeeping."""
        self._camera.done(frames)

    def close(self) -> None:
        """Close the camera (the pending edges stay on the board)."""
        self._camera.close()


def decode_payload(payload: bytes, max_pixels: int) -> np.ndarray:
    """A trigger payload: image bytes (any format frames/images.py checks) or, when it is not
    one, a short UTF-8 path to an image file. BadImage when it is neither."""
    if images.sniff(payload) is None and 0 < len(payload) < 4096:
        try:
            path = Path(payload.decode("utf-8").strip())
        except UnicodeDecodeError:
            path = None
        try:  # a name the filesystem refuses (ENAMETOOLONG: any 256 bytes of text) raised
            # OSError out of the trigger source, which ended its capture thread
            is_file = path is not None and str(path) not in ("", ".") and path.is_file()
        except (OSError, ValueError):
            is_file = False
        if is_file:
            return images.decode(images.read_file(path, max_pixels), max_pixels)
    return images.decode(payload, max_pixels)
