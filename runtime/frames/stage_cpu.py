"""CPU seconds per stage of the frame path, counted on whichever thread ran the stage; taken
by the box's energy per frame (power/box_energy.py). The stages: capture (the source's read,
its polling included), decode (None: no source could time it apart from the read), crop,
preprocess, infer (added with its frame's store, so it is these frames' own), postprocess
(results built), persist (outbox commit, the source's done, local results)."""

from __future__ import annotations

import threading

from runtime.frames.frame import Frame

# the stages the pipeline's own threads run (publish runs on the MQTT thread: power.cputime)
STAGE_CPU_ZERO: dict[str, float | None] = {
    "capture": 0.0, "decode": None, "crop": 0.0, "preprocess": 0.0, "infer": 0.0,
    "postprocess": 0.0, "persist": 0.0}


class StageCpu:
    """CPU seconds per stage and the results stored, since the last `take` (any thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cpu: dict[str, float | None] = dict(STAGE_CPU_ZERO)
        self._frames = 0

    def add(self, stage: str, seconds: float) -> None:
        """Add CPU seconds to a stage."""
        with self._lock:
            self._cpu[stage] = (self._cpu[stage] or 0.0) + seconds

    def read(self, spent: float, frame: Frame) -> None:
        """A frame read in `spent` CPU seconds of the capture thread: its decode (where the
        source timed it) is billed to decode, the rest to capture. A live stream decodes on
        its own reader thread (`decoded_apart`): that is not in `spent`."""
        dec = frame.decode_cpu_s
        with self._lock:
            st = self._cpu
            st["capture"] = (st["capture"] or 0.0) + spent - (
                0.0 if frame.decoded_apart else dec or 0.0)
            if dec is not None:
                st["decode"] = (st["decode"] or 0.0) + dec

    def stored(self, results: int, persist_s: float, infer_s: float,
               postprocess_s: float = 0.0) -> None:
        """A group stored: its persist and postprocess CPU, and its frames' inference CPU
        counted with it (so a window's inference CPU is its own frames'); one lock taken
        for the three (once a frame on an idle pipeline)."""
        with self._lock:
            st = self._cpu
            st["persist"] = (st["persist"] or 0.0) + persist_s
            st["infer"] = (st["infer"] or 0.0) + infer_s
            st["postprocess"] = (st["postprocess"] or 0.0) + postprocess_s
            self._frames += results

    def take(self) -> tuple[int, dict[str, float | None]]:
        """(results stored, CPU seconds per stage) since the last call; decode None while no
        source could time it apart from the read."""
        with self._lock:
            out, self._cpu = self._cpu, dict(STAGE_CPU_ZERO)
            n, self._frames = self._frames, 0
        return n, out
