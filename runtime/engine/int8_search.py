"""Which nodes of a detector to leave in float under int8, found from the graph, and the search.

A YOLO-style export ends with box decoding: the prediction convolutions' outputs reshaped,
split into box and class channels, put through sigmoids, scaled to pixels and concatenated
back into one `[1, 4+C, N]` tensor. Quantized with one scale, that last tensor holds box
coordinates in pixels (0..640) next to scores in 0..1: 8 bits leave the scores a handful of
steps and the detections mostly gone (REFERENCE.md "Model metadata and quantization"; int8
of a YOLOv8n quantized that way measured mAP 0.125 of fp32's). The nodes are found from the
graph, not from one exporter's names:

- `tail`: every node reachable backwards from the graph outputs without passing a weighted
  op (Conv, ConvTranspose, Gemm, MatMul): the decoding and the concatenation;
- `head`: the weighted ops at the tail's edge (the prediction convolutions; YOLOv8's DFL conv).

`search` quantizes with an increasing exclusion (none, the tail, the tail and the head),
measuring each candidate, and stops at the first that keeps `target` of fp32's accuracy; the
calibration method (MinMax, Percentile, Entropy) is then picked by measurement on that
exclusion. Every candidate is listed in the log the manifest keeps (`int8_search`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

WEIGHTED = {"Conv", "ConvTranspose", "Gemm", "MatMul", "ConvInteger", "MatMulInteger"}
KEEP = 0.8  # a detector's int8 is good enough at 0.8 of fp32's mAP
METHODS = ("MinMax", "Percentile", "Entropy")


def name_nodes(proto: Any) -> int:
    """Give every unnamed node a unique name (`nodes_to_exclude` works by name); returns how
    many were named."""
    taken = {n.name for n in proto.graph.node if n.name}
    named = 0
    for i, n in enumerate(proto.graph.node):
        if not n.name:
            name = f"_er_{n.op_type}_{i}"
            while name in taken:
                name += "_"
            n.name = name
            taken.add(name)
            named += 1
    return named


def decode_tail(proto: Any) -> tuple[list[str], list[str]]:
    """(tail, head) node names of the graph (module doc); the nodes must be named."""
    producer = {o: n for n in proto.graph.node for o in n.output}
    tail: list[str] = []
    head: list[str] = []
    seen: set[str] = set()
    stack = [o.name for o in proto.graph.output]
    while stack:
        t = stack.pop()
        n = producer.get(t)
        if n is None or n.name in seen:
            continue
        seen.add(n.name)
        if n.op_type in WEIGHTED:
            head.append(n.name)
            continue
        tail.append(n.name)
        stack.extend(i for i in n.input if i)
    return tail, head


@dataclass(frozen=True)
class Candidate:
    """One int8 attempt: what was left in float, how it was calibrated, what it scored."""

    exclude: str  # none | tail | tail+head
    nodes: int  # how many nodes were left in float
    method: str
    accuracy: float | None  # None: it failed (error says why)
    error: str = ""

    def to_dict(self) -> dict:
        """The manifest's form."""
        d = {"exclude": self.exclude, "nodes": self.nodes, "method": self.method,
             "accuracy": None if self.accuracy is None else round(self.accuracy, 4)}
        return {**d, "error": self.error} if self.error else d


def search(make: Callable[[Path, list[str], str], None], measure: Callable[[Path], float],
           tail: list[str], head: list[str], reference: float, work: Path,
           target: float = KEEP, log: Callable[[str], None] = lambda m: None
           ) -> tuple[Path | None, list[Candidate]]:
    """Quantize (`make(dst, nodes_to_exclude, method)`) and measure candidates (module doc).
    Returns the best file (None when every candidate failed) and every candidate tried."""
    tried: list[Candidate] = []
    files: dict[Candidate, Path] = {}
    goal = target * reference

    def attempt(label: str, nodes: list[str], method: str) -> Candidate:
        dst = work / f"int8-{label.replace('+', '-')}-{method}.onnx"
        try:
            make(dst, nodes, method)
            c = Candidate(label, len(nodes), method, measure(dst))
            files[c] = dst
        except Exception as e:  # one candidate failing costs that candidate only
            c = Candidate(label, len(nodes), method, None,
                          str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
        tried.append(c)
        log(f"int8 candidate: {label} in float ({len(nodes)} nodes), {method}: "
            + (f"{c.accuracy:.4f}" if c.accuracy is not None else f"failed: {c.error}"))
        return c

    chosen = None
    levels = [("none", [])]
    if tail:
        levels.append(("tail", tail))
    if head:
        levels.append(("tail+head", tail + head))
    for label, nodes in levels:
        c = attempt(label, nodes, METHODS[0])
        if c.accuracy is not None and (chosen is None or c.accuracy > chosen.accuracy):
            chosen = c
        if c.accuracy is not None and c.accuracy >= goal:
            break
    if chosen is not None:
        nodes = dict(levels)[chosen.exclude]
        for method in METHODS[1:]:
            c = attempt(chosen.exclude, nodes, method)
            if c.accuracy is not None and c.accuracy > chosen.accuracy:
                chosen = c
    return (files[chosen] if chosen is not None else None), tried
