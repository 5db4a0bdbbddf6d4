"""The Modbus register map of PLC-triggered sources (`[modbus]`, docs/plc.md): what a PLC may
read and write, the edges its writes make, and the verdicts written back. Pure: no sockets,
no threads (runtime/telemetry/modbus_server.py serves it on one event loop, so every read,
write and verdict is one step).

Per Modbus-triggered source k (in config order), 0-based protocol addresses:

- coil `coil_base + k`: PartPresent (read/write). false -> true is one part.
- holding registers `register_base + 16 k + i` (input registers: the same, read-only):
  0 PartSeq (read/write) the PLC's part counter: writing a new value is one part, whose
    verdict echoes that value; a PartPresent edge adds one to it (wrapping at 65536)
  1 VerdictSeq  the PartSeq of the part whose verdict registers 2..5 hold (read 0..5 in one
    request: a request is answered whole, between two verdicts)
  2 Verdict     0 none yet, 1 OK, 2 NOK
  3 Class       the label's index in `[modbus] classes`, from 1; 0: not listed
  4 Score       the score x 10000 (0..10000)
  5 E2eMs       trigger to verdict in 0.1 ms (65535: unknown or longer)
  6 Pending     edges waiting for their capture
  7 Refused     edges refused on a full queue (mod 65536)
  8 Results     verdicts written (mod 65536)
  9 Nok         NOK verdicts written (mod 65536)
  10..15        reserved (read as 0)

Refusals (the Modbus exception codes): an address outside the map, or a write to any address
but PartPresent and PartSeq, ILLEGAL_ADDRESS (2); a coil value other than 0xFF00/0x0000 or a
count of 0, ILLEGAL_VALUE (3); a function other than 1, 3, 4, 5, 6, 15, 16 ILLEGAL_FUNCTION
(1); an edge while `max_pending` wait, DEVICE_BUSY (6) with the coil and PartSeq unchanged
(the PLC writes again: the edge is refused, not lost).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from runtime.config.modbus import BLOCK
from runtime.frames.edges import Edge, new_count, rising

ILLEGAL_FUNCTION, ILLEGAL_ADDRESS, ILLEGAL_VALUE, DEVICE_BUSY = 1, 2, 3, 6
READ_COILS, READ_HOLDING, READ_INPUT = 1, 3, 4
WRITE_COIL, WRITE_REGISTER, WRITE_COILS, WRITE_REGISTERS = 5, 6, 15, 16
(PART_SEQ, VERDICT_SEQ, VERDICT, CLASS, SCORE, E2E_MS, PENDING, REFUSED, RESULTS,
 NOK) = range(10)
UNKNOWN = 0xFFFF
VERDICT_OK, VERDICT_NOK = 1, 2


def u16(x: int) -> int:
    """`x` as a register holds it (mod 65536)."""
    return x & 0xFFFF


def scaled(x: float, per_unit: float, top: int) -> int:
    """`x * per_unit` rounded into 0..top; UNKNOWN for NaN or past `top`."""
    if not math.isfinite(x) or x < 0:
        return UNKNOWN
    v = round(x * per_unit)
    return min(v, top) if top < UNKNOWN else (v if v < UNKNOWN else UNKNOWN)


class RegisterMap:
    """The coils and registers of the Modbus-triggered sources (see module doc). `push(source,
    via)` queues an edge (runtime/frames/edges.py's EdgeBoard.push): None when refused."""

    def __init__(self, sources: Sequence[str], coil_base: int, register_base: int,
                 classes: Sequence[str], ok_labels: Sequence[str],
                 push: Callable[[str, str], Edge | None], max_pending: int):
        self.sources = list(sources)
        self._coil0, self._reg0 = coil_base, register_base
        self._classes = {c: i + 1 for i, c in enumerate(classes)}
        self._ok = frozenset(ok_labels)
        self._push = push
        self.coils = dict.fromkeys(self.sources, False)
        self.regs = {s: [0] * BLOCK for s in self.sources}
        # edge number -> the PartSeq it answers; bounded (an edge never inferred would stay)
        self._seq_of: dict[str, dict[int, int]] = {s: {} for s in self.sources}
        self._keep = 2 * max_pending
        self.refused = 0

    # -- the PLC's requests ---------------------------------------------------------------------

    def read(self, fc: int, address: int, count: int) -> list[int] | list[bool] | int:
        """The values of a read request (or a write's read-back: pymodbus answers a write
        with the values it left), or its exception code."""
        if fc not in (READ_COILS, READ_HOLDING, READ_INPUT, WRITE_COIL, WRITE_REGISTER,
                      WRITE_COILS, WRITE_REGISTERS):
            return self._refuse(ILLEGAL_FUNCTION)
        if count < 1:
            return self._refuse(ILLEGAL_VALUE)
        if fc in (READ_COILS, WRITE_COIL, WRITE_COILS):
            k = address - self._coil0
            if not (k >= 0 and k + count <= len(self.sources)):
                return self._refuse(ILLEGAL_ADDRESS)
            return [self.coils[s] for s in self.sources[k:k + count]]
        k = address - self._reg0
        if not (k >= 0 and k + count <= BLOCK * len(self.sources)):
            return self._refuse(ILLEGAL_ADDRESS)
        return [self.regs[self.sources[i // BLOCK]][i % BLOCK] for i in range(k, k + count)]

    def write(self, fc: int, address: int, values: Sequence[int] | Sequence[bool]) -> int | None:
        """Apply a write request; its exception code when refused (nothing changed by the
        refused value: a multi-coil write applies the coils before a refused one)."""
        if fc not in (WRITE_COIL, WRITE_REGISTER, WRITE_COILS, WRITE_REGISTERS):
            return self._refuse(ILLEGAL_FUNCTION)
        if not values:
            return self._refuse(ILLEGAL_VALUE)
        if fc in (WRITE_COIL, WRITE_COILS):
            k = address - self._coil0
            if not (k >= 0 and k + len(values) <= len(self.sources)):
                return self._refuse(ILLEGAL_ADDRESS)
            for s, v in zip(self.sources[k:k + len(values)], values, strict=True):
                if (code := self._set_coil(s, bool(v))) is not None:
                    return self._refuse(code)
            return None
        k = address - self._reg0
        if len(values) != 1 or not (0 <= k < BLOCK * len(self.sources)) or k % BLOCK != PART_SEQ:
            return self._refuse(ILLEGAL_ADDRESS)
        v = int(values[0])
        if not 0 <= v <= 0xFFFF:
            return self._refuse(ILLEGAL_VALUE)
        code = self._set_seq(self.sources[k // BLOCK], v)
        return None if code is None else self._refuse(code)

    def _set_coil(self, source: str, new: bool) -> int | None:
        old = self.coils[source]
        if rising(old, new):
            seq = u16(self.regs[source][PART_SEQ] + 1)
            if not self._edge(source, "PartPresent", seq):
                return DEVICE_BUSY
            self.regs[source][PART_SEQ] = seq
        self.coils[source] = new
        return None

    def _set_seq(self, source: str, seq: int) -> int | None:
        if new_count(self.regs[source][PART_SEQ], seq):
            if not self._edge(source, "PartSeq", seq):
                return DEVICE_BUSY
            self.regs[source][PART_SEQ] = seq
        return None

    def _edge(self, source: str, via: str, seq: int) -> bool:
        edge = self._push(source, via)
        if edge is None:
            self.regs[source][REFUSED] = u16(self.regs[source][REFUSED] + 1)
            return False
        waiting = self._seq_of[source]
        waiting[edge.n] = seq
        while len(waiting) > self._keep:  # the oldest never got a verdict (failed inference)
            del waiting[next(iter(waiting))]
        return True

    def _refuse(self, code: int) -> int:
        self.refused += 1
        return code

    # -- the daemon's side --------------------------------------------------------------------

    def show(self, source: str, ref: str, label: str, score: float, e2e_ms: float) -> bool:
        """Write a stored result's verdict, VerdictSeq last; False when it answers no edge
        of this map (another source, or a ref that is not `plc-<n>`)."""
        waiting = self._seq_of.get(source)
        if waiting is None or not ref.startswith("plc-") or not ref[4:].isdigit():
            return False
        seq = waiting.pop(int(ref[4:]), None)
        if seq is None:
            return False
        r = self.regs[source]
        ok = label in self._ok
        r[VERDICT] = VERDICT_OK if ok else VERDICT_NOK
        r[CLASS] = self._classes.get(label, 0)
        r[SCORE] = scaled(score, 10_000, 10_000)
        r[E2E_MS] = scaled(e2e_ms, 10, UNKNOWN)
        r[RESULTS] = u16(r[RESULTS] + 1)
        r[NOK] = u16(r[NOK] + (not ok))
        r[VERDICT_SEQ] = seq
        return True

    def set_pending(self, source: str, pending: int) -> None:
        """Edges of `source` waiting for their capture (saturating at 65535)."""
        self.regs[source][PENDING] = min(pending, 0xFFFF)
