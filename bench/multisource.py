"""Several cameras, one box: 1, 2 and 4 synthetic sources on the bundled model, side by side.

For each source count N (every source at `--rate` Hz, so N x rate combined):
- the variant is chosen as the daemon chooses it: the bundled model's variants profiled on
  this host (ONNX Runtime, the profile cache is shared with `edgerun profile`), the ladder
  built for the per-inference target that keeps each stream within `--latency-ms` at the
  combined rate (runtime.frames.multisource.aggregate);
- a real Pipeline (the daemon's: fair lanes, one preprocess and one infer thread, results
  committed to a real SQLite outbox) runs N synthetic conveyors for `--seconds` after a
  warm-up; every result's capture-to-result latency is recorded per stream;
- box energy per second: the idle power of the device profile plus the process's CPU time
  over the window at the profile's W per busy core (the `estimated` meter's model; this host
  has no RAPL), next to what the control step plans with (top rung's J/inference x combined
  rate + idle).

The counts run interleaved within each repeat (order rotated), `--runs` repeats give the
spread. The per-stream p95 is the worst stream's p95 in a run.

Mixed models (`--mixed`, on by default): two sources, the bundled classifier on one and the
bundled defect detector (`models/defects`) on the other (`2 mixed`: a 96-pixel frame, one
inference; `2 mixed-tiled`: a 192-pixel frame cut into 9 tiles), side by side with `2`
(both sources on the classifier). Each model's variant is chosen for its own per-inference
target (runtime.choice.joint.targets: the frame's share over its tiles), the sessions run in one
Pipeline as the daemon runs them, and the planned W is idle + the sum over models of
inferences/s x J per inference of its top rung.

Usage: python bench/multisource.py [--runs 3] [--seconds 8] [--rate 10] [--latency-ms 20]
       [--counts 1,2,4] [--no-mixed]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dataclasses import replace

from models import bundled
from power.sensors import detect_meter
from runtime.choice import joint
from runtime.choice.ladders import ladder_for
from runtime.choice.measure import measure_model
from runtime.choice.selector import Constraints
from runtime.config import ModelConfig, from_dict
from runtime.config.source import SourceConfig
from runtime.device.profiles import load_profile
from runtime.engine.backends import discover
from runtime.frames.multisource import lanes
from runtime.frames.pipeline import Active, Pipeline
from runtime.frames.sources import open_source
from runtime.frames.synthetic_source import SyntheticConveyor
from runtime.telemetry.outbox import Outbox


def setup(tmp: Path, latency_ms: float):
    """The bundled model measured on this host (cached), its loaders, the device profile."""
    cfg = from_dict({
        "constraints": {"latency_ms": latency_ms},
        "profiler": {"warmup_runs": 3, "min_runs": 20, "max_runs": 300, "time_budget_s": 0.2,
                     "idle_baseline_s": 0.2},
        "backends": {"enabled": ["onnxruntime"], "threads": [1],
                     "onnxruntime": {"spinning": [False], "include_default": False}},
        "telemetry": {"outbox": {"path": str(tmp / "outbox.db")}},
    })
    device = load_profile(cfg.device.profile)
    meter = detect_meter(Path("/"), device)
    backends = discover(cfg.backends)
    def measure(path: Path, model: ModelConfig):
        return measure_model(path, replace(cfg, model=model), backends, meter, device.name,
                             device.power.active_w_per_core, None, lambda v, e: None,
                             lambda i, n, name: None, Constraints(latency_ms=latency_ms))

    models = {"": measure(bundled(), cfg.model)}
    if (bundled("defects") / "manifest.json").is_file():
        models["defects"] = measure(bundled("defects"), ModelConfig())
        models["defects-tiled"] = measure(bundled("defects"), ModelConfig(tiling=True))
    return cfg, device, meter, models


CASES = {  # name -> sources as (size, model key)
    "2 mixed": ((96, ""), (96, "defects")),
    "2 mixed-tiled": ((96, ""), (192, "defects-tiled")),
}


def run_one(n: int | str, models: dict, cfg, device, tmp: Path, rate: float,
            latency_ms: float, seconds: float, warmup: float) -> dict:
    """N sources (or a mixed CASE) for `seconds` after `warmup`: per-stream p95, box power,
    the choices."""
    spec = CASES[n] if isinstance(n, str) else ((96, ""),) * n
    srcs = [SourceConfig(name=f"cam{i}" if not key else f"det{i}", rate_hz=rate, seed=0,
                         size=size) for i, (size, key) in enumerate(spec)]
    keys = {s.name: key for s, (_, key) in zip(srcs, spec, strict=True)}
    streams = [joint.Stream(s.name, keys[s.name], rate,
                            joint.planned_tiles(s, models[keys[s.name]].manifest))
               for s in srcs]
    targets = joint.targets(latency_ms, streams)
    actives, tops, planned = {}, [], device.power.idle_w
    for key in dict.fromkeys(keys.values()):
        m = models[key]
        rungs, _ = ladder_for(m.profiles, Constraints(latency_ms=targets[key][0]))
        top = rungs[-1]
        backend, variant = m.loaders[top.variant_id]
        actives[key] = Active(len(rungs) - 1, top.variant_id, backend.load(variant),
                              variant.model.input_shape, m.manifest,
                              m.manifest.preprocess.apply, key=key)
        tops.append(top.variant_id)
        planned += top.power_w(sum(s.rate_hz * s.tiles for s in streams if s.model == key))
    outbox = Outbox(cfg.telemetry.outbox)
    p = Pipeline(lanes(srcs, lambda c, i: open_source(c, tmp), lambda c: keys[c.name]),
                 models[""].manifest, outbox.append_many, lambda e: None)
    main = actives.pop("", None) or next(iter(actives.values()))
    p.start(main, actives)
    try:
        time.sleep(warmup)
        for lane in p.lanes:
            lane.e2e.clear()
        c0, t0 = time.process_time(), time.monotonic()
        time.sleep(seconds)
        cpu, wall = time.process_time() - c0, time.monotonic() - t0
        e2e = {lane.name: [ms for _, ms in list(lane.e2e)] for lane in p.lanes}
    finally:
        p.stop()
        outbox.close()
    frames = sum(len(v) for v in e2e.values())
    pw = device.power
    box_w = pw.idle_w + cpu / wall * pw.active_w_per_core
    return {"n": n, "variant": " + ".join(tops),
            "target_ms": min(t for t, _ in targets.values()),
            "p95": {k: float(np.percentile(v, 95)) if v else float("nan")
                    for k, v in e2e.items()},
            "rate_hz": frames / wall, "box_w": box_w,
            "j_per_frame": (box_w - pw.idle_w) / (frames / wall) if frames else float("nan"),
            "planned_w": planned}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--rate", type=float, default=10.0, help="per source, Hz")
    ap.add_argument("--latency-ms", type=float, default=20.0, help="per stream target")
    ap.add_argument("--counts", default="1,2,4")
    ap.add_argument("--no-mixed", action="store_true", help="skip the mixed-model cases")
    a = ap.parse_args()
    counts: list[int | str] = [int(x) for x in a.counts.split(",")]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        t = time.monotonic()
        cfg, device, meter, models = setup(tmp, a.latency_ms)
        if not a.no_mixed and "defects" in models:
            counts += list(CASES)
        print(f"bundled models {', '.join(sorted({x.manifest.name for x in models.values()}))}"
              f": {sum(len(x.profiles) for x in models.values())} variants profiled in "
              f"{time.monotonic() - t:.1f} s; meter {meter.source}; device profile "
              f"{device.name} (idle {device.power.idle_w:g} W, "
              f"{device.power.active_w_per_core:g} W per busy core)")
        # The synthetic parts are rendered once per process: wait for them so rendering
        # (the simulated cameras' cost, not the inspection's) is not in any window.
        warms = [SyntheticConveyor(SourceConfig(seed=0, rate_hz=0, size=size))
                 for size in (96, 192)[:1 if a.no_mixed else 2]]
        for warm in warms:
            while not warm.pool.ready.is_set():  # one part is rendered per part drawn
                warm.read(0.1)
                time.sleep(0.005)
        rows: dict[int | str, list[dict]] = {n: [] for n in counts}
        for r in range(a.runs):
            order = counts[r % len(counts):] + counts[:r % len(counts)]
            for n in order:
                rows[n].append(run_one(n, models, cfg, device, tmp, a.rate, a.latency_ms,
                                       a.seconds, a.warmup))
        for warm in warms:
            warm.close()
    print(f"\n{a.runs} runs x {a.seconds:g} s per count, every source at {a.rate:g} Hz, "
          f"per-stream target p95 <= {a.latency_ms:g} ms (median [min-max] over runs)\n")
    print(f"{'sources':>13}  {'combined':>8}  {'variant target':>14}  {'worst-stream p95':>22}  "
          f"{'all within':>10}  {'box W':>18}  {'mJ/frame':>16}  {'planned W':>9}  variant")

    def spread(xs: list[float], fmt: str) -> str:
        return f"{statistics.median(xs):{fmt}} [{min(xs):{fmt}}-{max(xs):{fmt}}]"

    ok_all = True
    for n in counts:
        rs = rows[n]
        worst = [max(r["p95"].values()) for r in rs]
        within = sum(all(v <= a.latency_ms for v in r["p95"].values()) for r in rs)
        ok_all &= within == len(rs)
        print(f"{n:>13}  {statistics.median(r['rate_hz'] for r in rs):>6.1f}Hz  "
              f"{rs[0]['target_ms']:>11.3g} ms  {spread(worst, '.2f'):>19} ms  "
              f"{within:>5}/{len(rs):<4}  {spread([r['box_w'] for r in rs], '.2f'):>18}  "
              f"{spread([r['j_per_frame'] * 1e3 for r in rs], '.1f'):>16}  "
              f"{statistics.median(r['planned_w'] for r in rs):>9.3f}  {rs[0]['variant']}")
    print("\nper-stream p95 of every run (ms):")
    for n in counts:
        print(f"  {n} sources: " + "; ".join(
            ", ".join(f"{v:.2f}" for v in r["p95"].values()) for r in rows[n]))
    print(f"\ntarget (every stream's p95 within {a.latency_ms:g} ms in every run): "
          f"{'met' if ok_all else 'NOT met'}")
    return 0 if ok_all else 1


if __name__ == "__main__":
    raise SystemExit(main())
