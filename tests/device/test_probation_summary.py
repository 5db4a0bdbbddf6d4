"""The line a passed probation logs (runtime/device/ota.py probation_summary), table-tested.
Outside run 2026-12-07: it logged the raw dict, `{'frames': 102, 'errors': 0, 'p95_ms':
3.4899341473646905, ..., 'energy_mj': None, ...}`."""

from __future__ import annotations

import pytest

from runtime.device.ota import probation_summary


@pytest.mark.parametrize("kpis, says", [
    ({"frames": 102, "errors": 0, "p95_ms": 3.4899341473646905, "target_ms": 20.0,
      "energy_mj": None, "shadow_compared": 20, "agreement": 1.0},
     "102 frames, 0 errors, p95 3.49 ms (target 20 ms), agreement 100% on 20 shadow "
     "frames, energy not measured"),
    ({"frames": 200, "errors": 2, "p95_ms": 12.0, "target_ms": 20.0, "energy_mj": 0.4213,
      "shadow_compared": 0, "agreement": None},
     "200 frames, 2 errors, p95 12.00 ms (target 20 ms), no shadow comparison, energy "
     "0.421 mJ an inference"),
    ({"frames": 100, "errors": 0, "p95_ms": None, "target_ms": 20.0, "energy_mj": None,
      "shadow_compared": 0, "agreement": None},
     "100 frames, 0 errors, p95 unknown (target 20 ms), no shadow comparison, energy not "
     "measured"),
])
def test_probation_summary_is_one_readable_line(kpis, says):
    assert probation_summary(kpis) == says
