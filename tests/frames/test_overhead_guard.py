"""CI regression guard on the frame path's overhead (issue 23): a short bench/overhead.py.

`edgerun serve` on PNG frames from a watched folder, every result persisted and published,
against a hand-written decode + preprocess + infer loop on the same files, side by side in one
run (three rounds, each the daemon's block then the hand loop's). The frame path went from
1.13x the hand loop to 0.35-0.59x over three rounds with nothing to notice it; this fails
the next such change:

- throughput, best of 3 rounds >= 0.7x the hand loop. Measured (2026-12-01, bundled model,
  this test's size): best of 3 0.82-1.33x at load 1.3-2.3, 1.26-3.17x at load 6-23 (a loaded
  machine gives the three-threaded daemon more of the CPU than a one-thread loop, which
  flatters it); single rounds read as low as 0.51x when quiet. 226be58's regression read
  0.35-0.59x on the full bench. Best of 3, because a round can lose to another process
  taking the CPU;
- CPU time per frame, median of 3 <= 2.3x the hand loop's. It depends less on how busy the
  machine is than throughput: medians 1.46-1.93x at load 1.3-2.3, 1.26-1.51x at load 6-23
  (the daemon also persists, publishes and remembers every file; quiet reads higher,
  perhaps because with nothing waiting each frame is committed alone: not measured apart).
  A regression of 0.4 ms of CPU a frame, injected on purpose, read a median of 2.31x at
  load 18 (1.73-2.71x by round), and more when quiet. One round in three can read far off,
  so the median is what this one judges;
- idle RSS <= 130 MB (issue 23's target; 122-124 MB measured, 157 MB at the regression);
- the cold start's peak (VmHWM of the first start, no profile cache, through its background
  refinement) <= 142 MB: what a 1 GB box meets on first boot and after every model update.
  Measured 2026-12-07 at this test's settings (one round of 60 frames): 131.5, 132.0, 131.6
  MB at load 1.4-1.9 (the warm start 123-124); with the profiler keeping every session it
  measured instead of closing it (a regression injected on purpose), 147.9. ONNX Runtime
  alone here, as in the rest of this guard; bench/cold_start.py measures every engine
  (docs/benchmarks.md, "Cold start memory"), and tests/choice/test_profiler_memory.py
  counts the sessions themselves.

Re-measured 2026-12-03 after preprocessing got 4-7x cheaper on both sides (the hand loop's CPU
a frame fell from ~0.8 to ~0.6 ms, so the same absolute daemon overhead is a larger ratio):
CPU medians 1.28x, 1.30x, 1.45x and best throughput 1.19-1.33x quiet (load 0.5-1.0), and the
guard passes beside another test file. p95 is not guarded here: beside two CPU hogs the
daemon's one-at-a-time p95 read 2.8-4.3x the hand loop's (quiet: 1.0-1.1x), so a bound loose
enough for CI's two workers would not catch the regressions it is for; bench/overhead.py
prints it.

On this shared 2-core machine the guard catches regressions of the size issue 23 found
(2-3x a frame), not 20 %: 0.8x / 1.8x would have failed on a quiet run here (a CPU median of
1.93x). The bench itself (bench/overhead.py, 1,000-frame rounds) prints the finer figures.

Deselect it only on purpose: `-m "not overhead_guard"` or EDGERUN_SKIP_OVERHEAD_GUARD=1
(the skip and its reason are then in the summary). ~40 s.
"""

from __future__ import annotations

import os

import pytest
from support.benches import load_bench

MIN_THROUGHPUT = 0.7
MAX_CPU = 2.3
MAX_IDLE_RSS_MB = 130.0
MAX_COLD_PEAK_MB = 142.0


def _bench():
    return load_bench("overhead")


@pytest.mark.overhead_guard
def test_the_frame_path_costs_no_more_than_a_hand_written_loop():
    if os.environ.get("EDGERUN_SKIP_OVERHEAD_GUARD") == "1":
        pytest.skip("overhead guard skipped on purpose (EDGERUN_SKIP_OVERHEAD_GUARD=1)")
    f = _bench().measure(n_bulk=400, n_single=0, rounds=3, budget_s=0.1)
    said = (f"throughput {[round(x, 2) for x in f.fps_ratios]}, CPU per frame "
            f"{[round(x, 2) for x in f.cpu_ratios]} x the hand loop; idle RSS "
            f"{f.idle_rss:.0f} MB; start peak {f.cold_peak:.0f} MB cold, {f.warm_peak:.0f} MB "
            f"warm; load {[round(x, 1) for x in f.load]}")
    print(said)
    assert max(f.fps_ratios) >= MIN_THROUGHPUT, said
    assert sorted(f.cpu_ratios)[len(f.cpu_ratios) // 2] <= MAX_CPU, said
    assert f.idle_rss <= MAX_IDLE_RSS_MB, said
    assert f.cold_peak <= MAX_COLD_PEAK_MB, said
