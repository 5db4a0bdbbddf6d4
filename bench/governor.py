"""Closed-loop governor benchmark: simulated devices x ambient scenarios, faster than real time.

    python bench/governor.py [--device rpi5 generic-x86 fanless-box | path/to/device.toml]
                             [--scenario cool hot sun | kind:base_c:swing_c]
                             [--hours 6] [--ladder models/inspection | recorded.json] [--plot DIR]

For each device x scenario it runs, side by side on the same simulated day:
  A kernel-only  the most accurate rung at full rate; the simulated kernel throttles (DVFS)
  B cheapest     the lowest-power rung always
  step_wise      edgerun's step_wise governor
  power_alloc    edgerun's power_allocator (IPA) governor
and prints critical trips, minutes throttled, good inferences (within the latency target)
weighted by accuracy, mean accuracy, energy, and rung changes. Frames are offered as fast as
the top rung can take them on all cores; the latency target is 1.5x the top rung's latency.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from power.closed_loop import THERMAL_POLICIES, RunResult, simulate
from power.device import load_profile
from power.plant import SCENARIOS, ambient
from runtime.ladder import ladder, on_device
from runtime.selector import Profile

HERE = Path(__file__).parent
LABEL = {"kernel": "A kernel-only", "cheapest": "B cheapest", "step_wise": "step_wise",
         "power_allocator": "power_alloc"}


def measure_model(model_dir: Path) -> list[Profile]:
    """Profile every manifest variant on ORT and OpenVINO (1 thread) on this machine; energy is
    replaced by CPU time so the device profile's power model can scale it."""
    from dataclasses import replace

    from power.device import load_profile as load_dev
    from power.sensors import detect_meter
    from runtime.backends import discover
    from runtime.config import BackendsConfig, OnnxRuntimeConfig, OpenVinoConfig, ProfilerConfig
    from runtime.manifest import load_manifest, model_files
    from runtime.profiler import Profiler, plan

    cfg = BackendsConfig(enabled=("onnxruntime", "openvino"), threads=(1,),
                         onnxruntime=OnnxRuntimeConfig(spinning=(False,), include_default=False),
                         openvino=OpenVinoConfig(precision_hints=("f32",)))
    dev = load_dev("generic-x86")
    prof = Profiler(ProfilerConfig(time_budget_s=0.5, cache_dir="/tmp/edgerun-bench-governor"),
                    detect_meter(Path("/"), dev), dev.name)
    forms = model_files(load_manifest(model_dir))
    out = [prof.profile(b, d, v) for b, d, v in plan(discover(cfg), forms, (1,), cfg)]
    return [replace(p, energy_mj=p.cpu_ms) for p in out if p.ok]


def load_ladder(path: Path):
    """Frontier rungs and their CPU-seconds per inference, from a model directory (measured
    now) or a recorded-profiles JSON."""
    if path.is_dir():
        profiles = measure_model(path)
    else:
        doc = json.loads(path.read_text())
        profiles = [Profile(v["variant_id"], v["variant_id"].split("/")[0], v["precision"],
                            "rec", "CPU", 1, p50_ms=v["p95_ms"], p95_ms=v["p95_ms"],
                            p99_ms=v["p95_ms"], energy_mj=v["cpu_ms"], cpu_ms=v["cpu_ms"],
                            accuracy=v["accuracy"])
                    for v in doc["variants"]]
    rungs = ladder(profiles)
    cpu = {p.variant_id: p.cpu_ms / 1e3 for p in profiles}
    return rungs, [cpu[r.variant_id] for r in rungs]


def scenario(name: str):
    """A named scenario or kind:base:swing."""
    if name in SCENARIOS:
        return ambient(*SCENARIOS[name])
    kind, base, swing = name.split(":")
    return ambient(kind, float(base), float(swing))


def plot(path: Path, title: str, runs: dict[str, RunResult], trips: dict[str, float]) -> None:
    """One PNG: temperature with trip lines, rung, delivered rate, for every policy."""
    import cv2

    w, panel, pad = 1200, 220, 50
    colors = {"kernel": (40, 40, 220), "cheapest": (150, 150, 150),
              "step_wise": (200, 120, 0), "power_allocator": (0, 160, 0)}
    img = np.full((pad + 3 * (panel + pad), w, 3), 255, np.uint8)
    cv2.putText(img, title, (10, 30), cv2.FONT_HERSHEY_SIMPLEX, 0.7, (0, 0, 0), 2)
    series = [("temp_c", "die temperature C"), ("rung", "rung (0 = cheapest)"),
              ("rate_hz", "inferences/s delivered")]
    for k, (key, label) in enumerate(series):
        top = pad + k * (panel + pad)
        vals = np.concatenate([r.trace[key] for r in runs.values()] +
                              ([list(trips.values())] if key == "temp_c" else []))
        lo, hi = float(np.nanmin(vals)), float(np.nanmax(vals))
        hi = hi if hi > lo else lo + 1

        def y(v, lo=lo, hi=hi, top=top):
            return int(top + panel - (v - lo) / (hi - lo) * panel)

        cv2.rectangle(img, (pad, top), (w - 10, top + panel), (0, 0, 0), 1)
        cv2.putText(img, f"{label}  [{lo:.1f} .. {hi:.1f}]", (pad, top - 8),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1)
        if key == "temp_c":
            for name, temp in trips.items():
                cv2.line(img, (pad, y(temp)), (w - 10, y(temp)), (0, 0, 255), 1)
                cv2.putText(img, name, (w - 90, y(temp) - 3), cv2.FONT_HERSHEY_SIMPLEX, 0.4,
                            (0, 0, 255), 1)
        for policy, r in runs.items():
            v = np.asarray(r.trace[key])
            xs = np.linspace(pad, w - 10, len(v)).astype(int)
            pts = np.stack([xs, [y(a) for a in v]], axis=1).astype(np.int32)
            cv2.polylines(img, [pts], False, colors[policy], 1)
    for i, policy in enumerate(runs):
        cv2.putText(img, LABEL[policy], (pad + 170 * i, img.shape[0] - 12),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.55, colors[policy], 2)
    cv2.imwrite(str(path), img)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", nargs="+", default=["rpi5", "generic-x86", "fanless-box"])
    ap.add_argument("--scenario", nargs="+", default=["cool", "hot", "sun"])
    ap.add_argument("--hours", type=float, default=6.0)
    ap.add_argument("--start-hour", type=float, default=8.0, help="time of day the run starts")
    ap.add_argument("--ladder", type=Path, default=HERE.parent / "models" / "inspection",
                    help="a model directory (profiled now) or recorded profiles (JSON, e.g. "
                    "bench/data/recorded_ladder.json)")
    ap.add_argument("--plot", type=Path, help="write one PNG per device x scenario here")
    args = ap.parse_args()

    base_rungs, cpu = load_ladder(args.ladder)
    print(f"ladder ({args.ladder.name}): " + " < ".join(
        f"{r.variant_id.split('@')[0]} ({r.accuracy:.3f}, {c * 1e3:.3f} ms CPU)"
        for r, c in zip(base_rungs, cpu, strict=True)))
    if args.plot:
        args.plot.mkdir(parents=True, exist_ok=True)
    head = (f"{'device':<18}{'scenario':<9}{'policy':<15}{'crit':>5}{'thr min':>9}"
            f"{'good x acc':>12}{'vs A':>7}{'mean acc':>9}{'Wh':>8}{'changes/h':>10}")
    print(head)
    ok = True
    for dev_name in args.device:
        dev = load_profile(dev_name)
        rungs = on_device(base_rungs, cpu, dev.power)
        rate, target = rungs[-1].max_rate_hz(), 1.5 * rungs[-1].latency_s
        for scen in args.scenario:
            amb = scenario(scen)
            runs = {p: simulate(dev, rungs, amb, p, args.hours * 3600, rate, target,
                                t0=args.start_hour * 3600, record_every=10 if args.plot else 0)
                    for p in THERMAL_POLICIES}
            a = runs["kernel"]
            for p, r in runs.items():
                ratio = r.good_weighted / a.good_weighted if a.good_weighted else float("inf")
                print(f"{dev.name:<18}{scen:<9}{LABEL[p]:<15}{r.critical_trips:>5}"
                      f"{r.throttled_min:>9.1f}{r.good_weighted:>12.0f}{ratio:>7.2f}"
                      f"{r.mean_accuracy:>9.3f}{r.energy_wh:>8.1f}"
                      f"{r.rung_changes / args.hours:>10.1f}")
                if p in ("step_wise", "power_allocator") and (a.critical_trips or a.throttled_min):
                    ok &= r.critical_trips == 0 and r.throttled_min == 0 and ratio >= 1.2
            if args.plot:
                th = dev.thermal
                trips = {t.type: t.temp_c for t in th.trips}
                out = args.plot / f"{dev.name}-{scen}.png"
                plot(out, f"{dev.name} / {scen} / {args.hours:g} h", runs, trips)
                print(f"  plot: {out}")
    print("targets (no trips or throttling, >= 1.2x A's accuracy-weighted good inferences "
          f"where A throttles): {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
