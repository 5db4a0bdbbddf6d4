"""PLC edges: each becomes exactly one frame, in order; none is dropped once accepted."""

from __future__ import annotations

import threading

import pytest

from runtime.config.source import SourceConfig
from runtime.frames.edges import EdgeBoard, EdgeBoards, new_count, rising
from runtime.frames.frame import Frame, SourceError
from runtime.frames.sources import open_source
from runtime.frames.trigger_source import EdgeTriggered


def test_edges_come_out_in_order_and_a_full_board_refuses():
    b = EdgeBoard(["a", "b"], max_pending=2)
    assert [b.push("a", "Trigger").ref, b.push("a", "PartPresent").ref] == ["plc-1", "plc-2"]
    assert b.push("a", "Trigger") is None and b.refused["a"] == 1
    assert b.push("b", "Trigger").ref == "plc-1"  # numbered per source
    e = b.take("a", 0)
    b.put_back("a", e)  # a failed capture: first again
    assert [b.take("a", 0).ref, b.take("a", 0).ref, b.take("a", 0)] == ["plc-1", "plc-2", None]
    with pytest.raises(KeyError):
        b.push("nope", "Trigger")


def test_take_waits_for_an_edge_from_another_thread():
    b = EdgeBoard(["a"], 10)
    threading.Timer(0.05, lambda: b.push("a", "Trigger", t=123.0)).start()
    e = b.take("a", 5)
    assert e is not None and e.t == 123.0


def test_a_triggered_synthetic_camera_gives_one_frame_per_edge(tmp_path):
    b = EdgeBoard(["main"], 10)
    src = open_source(SourceConfig(kind="synthetic", trigger="opcua", rate_hz=1.0), tmp_path,
                      edges=b)
    try:
        assert isinstance(src, EdgeTriggered) and not src.live
        assert src.read(0.05) is None  # no edge, no frame (the camera's rate is not used)
        for _ in range(3):
            b.push("main", "Trigger", t=50.0)
        frames = [src.read(1) for _ in range(3)]
        assert [f.ref for f in frames] == ["plc-1", "plc-2", "plc-3"]
        assert all(f.t == 50.0 and f.image.shape == (96, 96, 3) for f in frames)
        assert src.read(0.05) is None
    finally:
        src.close()


class _DeadCamera:
    live = True

    def read(self, timeout_s: float) -> Frame | None:
        raise SourceError("camera unplugged")

    def done(self, frames): ...

    def close(self): ...


def test_an_edge_whose_capture_fails_is_kept_for_the_next_try(tmp_path):
    b = EdgeBoard(["main"], 10)
    b.push("main", "Trigger")
    with pytest.raises(SourceError, match="unplugged"):
        EdgeTriggered(_DeadCamera(), b, "main").read(1)
    assert b.pending("main") == 1 and b.take("main", 0).ref == "plc-1"


@pytest.mark.parametrize("via", ["opcua", "modbus"])
def test_a_plc_trigger_without_the_server_is_a_source_error(tmp_path, via):
    with pytest.raises(SourceError, match=rf"no PLC server.*\[{via}\] enabled"):
        open_source(SourceConfig(kind="synthetic", trigger=via), tmp_path)


@pytest.mark.parametrize(("old", "new", "edge"), [
    (False, True, True), (False, False, False), (True, True, False), (True, False, False)])
def test_part_present_rises_only_from_false_to_true(old, new, edge):
    assert rising(old, new) is edge


@pytest.mark.parametrize(("old", "new", "edge"), [
    (0, 1, True), (7, 8, True), (65535, 0, True),  # counting up, wrapping
    (5, 5, False),  # written again: the same part
    (8, 3, True)])  # any new value (a PLC that restarted its count)
def test_a_part_counter_makes_an_edge_on_every_new_value(old, new, edge):
    assert new_count(old, new) is edge


def test_several_boards_look_like_one_to_the_sources():
    opcua, modbus = EdgeBoard(["a"], 10), EdgeBoard(["b"], 10)
    both = EdgeBoards([opcua, modbus])
    assert both.sources == ["a", "b"]
    modbus.push("b", "PartSeq")
    assert both.pending("b") == 1 and both.pending("a") == 0
    e = both.take("b", 0)
    assert e is not None and e.ref == "plc-1" and both.take("a", 0) is None
    both.put_back("b", e)
    assert modbus.pending("b") == 1
