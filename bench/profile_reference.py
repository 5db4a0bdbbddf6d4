"""Profile the ONNX reference architectures shipped in the `onnx` wheel and compare edgerun's
choice with what a user gets from ONNX Runtime's default session options.

    python bench/profile_reference.py [--latency-ms 50] [--time-budget 1.0] [--models ...]

All variants of one model are measured in the same run, one after another, so the printed
ratios compare like with like on a shared, noisy machine. The models carry constant
weights: they are for speed only, not accuracy.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

from power.sensors import detect_meter
from runtime.choice.profiler import Profiler, default_threads, model_files, profile_all
from runtime.choice.report import profile_table
from runtime.choice.selector import Constraints, frontier, select
from runtime.config import BackendsConfig, ModelConfig, ProfilerConfig
from runtime.device.profiles import load_profile
from runtime.engine.backends import discover

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = ("squeezenet", "shufflenet", "resnet50")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", nargs="+", default=MODELS)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--time-budget", type=float, default=1.0, help="seconds per variant")
    ap.add_argument("--device-profile", default="generic-x86")
    args = ap.parse_args()

    device = load_profile(args.device_profile)
    meter = detect_meter(Path("/"), device)
    cfg = BackendsConfig()
    backends = discover(cfg)
    summary = []
    with tempfile.TemporaryDirectory() as cache:
        prof_cfg = ProfilerConfig(time_budget_s=args.time_budget, cache_dir=cache)
        profiler = Profiler(prof_cfg, meter, device.name)
        for name in args.models:
            path = LIGHT / f"light_{name}.onnx"
            print(f"\n== {name}", flush=True)
            models = model_files(ModelConfig(path=str(path)))
            profiles = profile_all(
                backends, models, default_threads(), cfg, profiler, fresh=True,
                progress=lambda i, n, vid: print(f"  [{i}/{n}] {vid}", file=sys.stderr,
                                                 flush=True))
            choice = select(profiles, Constraints(args.latency_ms))
            print(profile_table(profiles, choice, {p.variant_id for p in frontier(profiles)}))
            print("choice:", choice.reason)
            default = next(p for p in profiles
                           if p.engine == "onnxruntime" and p.threads == 0 and p.ok)
            c = choice.profile
            row = (name, c.variant_id, c.energy_mj / default.energy_mj, c.p95_ms / default.p95_ms)
            summary.append(row)
            print(f"chosen vs ORT default: energy x{row[2]:.2f}, p95 latency x{row[3]:.2f}")
    print(f"\n== summary (energy source: {meter.source}; latency target p95 <= "
          f"{args.latency_ms:g} ms)")
    print(f"{'model':<12} {'energy chosen/default':>22} {'p95 chosen/default':>19}  chosen")
    for name, vid, e, lat in summary:
        print(f"{name:<12} {e:>22.2f} {lat:>19.2f}  {vid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
