"""14-day solar benchmark: edgerun's energy-neutral budget vs fixed rate, greedy and an oracle.

    python bench/solar.py [--device solar-node] [--days 14] [--seed 7]

All policies run on the same irradiance trace (clear days and multi-day cloudy spells,
deterministic by seed). fixed = the top rung at the full offered rate; greedy = full power while
the battery is above reserve; oracle = the planner fed the true harvest of the next
`--oracle-days` days (default 3; no forecast margin, buffer or neutrality hedge).
Prints hours below reserve (target 0) and accuracy-weighted inferences relative to the oracle
(target >= 0.9).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).parent))

from governor import PROFILES, device_rungs

from power.closed_loop import simulate
from power.device import load_profile
from power.plant import ambient, solar_trace


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--device", default="solar-node")
    ap.add_argument("--days", type=int, default=14)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--dt", type=float, default=60.0, help="simulation step, s")
    ap.add_argument("--oracle-days", type=int, default=3, help="how far ahead the oracle sees")
    ap.add_argument("--profiles", type=Path, default=PROFILES,
                    help="recorded profiles (edgerun profile --json), as bench/governor.py")
    args = ap.parse_args()

    dev = load_profile(args.device)
    rungs = device_rungs(args.profiles, dev)
    rate, target = rungs[-1].max_rate_hz(), 1.5 * rungs[-1].latency_s
    irr = solar_trace(args.days, args.seed)
    step = 300.0
    slot_wh = (irr * dev.solar.panel_w * step / 3600).reshape(-1, int(3600 / step)).sum(axis=1)
    daily = slot_wh.reshape(args.days, 24).sum(axis=1)
    print(f"{dev.name}: battery {dev.battery.capacity_wh:g} Wh, reserve "
          f"{dev.battery.reserve_frac:.0%}, panel {dev.solar.panel_w:g} W; harvest per day (Wh): "
          + " ".join(f"{d:.0f}" for d in daily))
    amb = ambient("daynight", 20.0, 8.0)
    common = dict(duration_s=args.days * 86400, rate_hz=rate, latency_target_s=target,
                  dt=args.dt, irradiance=irr, battery_frac=0.6)
    runs = {
        "fixed": simulate(dev, rungs, amb, "step_wise", energy_policy="fixed", **common),
        "greedy": simulate(dev, rungs, amb, "step_wise", energy_policy="greedy", **common),
        "edgerun": simulate(dev, rungs, amb, "step_wise", energy_policy="energy", **common),
        "oracle": simulate(dev, rungs, amb, "step_wise", energy_policy="oracle",
                           oracle_forecast=slot_wh, oracle_days=args.oracle_days, **common),
    }
    oracle = runs["oracle"].good_weighted
    print(f"{'policy':<10}{'h below reserve':>16}{'good x acc':>14}{'vs oracle':>11}"
          f"{'mean acc':>10}")
    for name, r in runs.items():
        print(f"{name:<10}{r.below_reserve_h:>16.1f}{r.good_weighted:>14.0f}"
              f"{r.good_weighted / oracle:>11.2f}{r.mean_accuracy:>10.3f}")
    e = runs["edgerun"]
    met = e.below_reserve_h == 0 and e.good_weighted >= 0.9 * oracle
    print(f"targets (0 h below reserve, >= 0.9x oracle): {'met' if met else 'NOT met'}")
    return 0 if np.isfinite(oracle) else 1


if __name__ == "__main__":
    sys.exit(main())
