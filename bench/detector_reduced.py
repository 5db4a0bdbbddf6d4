"""A ~100 ms detector's reduced-resolution rung against its fp32 form: the ladder `models
prepare` makes of it, then the latency of both, in the same run, over several runs.

    python bench/detector_reduced.py [--runs 3] [--n 15] [--size 416] [--width 76]

The detector is first_decision.py's YOLOv8-shaped bench detector built as an export with
dynamic axes (`detector_model(..., dynamic=True)`: reshapes to -1 candidates, box scale from
the input's Shape), so `models prepare` makes its reduced form (416 -> 288 px). It is prepared
by the real CLI on generated unlabelled images with `--min-accuracy-ratio 0`: its weights are
random, so its mAP figures (against fp32's detections) say nothing about a trained model, and
the floor would drop the reduced form this bench is about. The model and its ladder are kept
under `--cache` (preparing takes a minute or two here).

Latency: ONNX Runtime, CPU, one intra-op thread, `--n` inferences of a fixed generated frame
after 3 warm-up runs, fp32 and the reduced form alternating within each run; per run the
median of each, then the spread (min..max) of those medians over `--runs`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[1]


def ladder(cache: Path, hw: int, width: int, images: int) -> Path:
    """The dynamic bench detector prepared by `edgerun models prepare` (cached): the same
    ladder as `first_decision.py --detector`'s."""
    from first_decision import detector_ladder

    return detector_ladder(cache, hw, width, images)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--n", type=int, default=15, help="timed inferences per form and run")
    ap.add_argument("--size", type=int, default=416)
    ap.add_argument("--width", type=int, default=76)
    ap.add_argument("--images", type=int, default=32, help="generated val images")
    ap.add_argument("--cache", type=Path,
                    default=Path(tempfile.gettempdir()) / "edgerun-bench-first-decision")
    args = ap.parse_args()

    import onnxruntime as ort

    from runtime.engine.manifest import load_manifest
    from runtime.engine.prepare import generated_frames

    out = ladder(args.cache, args.size, args.width, args.images)
    m = load_manifest(out)
    print("rung       input     mAP@0.5 (vs fp32's detections; random weights)")
    for v in m.variants:
        print(f"{v.name:<10} {'x'.join(map(str, m.preprocess.hw(v.input_shape))):<9} "
              f"{v.accuracy:.4f}")
    for f in m.failed:
        print(f"{f['variant']:<10} skipped: {f['error']}")
    reduced = [v for v in m.variants if v.precision == "fp32-reduced"]
    if not reduced:
        print("no reduced form in the ladder: nothing to time")
        return 1
    forms = [m.variant("fp32"), reduced[0]]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    frame = generated_frames((args.size, args.size), 1, seed=7)[0]
    sessions = [(v, ort.InferenceSession(str(m.path(v)), so, providers=["CPUExecutionProvider"]),
                 m.preprocess.apply(frame, v.input_shape)) for v in forms]
    medians: dict[str, list[float]] = {v.name: [] for v in forms}
    for run in range(args.runs):
        times: dict[str, list[float]] = {v.name: [] for v in forms}
        for v, s, x in sessions:
            for _ in range(3):
                s.run(None, {v.input_name: x})
        for _ in range(args.n):
            for v, s, x in sessions:  # alternating: drift on a shared machine hits both
                t = time.perf_counter()
                s.run(None, {v.input_name: x})
                times[v.name].append((time.perf_counter() - t) * 1e3)
        load = os.getloadavg()[0]
        line = ", ".join(f"{k} {statistics.median(t):.1f} ms" for k, t in times.items())
        print(f"run {run + 1}: median of {args.n}: {line} (load {load:.2f})", flush=True)
        for k, t in times.items():
            medians[k].append(statistics.median(t))
    full, red = (medians[v.name] for v in forms)
    ratio = [r / f for r, f in zip(red, full, strict=True)]
    print(f"fp32 {statistics.median(full):.1f} ms ({min(full):.1f}..{max(full):.1f}); "
          f"{forms[1].name} {statistics.median(red):.1f} ms ({min(red):.1f}..{max(red):.1f}); "
          f"reduced/fp32 {statistics.median(ratio):.2f} ({min(ratio):.2f}..{max(ratio):.2f}) "
          f"over {args.runs} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
