"""A cold start's profiling keeps at most one engine session alive at a time.

A cold `edgerun serve` (no profile cache) loads every variant of every engine it can run:
the accuracy of engine-lowered precisions (runtime/choice/hint_accuracy.py), the quick round,
the refinement. Its memory peak (docs/benchmarks.md, "Cold start memory") is the engines'
libraries, loaded once, plus one session: a session held after its measurement (a list of
results keeping it, a cache of loaded variants) would add one per variant, 114 of them for
the bundled model. Counted here on the real engines by weak references to every session a
backend hands out, not by timing or RSS (which move with the host).
"""

from __future__ import annotations

import gc
import weakref

import pytest

from power.sensors import EstimatedMeter
from runtime.choice.measure import measure_first
from runtime.choice.selector import Constraints
from runtime.config import from_dict
from runtime.engine.backends import discover


class LiveSessions:
    """Wraps every backend's `load` to count the sessions still alive when the next loads."""

    def __init__(self, backends):
        self.refs: list[weakref.ref] = []
        self.most = 0  # sessions alive at once, the one being loaded included
        self.engines: set[str] = set()
        for b in backends:
            b.load = self._counting(b.load, b.name)

    def alive(self) -> int:
        return sum(1 for r in self.refs if r() is not None)

    def _counting(self, load, name):
        def counted(variant, *args, **kwargs):
            session = load(variant, *args, **kwargs)
            self.refs.append(weakref.ref(session))
            self.engines.add(name)
            self.most = max(self.most, self.alive())
            return session

        return counted


def test_a_cold_start_holds_one_engine_session_at_a_time(tmp_path):
    from models import bundled

    if not (bundled() / "manifest.json").exists():
        pytest.skip("bundled model not built")
    cfg = from_dict({
        # every engine the product enables by default, one thread: each engine's variants and
        # its lowered precisions (measured on the eval images) are loaded in turn
        "backends": {"threads": [1]},
        "profiler": {"idle_baseline_s": 0.05, "cache_dir": str(tmp_path / "c"),
                     "warmup_runs": 1, "min_runs": 3, "max_runs": 20, "time_budget_s": 0.01,
                     "first_decision_s": 0}})
    backends = discover(cfg.backends)
    live = LiveSessions(backends)
    _first, rest = measure_first(bundled(), cfg, backends, EstimatedMeter(5.0, 2.0),
                                 "generic-x86", 2.0, None, lambda *a: None, lambda *a: None,
                                 Constraints(1000))
    assert rest is not None
    final = rest(None)
    gc.collect()
    # the real engines were all loaded (OpenCL where a driver is installed), many times
    assert {"onnxruntime", "openvino", "opencv"} <= live.engines, live.engines
    assert len(live.refs) > len(final.profiles) / 2
    assert live.most == 1, f"{live.most} sessions alive at once"
    assert live.alive() == 0  # and none after: the daemon loads the chosen one itself
