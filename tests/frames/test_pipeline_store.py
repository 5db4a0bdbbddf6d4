"""The pipeline's store step when the outbox fails (a full disk): said once an outage."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from support.tiny_ort import tiny_variant

from runtime.config.source import SourceConfig
from runtime.frames.pipeline import Active, Pipeline
from runtime.frames.sources import open_source


def test_a_failing_store_is_one_event_and_one_line_an_outage(tmp_path, caplog):
    """A sink failing every batch (disk full) raised a critical store_failed event and an
    error line per batch, each into the outbox that was failing; now one event and one line
    a minute while it lasts, and a line when results are stored again."""
    src = Path(tmp_path)
    m, backend, v = tiny_variant(src)
    full = [True]
    stored: list[dict] = []
    events: list[dict] = []

    def sink(rs: list[dict]) -> list[int]:
        if full[0]:
            raise OSError(28, "No space left on device")
        stored.extend(rs)
        return list(range(len(rs)))

    p = Pipeline(lambda: open_source(SourceConfig(rate_hz=200, size=32), src / "state"), m,
                 sink, events.append)

    def until(what, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not what():
            assert time.monotonic() < deadline
            time.sleep(0.01)

    with caplog.at_level(logging.WARNING, logger="edgerun.pipeline"):
        p.start(Active(0, v.id, backend.load(v), v.model.input_shape))
        try:
            until(lambda: p.counters["store_errors"] >= 20)
            full[0] = False
            until(lambda: len(stored) >= 5)
        finally:
            p.stop()
    failed = [e for e in events if e["type"] == "store_failed"]
    assert len(failed) == 1 and "No space left" in failed[0]["error"]
    lines = [r.getMessage() for r in caplog.records]
    assert sum("could not store" in x for x in lines) == 1, lines
    assert any("stored again" in x for x in lines), lines


class _Slow:
    """A session whose inference takes `ms` longer (a 10 ms-class model)."""

    def __init__(self, inner, ms: float):
        self._inner, self._s = inner, ms / 1e3

    def infer(self, x):
        time.sleep(self._s)
        return self._inner.infer(x)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_a_backlog_on_a_slow_model_shares_commits(tmp_path):
    """Frames queued behind a model slower than GROUP_WAIT_S are stored in groups: the group
    wait bounds how long the next frame is waited for, not how old the group may be (that
    made every frame of a 10 ms model its own transaction)."""
    import cv2

    from models.synthetic import samples

    src = Path(tmp_path)
    folder = src / "inbox"
    folder.mkdir()
    img = next(iter(samples(seed=2, count=1))).image
    old = time.time() - 3600
    for i in range(40):
        cv2.imwrite(str(folder / f"f{i:02d}.png"), img)
        os.utime(folder / f"f{i:02d}.png", (old, old))
    m, backend, v = tiny_variant(src)
    batches: list[int] = []

    def sink(rs: list[dict]) -> list[int]:
        batches.append(len(rs))
        return list(range(len(rs)))

    p = Pipeline(lambda: open_source(SourceConfig(kind="folder", path=str(folder)),
                                     src / "state"), m, sink, lambda e: None)
    p.start(Active(0, v.id, _Slow(backend.load(v), 8.0), v.model.input_shape))
    try:
        deadline = time.monotonic() + 30
        while sum(batches) < 40:
            assert time.monotonic() < deadline, batches
            time.sleep(0.02)
    finally:
        p.stop()
    assert len(batches) <= 20, batches  # was 40: one transaction per frame
