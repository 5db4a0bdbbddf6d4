"""The Modbus register map: what a PLC may read and write, the edges its writes make, the
verdicts written back with the part's own sequence number, and the exception codes."""

from __future__ import annotations

import math

import pytest

from runtime.frames.edges import EdgeBoard
from runtime.telemetry import modbus_map as mm

CLASSES = ("ok", "scratch", "dent")


def regs(sources=("a", "b"), max_pending=10, coil_base=100, register_base=1000):
    board = EdgeBoard(list(sources), max_pending)
    m = mm.RegisterMap(sources, coil_base, register_base, CLASSES, ("ok", "none"), board.push,
                       max_pending)
    return m, board


@pytest.mark.parametrize(("fc", "address", "count", "want"), [
    (mm.READ_COILS, 100, 2, [False, False]),
    (mm.READ_COILS, 101, 1, [False]),
    (mm.READ_COILS, 99, 1, mm.ILLEGAL_ADDRESS),  # below the coils
    (mm.READ_COILS, 101, 2, mm.ILLEGAL_ADDRESS),  # past the last source's
    (mm.READ_HOLDING, 1000, 32, [0] * 32),  # both blocks, reserved registers too
    (mm.READ_INPUT, 1016, 16, [0] * 16),  # the same, read-only
    (mm.READ_HOLDING, 1031, 2, mm.ILLEGAL_ADDRESS),
    (mm.READ_HOLDING, 999, 1, mm.ILLEGAL_ADDRESS),
    (mm.READ_HOLDING, 1000, 0, mm.ILLEGAL_VALUE),
    (2, 0, 1, mm.ILLEGAL_FUNCTION),  # no discrete inputs
    (23, 1000, 1, mm.ILLEGAL_FUNCTION),
])
def test_reads_inside_the_map_answer_and_outside_are_refused(fc, address, count, want):
    m, _ = regs()
    assert m.read(fc, address, count) == want
    assert m.refused == (0 if isinstance(want, list) else 1)


@pytest.mark.parametrize(("fc", "address", "values", "want"), [
    (mm.WRITE_REGISTER, 1001, [5], mm.ILLEGAL_ADDRESS),  # VerdictSeq is edgerun's
    (mm.WRITE_REGISTER, 1002, [1], mm.ILLEGAL_ADDRESS),  # so is the verdict
    (mm.WRITE_REGISTER, 1032, [1], mm.ILLEGAL_ADDRESS),  # past the map
    (mm.WRITE_REGISTERS, 1000, [1, 2], mm.ILLEGAL_ADDRESS),  # PartSeq and VerdictSeq
    (mm.WRITE_REGISTERS, 1000, [], mm.ILLEGAL_VALUE),
    (mm.WRITE_REGISTER, 1000, [70000], mm.ILLEGAL_VALUE),
    (mm.WRITE_COIL, 102, [True], mm.ILLEGAL_ADDRESS),
    (mm.WRITE_COILS, 101, [True, True], mm.ILLEGAL_ADDRESS),
    (22, 1000, [1], mm.ILLEGAL_FUNCTION),  # mask write
])
def test_writes_outside_partpresent_and_partseq_are_refused_and_change_nothing(
        fc, address, values, want):
    m, board = regs()
    before = (dict(m.coils), {s: list(r) for s, r in m.regs.items()})
    assert m.write(fc, address, values) == want
    assert (dict(m.coils), {s: list(r) for s, r in m.regs.items()}) == before
    assert board.pending("a") == board.pending("b") == 0


@pytest.mark.parametrize(("writes", "edges", "part_seq"), [
    ([True], ["PartPresent"], 1),
    ([True, True], ["PartPresent"], 1),  # held: one part
    ([True, False, True], ["PartPresent", "PartPresent"], 2),
    ([False, False], [], 0),
])
def test_a_rising_partpresent_coil_is_one_part_and_counts_partseq_up(writes, edges, part_seq):
    m, board = regs()
    for v in writes:
        assert m.write(mm.WRITE_COIL, 100, [v]) is None
    got = [board.take("a", 0) for _ in range(board.pending("a"))]
    assert [e.via for e in got] == edges and board.pending("b") == 0
    assert m.read(mm.READ_HOLDING, 1000, 1) == [part_seq]
    assert m.read(mm.READ_COILS, 100, 1) == [writes[-1]]


@pytest.mark.parametrize(("values", "edges"), [
    ([1, 2, 3], 3),
    ([7, 7, 7], 1),  # the same part written again
    ([65535, 0], 2),  # wrapping
    ([0], 0),  # PartSeq starts at 0: no new part
])
def test_every_new_partseq_value_is_one_part(values, edges):
    m, board = regs()
    for v in values:
        assert m.write(mm.WRITE_REGISTER, 1016, [v]) is None  # source b's PartSeq
    assert board.pending("b") == edges and board.pending("a") == 0
    assert m.read(mm.READ_HOLDING, 1016, 1) == [values[-1]]


def test_the_verdict_echoes_the_plcs_part_number_and_is_written_whole():
    m, board = regs()
    m.write(mm.WRITE_REGISTER, 1000, [41])
    m.write(mm.WRITE_REGISTER, 1000, [42])
    e41, e42 = board.take("a", 0), board.take("a", 0)
    assert m.show("a", e41.ref, "dent", 0.87654, 7.31)
    assert m.read(mm.READ_HOLDING, 1000, 10) == [42, 41, mm.VERDICT_NOK, 3, 8765, 73, 0, 0, 1, 1]
    assert m.show("a", e42.ref, "ok", 0.5, math.nan)
    assert m.read(mm.READ_HOLDING, 1001, 9) == [42, mm.VERDICT_OK, 1, 5000, mm.UNKNOWN, 0, 0,
                                                 2, 1]
    assert not m.show("a", e42.ref, "ok", 0.5, 1.0)  # once per edge: never duplicated
    assert not m.show("a", "trigger-3", "ok", 0.5, 1.0)  # not a PLC edge's frame
    assert not m.show("c", "plc-1", "ok", 0.5, 1.0)  # not a Modbus source
    assert m.read(mm.READ_HOLDING, 1008, 1) == [2]


def test_an_unlisted_label_is_class_0_and_a_coil_part_echoes_its_counted_number():
    m, board = regs()
    m.write(mm.WRITE_REGISTER, 1000, [9])
    m.write(mm.WRITE_COIL, 100, [True])  # counts on from the PLC's 9
    board.take("a", 0)
    e = board.take("a", 0)
    assert m.show("a", e.ref, "none", 2.0, 1e9)
    assert m.read(mm.READ_HOLDING, 1001, 5) == [10, mm.VERDICT_OK, 0, 10_000, mm.UNKNOWN]


def test_a_full_queue_refuses_the_edge_with_device_busy_and_keeps_the_old_values():
    m, board = regs(max_pending=1)
    assert m.write(mm.WRITE_REGISTER, 1000, [1]) is None
    assert m.write(mm.WRITE_REGISTER, 1000, [2]) == mm.DEVICE_BUSY
    assert m.write(mm.WRITE_COIL, 100, [True]) == mm.DEVICE_BUSY
    assert m.read(mm.READ_HOLDING, 1000, 1) == [1] and m.coils["a"] is False
    assert m.read(mm.READ_HOLDING, 1007, 1) == [2]  # Refused
    board.take("a", 0)
    assert m.write(mm.WRITE_REGISTER, 1000, [2]) is None  # written again: now accepted
    assert board.take("a", 0).n == 2


def test_edges_that_never_get_a_verdict_are_forgotten_past_a_bound():
    m, board = regs(max_pending=2)
    for v in range(1, 11):
        m.write(mm.WRITE_REGISTER, 1000, [v])
        board.take("a", 0)  # captured, never inferred
    assert len(m._seq_of["a"]) == 4  # 2 x max_pending
    assert m.show("a", "plc-10", "ok", 1.0, 1.0) and not m.show("a", "plc-1", "ok", 1.0, 1.0)


@pytest.mark.parametrize(("x", "per", "top", "want"), [
    (0.5, 10_000, 10_000, 5000), (1.2, 10_000, 10_000, 10_000), (7.34, 10, mm.UNKNOWN, 73),
    (6553.4, 10, mm.UNKNOWN, 65534), (6553.5, 10, mm.UNKNOWN, mm.UNKNOWN),
    (math.nan, 10, mm.UNKNOWN, mm.UNKNOWN), (-1.0, 10, mm.UNKNOWN, mm.UNKNOWN)])
def test_scaled_values_fit_a_register(x, per, top, want):
    assert mm.scaled(x, per, top) == want
