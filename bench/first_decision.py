"""The fast cold start against the exhaustive one, in the same run: time to the first choice,
time to the final choice, and the final choice's energy against the exhaustive choice's.

    python bench/first_decision.py [--runs 3] [--latency-ms 20]     # the bundled model
    python bench/first_decision.py --detector [--runs 2]    # a ~100 ms detector's ladder
    python bench/first_decision.py --heavy [--channels 48] [--runs 1]   # a conv net, 4 forms

Each run starts cold (empty profile caches) and measures both schedules one after the other
(the order alternates between runs, so drift on a shared machine does not favour one). Times
are from the start of profiling (manifest, idle baseline, measuring) to the choice; engines
are discovered once beforehand (reported). Every line carries the 1-minute load average.

Selection quality, side by side with the noise floor, per run:

- the fast schedule's final variant's energy *as the exhaustive pass measured it*, over the
  exhaustive choice's (one measurement of each, the same pass);
- the same on the medians of `--repeats` + 1 full-length measurements of each (the
  exhaustive pass's plus `--repeats` more, interleaved A B A B ...);
- the noise floor: how far those repeated measurements of one variant spread, (max - min) /
  median. A gap between two choices smaller than this is not a measurable difference.

`--detector` generates a YOLOv8-shaped detector (`detector_model`: output [1, 7, 3549], 416
px, 108 ms of CPU time per fp32 ORT inference on one core of this EPYC), prepares it with the
real `edgerun models prepare` on generated unlabelled images — as a dynamic-axes export
(`detector_model(..., dynamic=True)`), so the ladder has the issue's four forms: fp32, fp16,
int8 and the reduced resolution (288 px); `--min-accuracy-ratio 0` keeps int8, whose mAP
against fp32 means nothing on random weights — and keeps both under `--cache` for the next run.
`--heavy` builds a conv net (fp32 ORT on one EPYC core, p95 measured: 25.6 ms at the default
24 channels, 29.1 ms at `--channels 48`; several times that on a loaded machine) and prepares
its ladder (fp32, fp16, int8, reduced resolution) with `runtime.engine.prepare` on generated images.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from power.sensors import detect_meter
from runtime.choice.measure import Measured, measure_first, measure_model
from runtime.choice.profiler import Profiler, full_settings
from runtime.choice.refine import keep
from runtime.choice.selector import Constraints, select
from runtime.config import Config
from runtime.config import load as load_config
from runtime.device.profiles import load_profile
from runtime.engine.backends import discover

REPO = Path(__file__).resolve().parents[1]


def heavy_model(path: Path, hw: int = 160, ch: int = 24, convs: int = 3) -> Path:
    """Conv(3->ch)-Relu, `convs` x Conv(ch->ch)-Relu, GAP, Gemm, Softmax (compute grows with
    ch squared)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)

    def w(name: str, shape: tuple[int, ...], scale: float):
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)

    inits = [w("w0", (ch, 3, 3, 3), 0.1), w("b0", (ch,), 0.1)]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"])]
    for i in range(1, convs + 1):
        inits += [w(f"w{i}", (ch, ch, 3, 3), 0.05), w(f"b{i}", (ch,), 0.1)]
        nodes += [helper.make_node("Conv", [f"r{i - 1}", f"w{i}", f"b{i}"], [f"c{i}"],
                                   pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"])]
    inits += [w("fw", (5, ch), 0.3), w("fb", (5,), 0.1)]
    nodes += [helper.make_node("GlobalAveragePool", [f"r{convs}"], ["g"]),
              helper.make_node("Flatten", ["g"], ["f"]),
              helper.make_node("Gemm", ["f", "fw", "fb"], ["l"], transB=1),
              helper.make_node("Softmax", ["l"], ["y"], axis=1)]
    graph = helper.make_graph(
        nodes, "heavy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def heavy_ladder(root: Path, ch: int = 24) -> Path:
    """The heavy model prepared into a 4-form ladder (agreement with fp32 on generated
    images as its accuracy basis)."""
    import cv2

    from runtime.engine.manifest import Preprocess
    from runtime.engine.prepare import PrepareOptions, generated_frames, prepare

    src = heavy_model(root / "heavy.onnx", ch=ch)
    val = root / "val"
    val.mkdir()
    for i, img in enumerate(generated_frames((160, 160), 48)):
        cv2.imwrite(str(val / f"{i:03d}.png"), img)
    out = root / "heavy"
    prepare(src, None, val, out, PrepareOptions(name="heavy", preprocess=Preprocess(),
                                                min_accuracy_ratio=0.0,  # random weights
                                                check_reference=False))
    return out


DETECTOR_CLASSES = ("scratch", "dent", "stain")
DETECTOR_VERSION = 3  # bump when detector_model changes: the cache is keyed on it


def _detector_graph(hw: int, width: int, classes: int, shift: float, dynamic: bool = False):
    """A YOLOv8-shaped detector: a stride-32 conv backbone (3x3 convs, ReLU), a 3x3 + 1x1 head
    at strides 8, 16 and 32, outputs concatenated to `[1, 4 + classes, N]`; boxes are
    sigmoid x input size (cx, cy, w, h in input pixels), scores sigmoid(logit - shift). Random
    He-initialised weights from seed 0: deterministic, meaningless (this measures profiling
    time, not accuracy). `dynamic`: as an export with dynamic axes, the head reshapes to -1
    candidates and the box scale is the input's width from its Shape, so the graph runs at
    any input size (`models prepare` then makes its reduced-resolution rung)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits, nodes = [], []

    def const(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def conv(x: str, cin: int, cout: int, k: int, s: int, name: str, act: bool = True) -> str:
        w = rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))
        const(name + "_w", w.astype(np.float32))
        const(name + "_b", np.zeros(cout, np.float32))
        nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [name + "_c"],
                                      strides=[s, s], pads=[k // 2] * 4))
        if not act:
            return name + "_c"
        nodes.append(helper.make_node("Relu", [name + "_c"], [name]))
        return name

    c = [width * m for m in (1, 2, 4, 8)]
    x = conv("images", 3, c[0] // 2, 3, 2, "stem")
    x = conv(conv(x, c[0] // 2, c[0], 3, 2, "d1"), c[0], c[0], 3, 1, "b1")
    x = conv(x, c[0], c[1], 3, 2, "d2")
    p3 = conv(conv(x, c[1], c[1], 3, 1, "b2a"), c[1], c[1], 3, 1, "b2b")
    x = conv(p3, c[1], c[2], 3, 2, "d3")
    p4 = conv(conv(x, c[2], c[2], 3, 1, "b3a"), c[2], c[2], 3, 1, "b3b")
    p5 = conv(conv(p4, c[2], c[3], 3, 2, "d4"), c[3], c[3], 3, 1, "b4")
    heads = []
    for name, p, ch, stride in (("h3", p3, c[1], 8), ("h4", p4, c[2], 16), ("h5", p5, c[3], 32)):
        y = conv(conv(p, ch, ch, 3, 1, name + "s"), ch, 4 + classes, 1, 1, name + "o", False)
        shape = const(name + "_shape", np.array(
            [1, 4 + classes, -1 if dynamic else (hw // stride) ** 2], np.int64))
        nodes.append(helper.make_node("Reshape", [y, shape], [name + "_r"]))
        heads.append(name + "_r")
    n = sum((hw // s) ** 2 for s in (8, 16, 32))
    lo, mid, hi = (const(f"cut{i}", np.array([v], np.int64))
                   for i, v in enumerate((0, 4, 4 + classes)))
    axis = const("axis", np.array([1], np.int64))
    if dynamic:  # the input's width, from its shape: boxes in the pixels of any input size
        nodes += [helper.make_node("Shape", ["images"], ["in_shape"]),
                  helper.make_node("Gather", ["in_shape", const("w_axis", np.array(3, np.int64))],
                                   ["in_w"]),
                  helper.make_node("Cast", ["in_w"], ["size"], to=TensorProto.FLOAT)]
    else:
        const("size", np.array(float(hw), np.float32))
    nodes += [helper.make_node("Concat", heads, ["raw"], axis=2),
              helper.make_node("Slice", ["raw", lo, mid, axis], ["box_raw"]),
              helper.make_node("Slice", ["raw", mid, hi, axis], ["cls_raw"]),
              helper.make_node("Sigmoid", ["box_raw"], ["box_s"]),
              helper.make_node("Mul", ["box_s", "size"], ["box"]),
              helper.make_node("Sub", ["cls_raw", const("shift", np.array(shift, np.float32))],
                               ["cls_sh"]),
              helper.make_node("Sigmoid", ["cls_sh"], ["cls"]),
              helper.make_node("Concat", ["box", "cls"], ["output0"], axis=1)]
    graph = helper.make_graph(
        nodes, "detector",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, hw, hw])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT,
                                       [1, 4 + classes, "anchors" if dynamic else n])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def detector_model(path: Path, hw: int = 416, width: int = 76,
                   classes: int = len(DETECTOR_CLASSES), dynamic: bool = False) -> Path:
    """Write the bench detector (`_detector_graph`) to `path`. The score shift is set so that
    ~0.3 % of the candidates of a generated frame score above 0.25 (a handful of boxes per
    frame after NMS, like a real detector on a plate): random weights put the logits anywhere.
    Deterministic: the same arguments write the same bytes."""
    import onnx
    import onnxruntime as ort

    from runtime.engine.manifest import Preprocess
    from runtime.engine.prepare import generated_frames

    probe = _detector_graph(hw, width, classes, 0.0, dynamic)
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    x = Preprocess().apply(generated_frames((hw, hw), 1, seed=1)[0], (1, 3, hw, hw))
    scores = sess.run(None, {"images": x})[0][0, 4:].astype(np.float64).clip(1e-12, 1 - 1e-12)
    logits = np.log(scores / (1 - scores))
    shift = float(np.quantile(logits, 0.997)) + math.log(3)  # logit(0.25) = -log 3
    model = _detector_graph(hw, width, classes, round(shift, 3), dynamic)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def detector_ladder(cache: Path, hw: int = 416, width: int = 76, images: int = 32) -> Path:
    """The bench detector prepared by the real `edgerun models prepare` (a subprocess of this
    checkout) with unlabelled generated images as `--val` (and so as int8's calibration set):
    fp32, fp16, int8 and reduced, accuracy = mAP@0.5 against fp32's detections. Cached under `cache`
    by its arguments (the model is ~50 MB and preparing it takes a minute): a second bench
    run reuses it."""
    import cv2

    from runtime.engine.manifest import load_manifest
    from runtime.engine.prepare import generated_frames

    root = cache / f"detector-v{DETECTOR_VERSION}-{hw}px-w{width}-i{images}"
    out = root / "detector"
    if (out / "manifest.json").exists():
        try:
            load_manifest(out)
            print(f"detector ladder from the cache: {out}")
            return out
        except (OSError, ValueError) as e:
            print(f"cached detector ladder unusable ({e}); preparing it again")
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    t = time.monotonic()
    src = detector_model(root / "detector.onnx", hw, width, dynamic=True)
    print(f"detector model written in {time.monotonic() - t:.1f} s: {src} "
          f"({src.stat().st_size / 2**20:.0f} MB, input {hw}x{hw}, width {width})")
    val = root / "val"
    val.mkdir()
    for i, img in enumerate(generated_frames((hw, hw), images, seed=2)):
        cv2.imwrite(str(val / f"{i:03d}.png"), img)
    (root / "labels.txt").write_text("\n".join(DETECTOR_CLASSES) + "\n")
    cmd = [sys.executable, "-m", "runtime.cli", "models", "prepare", str(src), "--val", str(val),
           "--labels", str(root / "labels.txt"), "--name", "detector", "--out", str(out),
           "--min-accuracy-ratio", "0",  # random weights: keep every rung (timing, not mAP)
           "--no-reference-check"]  # ... whose reference may see nothing
    print("$ edgerun " + " ".join(cmd[3:]), flush=True)
    t = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    print(done.stdout, end="")
    if done.returncode != 0:
        print(done.stderr, end="", file=sys.stderr)
        raise SystemExit(f"models prepare failed (exit {done.returncode})")
    print(f"prepared in {time.monotonic() - t:.1f} s")
    return out


def run_fast(model: Path, cfg: Config, backends, meter, device, c: Constraints):
    t0 = time.monotonic()
    first, rest = measure_first(model, cfg, backends, meter, device.name,
                                device.power.active_w_per_core, None, lambda *_: None,
                                lambda *_: None, c)
    t_first = time.monotonic() - t0
    final = rest(None) if rest is not None else first
    t_final = time.monotonic() - t0
    return (select(first.profiles, c).profile.variant_id, t_first,
            select(final.profiles, c).profile.variant_id, t_final,
            sum(1 for p in final.profiles if p.ok and p.stage == "full"), len(final.profiles),
            final.profiles)


def run_exhaustive(model: Path, cfg: Config, backends, meter, device, c: Constraints):
    t0 = time.monotonic()
    m = measure_model(model, cfg, backends, meter, device.name,
                      device.power.active_w_per_core, None, lambda *_: None, lambda *_: None,
                      c)
    return m, time.monotonic() - t0


def remeasure(m: Measured, cfg: Config, meter, device, ids: list[str],
              repeats: int) -> dict[str, list[float]]:
    """Each variant in `ids` measured again at full length `repeats` times, interleaved
    (A B A B ...: drift of the machine's load hits both alike); energies per variant."""
    prof = Profiler(cfg.profiler, meter, device.name,
                    active_w_per_core=device.power.active_w_per_core)
    out: dict[str, list[float]] = {v: [] for v in ids}
    for _ in range(repeats):
        for vid in ids:
            b, v = m.loaders[vid]
            p = prof.measure(b, v, full_settings(cfg.profiler))
            if p.ok:
                out[vid].append(p.energy_mj)
    return out


def rel_spread(xs: list[float]) -> float:
    """(max - min) / median of repeated measurements of one variant: the noise floor."""
    return (max(xs) - min(xs)) / statistics.median(xs) if len(xs) > 1 else math.nan


def spread(xs: list[float], fmt: str = "{:.1f}") -> str:
    """median (min-max)."""
    xs = [x for x in xs if not math.isnan(x)]
    if not xs:
        return "n/a"
    return (fmt.format(statistics.median(xs)) + " (" + fmt.format(min(xs)) + "-"
            + fmt.format(max(xs)) + ")")


def load() -> str:
    """The 1-minute load average, for labelling numbers measured on a shared machine."""
    return f"load {os.getloadavg()[0]:.1f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--heavy", action="store_true", help="the conv net's 4-form ladder")
    ap.add_argument("--channels", type=int, default=24, help="--heavy: conv width (fp32 ORT "
                    "1 thread p95 measured here: 24: 25.6 ms, 48: 29.1 ms)")
    ap.add_argument("--detector", action="store_true",
                    help="a YOLOv8-shaped detector (~100 ms fp32 ORT 1 thread here) prepared "
                    "by `edgerun models prepare`")
    ap.add_argument("--width", type=int, default=76, help="--detector: backbone width")
    ap.add_argument("--size", type=int, default=416, help="--detector: input size (px)")
    ap.add_argument("--cache", type=Path,
                    default=Path(tempfile.gettempdir()) / "edgerun-bench-first-decision",
                    help="--detector: where the generated model and its ladder are kept")
    ap.add_argument("--repeats", type=int, default=3,
                    help="full-length re-measurements of the exhaustive choice and the final "
                    "choice per run (the noise floor)")
    ap.add_argument("--no-exhaustive", action="store_true",
                    help="the fast schedule only (first and final choice times)")
    ap.add_argument("--latency-ms", type=float,
                    help="default 20 (bundled), 1000 (--heavy, --detector)")
    ap.add_argument("--config", type=Path, help="edgerun config (default: built-in defaults)")
    ap.add_argument("-v", "--verbose", action="store_true", help="the profilers' log")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(asctime)s %(name)s %(message)s")
    base = load_config(args.config)
    device = load_profile(base.device.profile)
    meter = detect_meter(Path(base.device.sysfs_root), device)
    t = time.monotonic()
    backends = discover(base.backends)
    print(f"engines discovered once in {time.monotonic() - t:.2f} s: "
          f"{', '.join(b.name for b in backends)}; energy source {meter.source}; {load()}")
    with tempfile.TemporaryDirectory(prefix="edgerun-first-") as tmp:
        if args.detector:
            model = detector_ladder(args.cache, args.size, args.width)
        elif args.heavy:
            t = time.monotonic()
            model = heavy_ladder(Path(tmp), args.channels)
            print(f"heavy ladder prepared in {time.monotonic() - t:.1f} s")
        else:
            from models import bundled

            model = bundled()
        big = args.heavy or args.detector
        c = Constraints(args.latency_ms or (1000.0 if big else base.constraints.latency_ms),
                        base.constraints.percentile, base.constraints.accuracy_floor)
        print(f"model {model}, p{c.percentile} <= {c.latency_ms:g} ms, profiler "
              f"time_budget_s {base.profiler.time_budget_s}, first_decision_s "
              f"{base.profiler.first_decision_s}")
        rows = []
        for r in range(args.runs):
            def cfg_for(schedule: str, r: int = r) -> Config:
                d = Path(tmp) / f"cache-{r}-{schedule}"
                return replace(base, profiler=replace(base.profiler, cache_dir=str(d),
                                                      schedule=schedule))

            order = ("fast", "exhaustive") if r % 2 == 0 else ("exhaustive", "fast")
            if args.no_exhaustive:
                order = ("fast",)
            for which in order:
                if which == "fast":
                    fast = run_fast(model, cfg_for("fast"), backends, meter, device, c)
                else:
                    ex, t_ex = run_exhaustive(model, cfg_for("exhaustive"), backends, meter,
                                              device, c)
            first_id, t_first, final_id, t_final, n_full, n_all, fast_profiles = fast
            measured = fast_profiles if args.no_exhaustive else ex.profiles
            ref = next((p for p in measured if p.ok and p.precision == "fp32"
                        and p.engine == "onnxruntime" and p.threads == 1
                        and "-" not in p.model), None)  # the model's class: plain fp32, 1 core
            if ref is not None:
                print(f"  {ref.variant_id}: p95 {ref.p95_ms:.1f} ms ({ref.stage} measurement; "
                      "the model's class)")
            if args.no_exhaustive:
                print(f"run {r + 1}: first choice {t_first:.1f} s ({first_id}), final "
                      f"{t_final:.1f} s ({final_id}, {n_full}/{n_all} variants at full "
                      f"length); {load()}", flush=True)
                rows.append((t_first, t_final) + (math.nan,) * 7)
                continue
            ex_profiles = ex.profiles
            by_id = {p.variant_id: p for p in ex_profiles}
            ex_choice = select(ex_profiles, c).profile
            # (a) selection quality, on one measurement of every variant: the exhaustive
            # pass's. Comparing each schedule's own measurement would add the noise of two
            # measurements of the same variant.
            e_final = by_id[final_id].energy_mj / ex_choice.energy_mj - 1
            e_first = by_id[first_id].energy_mj / ex_choice.energy_mj - 1
            # (b) the noise floor: the exhaustive choice and the final choice measured again,
            # interleaved; and (a') the two compared on those repeats.
            ids = list(dict.fromkeys([ex_choice.variant_id, final_id]))
            again = remeasure(ex, cfg_for("exhaustive"), meter, device, ids, args.repeats)
            for vid in ids:  # with the exhaustive pass's own measurement
                again[vid].insert(0, by_id[vid].energy_mj)
            floor = max(rel_spread(again[v]) for v in ids)
            e_rep = (statistics.median(again[final_id])
                     / statistics.median(again[ex_choice.variant_id]) - 1)
            # Within the exhaustive run's own noise: would its own race (runtime.choice.refine.keep,
            # each measurement's interval + the noise floor) still keep the final choice?
            tied = final_id in keep(ex_profiles, c)
            rows.append((t_first, t_final, t_ex, e_first, e_final, e_rep, floor, float(tied),
                         float(final_id == ex_choice.variant_id)))
            for vid in ids:
                xs = again[vid]
                print(f"  {vid}: energy measured {len(xs)}x at full length: "
                      + ", ".join(f"{x:.3f}" for x in xs)
                      + f" mJ; spread {rel_spread(xs):.1%} of the median")
            print(f"run {r + 1} ({order[0]} first; {load()}): first choice {t_first:.1f} s "
                  f"({first_id}, {e_first:+.1%} energy), final {t_final:.1f} s ({final_id}, "
                  f"{n_full}/{n_all} variants at full length); exhaustive {t_ex:.1f} s "
                  f"({ex_choice.variant_id}, p{c.percentile} "
                  f"{ex_choice.latency(c.percentile):.2f} ms)\n"
                  f"  final vs exhaustive choice energy: {e_final:+.1%} on the exhaustive "
                  f"pass, {e_rep:+.1%} on the medians of {args.repeats + 1} measurements "
                  f"each; noise floor (same variant measured again) {floor:.1%}"
                  f"{'; the same variant' if final_id == ex_choice.variant_id else ''}"
                  f"{'; a tie within the exhaustive pass noise' if tied else ''}; "
                  f"exhaustive / first {t_ex / t_first:.1f}x, / final {t_ex / t_final:.1f}x",
                  flush=True)
        cols = [list(x) for x in zip(*rows, strict=True)]
        print(f"\nsummary over {args.runs} cold runs, median (min-max); {load()}:")
        print(f"  first choice        {spread(cols[0])} s")
        print(f"  final choice        {spread(cols[1])} s")
        if args.no_exhaustive:
            return 0
        print(f"  exhaustive          {spread(cols[2])} s")
        for k, name in ((0, "first"), (1, "final")):
            ratios = [e / f for e, f in zip(cols[2], cols[k], strict=True)]
            print(f"  exhaustive / {name}  {spread(ratios)}x")
        pct = "{:+.1f}"
        print(f"  first choice energy vs exhaustive choice (exhaustive pass)  "
              f"{spread([100 * x for x in cols[3]], pct)} %")
        print(f"  final choice energy vs exhaustive choice (exhaustive pass)  "
              f"{spread([100 * x for x in cols[4]], pct)} %")
        print(f"  ... on the medians of {args.repeats + 1} measurements each       "
              f"{spread([100 * x for x in cols[5]], pct)} %")
        print(f"  noise floor: one variant measured {args.repeats + 1}x, (max-min)/median  "
              f"{spread([100 * x for x in cols[6]], '{:.1f}')} %")
        print(f"  final choice = exhaustive choice in {int(sum(cols[8]))} of {args.runs} runs; "
              f"tied within the exhaustive pass's own noise in {int(sum(cols[7]))}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
