"""When a file source's frames are done: only once their results are on disk.

A folder source marks a file done (moves it to `done_dir`, or records it) when its result is
stored. On a full disk the outbox holds results in memory (runtime/telemetry/held.py) and a
kill -9 loses them: a file moved to done_dir then was never inspected again. So a stored
batch's frames wait here until the outbox's highest seq on disk (`durable`) covers their
results; left not done at a crash, a restart inspects them again (a duplicate, never a loss).
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.frames.frame import Frame
from runtime.frames.multisource import Lane


class DoneMarks:
    """Stored batches' frames waiting for their results to reach the disk, oldest first.
    Called with the pipeline's work lock held."""

    def __init__(self, durable: Callable[[], int] | None):
        # None: every stored result is durable (no outbox, or tests without one)
        self._durable = durable
        self._undone: list[tuple[int, list[tuple[Lane, list[Frame]]]]] = []

    def waiting(self) -> bool:
        """Some batch's frames are not done yet (safe to read without the lock: at worst
        one call late)."""
        return bool(self._undone)

    def stored(self, top: int, lanes: list[Lane], frames: list[Frame]) -> None:
        """A batch of `frames` was stored, its results' highest seq `top` (no frames: only
        release what reached the disk since): mark done, on each of `lanes`, the frames a
        source marks done (a folder's files) whose results are durable."""
        if not self._undone and all(f.done is None for f in frames):
            return  # nothing to mark (a stream's frames), nothing waiting: no disk asked
        marks = [(lane, mine) for lane in lanes if lane.source is not None and (mine := [
            f for f in frames if f.done is not None and f.source == lane.name])]
        upto = self._durable() if self._durable is not None else None
        if marks:
            self._undone.append((top, marks))
        while self._undone and (upto is None or self._undone[0][0] <= upto):
            for lane, frames in self._undone.pop(0)[1]:
                if lane.source is not None:  # (a source closed meanwhile: a restart sees)
                    lane.source.done(frames)
