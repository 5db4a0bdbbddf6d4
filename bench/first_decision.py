"""The fast cold start against the exhaustive one, in the same run: time to the first choice,
time to the final choice, and the final choice's energy against the exhaustive choice's.

    python bench/first_decision.py [--runs 3] [--latency-ms 20]     # the bundled model
    python bench/first_decision.py --heavy [--channels 48] [--runs 1]   # a conv net, 4 forms

Each run starts cold (empty profile caches) and measures both schedules one after the other
(the order alternates between runs, so drift on a shared machine does not favour one). Times
are from the start of profiling (manifest, idle baseline, measuring) to the choice; engines
are discovered once beforehand (reported).

Energy is compared on the exhaustive run's numbers: the fast schedule's final variant as the
exhaustive run measured it, over the exhaustive choice's energy. Comparing each schedule's
own measurement would add the run-to-run noise of two measurements of the same variant.

`--heavy` builds a conv net (fp32 ORT on one EPYC core, p95 measured: 25.6 ms at the default
24 channels, 29.1 ms at `--channels 48`; several times that on a loaded machine) and prepares
its ladder (fp32, fp16, int8, reduced resolution) with `runtime.prepare` on generated images.
"""

from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from power.device import load_profile
from power.sensors import detect_meter
from runtime.backends import discover
from runtime.config import Config, load
from runtime.measure import measure_first, measure_model
from runtime.refine import keep
from runtime.selector import Constraints, select


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

    from runtime.manifest import Preprocess
    from runtime.prepare import PrepareOptions, generated_frames, prepare

    src = heavy_model(root / "heavy.onnx", ch=ch)
    val = root / "val"
    val.mkdir()
    for i, img in enumerate(generated_frames((160, 160), 48)):
        cv2.imwrite(str(val / f"{i:03d}.png"), img)
    out = root / "heavy"
    prepare(src, None, val, out, PrepareOptions(name="heavy", preprocess=Preprocess()))
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
            sum(1 for p in final.profiles if p.stage == "full"), len(final.profiles),
            final.profiles)


def run_exhaustive(model: Path, cfg: Config, backends, meter, device, c: Constraints):
    t0 = time.monotonic()
    m = measure_model(model, cfg, backends, meter, device.name,
                      device.power.active_w_per_core, None, lambda *_: None, lambda *_: None,
                      c)
    return m.profiles, time.monotonic() - t0


def spread(xs: list[float], fmt: str = "{:.1f}") -> str:
    """median (min-max)."""
    return (fmt.format(statistics.median(xs)) + " (" + fmt.format(min(xs)) + "-"
            + fmt.format(max(xs)) + ")")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--heavy", action="store_true", help="the conv net's 4-form ladder")
    ap.add_argument("--channels", type=int, default=24, help="--heavy: conv width (fp32 ORT "
                    "1 thread p95 measured here: 24: 25.6 ms, 48: 29.1 ms)")
    ap.add_argument("--latency-ms", type=float, help="default 20 (bundled), 1000 (--heavy)")
    ap.add_argument("--config", type=Path, help="edgerun config (default: built-in defaults)")
    ap.add_argument("-v", "--verbose", action="store_true", help="the profilers' log")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(asctime)s %(name)s %(message)s")
    base = load(args.config)
    device = load_profile(base.device.profile)
    meter = detect_meter(Path(base.device.sysfs_root), device)
    t = time.monotonic()
    backends = discover(base.backends)
    print(f"engines discovered once in {time.monotonic() - t:.2f} s: "
          f"{', '.join(b.name for b in backends)}; energy source {meter.source}")
    with tempfile.TemporaryDirectory(prefix="edgerun-first-") as tmp:
        if args.heavy:
            t = time.monotonic()
            model = heavy_ladder(Path(tmp), args.channels)
            print(f"heavy ladder prepared in {time.monotonic() - t:.1f} s")
        else:
            from models import bundled

            model = bundled()
        c = Constraints(args.latency_ms or (1000.0 if args.heavy else base.constraints.latency_ms),
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
            for which in order:
                if which == "fast":
                    fast = run_fast(model, cfg_for("fast"), backends, meter, device, c)
                else:
                    ex_profiles, t_ex = run_exhaustive(model, cfg_for("exhaustive"), backends,
                                                       meter, device, c)
            first_id, t_first, final_id, t_final, n_full, n_all, fast_profiles = fast
            by_id = {p.variant_id: p for p in ex_profiles}
            ex_choice = select(ex_profiles, c).profile
            e_final = by_id[final_id].energy_mj / ex_choice.energy_mj - 1
            e_first = by_id[first_id].energy_mj / ex_choice.energy_mj - 1
            # How reproducible a full-length measurement is here: the same variants measured
            # at full length by both schedules in this run.
            fast_full = {p.variant_id: p.energy_mj for p in fast_profiles
                         if p.ok and p.stage == "full"}
            again = sorted(abs(fast_full[v] / by_id[v].energy_mj - 1) for v in fast_full
                           if v in by_id and by_id[v].ok)
            both = {v: (fast_full[v] + by_id[v].energy_mj) / 2 for v in fast_full
                    if v in by_id and by_id[v].ok}
            e_mean = (both[final_id] / both[ex_choice.variant_id] - 1
                      if final_id in both and ex_choice.variant_id in both else math.nan)
            # Within the exhaustive run's own noise: would its own race (runtime.refine.keep,
            # each measurement's interval + the noise floor) still keep the final choice?
            tied = final_id in keep(ex_profiles, c)
            rows.append((t_first, t_final, t_ex, e_first, e_final, e_mean, float(tied)))
            if again:
                print(f"  the same variant measured at full length twice in this run: energy "
                      f"differs by median {statistics.median(again):.1%}, at most "
                      f"{again[-1]:.1%} ({len(again)} variants); on the mean of both "
                      f"measurements the final choice is {e_mean:+.1%} vs the exhaustive one")
            ref = next((p for p in ex_profiles if p.ok and p.precision == "fp32"
                        and p.engine == "onnxruntime" and p.threads == 1
                        and "-" not in p.model), None)  # the model's class: plain fp32, 1 core
            if ref is not None:
                print(f"  {ref.variant_id}: p95 {ref.p95_ms:.1f} ms (the model's class)")
            print(f"run {r + 1} ({order[0]} first): first choice {t_first:.1f} s "
                  f"({first_id}, {e_first:+.1%} energy), final {t_final:.1f} s ({final_id}, "
                  f"{e_final:+.1%} energy{', a tie within its noise' if tied else ''}, "
                  f"{n_full}/{n_all} variants at full length); "
                  f"exhaustive {t_ex:.1f} s ({ex_choice.variant_id}, p{c.percentile} "
                  f"{ex_choice.latency(c.percentile):.2f} ms); time to first choice "
                  f"{t_ex / t_first:.1f}x shorter, to final {t_ex / t_final:.1f}x", flush=True)
        cols = list(zip(*rows, strict=True))
        print(f"\nsummary over {args.runs} cold runs, median (min-max):")
        print(f"  first choice        {spread(list(cols[0]))} s")
        print(f"  final choice        {spread(list(cols[1]))} s")
        print(f"  exhaustive          {spread(list(cols[2]))} s")
        ratio_first = [e / f for e, f in zip(cols[2], cols[0], strict=True)]
        ratio_final = [e / f for e, f in zip(cols[2], cols[1], strict=True)]
        print(f"  exhaustive / first  {spread(ratio_first)}x")
        print(f"  exhaustive / final  {spread(ratio_final)}x")
        print(f"  first choice energy vs exhaustive choice  "
              f"{spread([100 * x for x in cols[3]], '{:+.1f}')} %")
        print(f"  final choice energy vs exhaustive choice  "
              f"{spread([100 * x for x in cols[4]], '{:+.1f}')} %")
        print(f"  final choice tied with the exhaustive one within the exhaustive run's own "
              f"noise: {int(sum(cols[6]))} of {args.runs} runs")
        means = [100 * x for x in cols[5] if not math.isnan(x)]
        if means:
            print(f"  ... on the mean of both runs' full-length measurements  "
                  f"{spread(means, '{:+.1f}')} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
