"""Why no variant ran reaches the operator: a strict xfail for the lead, found by the outside
run of 2026-12-07 (runtime/choice/ is not this helper's to change)."""

from __future__ import annotations

import pytest

from runtime.choice.selector import Constraints, NoVariantError, Profile, select


@pytest.mark.xfail(strict=True, reason=(
    "an OTA bundle whose model outputs NaN failed on the device with every engine saying "
    "`output has NaN or Inf values`, but the model_deploy_failed event, the rollout's reason "
    "and `fleet deploy` told the operator only `deploy failed at profile: none of 22 "
    "variants could be loaded and run` (runtime/choice/selector.py select: the profiles' "
    "errors are left out of NoVariantError; runtime/device/ota.py sends str(e))"))
def test_no_runnable_variant_says_why_they_failed():
    """Every variant failed, all for one reason: the error names it."""
    nan = "onnxruntime cannot run /s/fp32.onnx: output has NaN or Inf values"
    profiles = [Profile(f"m/fp32@e/t{t}", "m", "fp32", "onnxruntime", "CPU", t,
                        status="failed", error=nan) for t in (1, 2)]
    with pytest.raises(NoVariantError) as e:
        select(profiles, Constraints(latency_ms=20.0))
    assert "NaN or Inf" in str(e.value)
