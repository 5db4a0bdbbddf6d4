"""Why no variant ran reaches the operator. Found by an outside run (2026-12-07): an OTA bundle
whose model outputs NaN failed with every engine saying `output has NaN or Inf values`, and the
model_deploy_failed event, the rollout's reason and `fleet deploy` said only `none of 22
variants could be loaded and run`."""

from __future__ import annotations

import pytest

from runtime.choice.selector import Constraints, NoVariantError, Profile, select


def test_no_runnable_variant_says_why_they_failed():
    """Every variant failed, all for one reason: the error names it."""
    nan = "onnxruntime cannot run /s/fp32.onnx: output has NaN or Inf values"
    profiles = [Profile(f"m/fp32@e/t{t}", "m", "fp32", "onnxruntime", "CPU", t,
                        status="failed", error=nan) for t in (1, 2)]
    with pytest.raises(NoVariantError) as e:
        select(profiles, Constraints(latency_ms=20.0))
    assert "NaN or Inf" in str(e.value)


def test_several_reasons_most_common_first_and_bounded():
    def failed(i: int, why: str) -> Profile:
        return Profile(f"m/v{i}@e/t1", "m", "fp32", "onnxruntime", "CPU", 1, status="failed",
                       error=f"onnxruntime cannot run /s/v{i}.onnx: {why}")
    profiles = ([failed(i, "out of memory") for i in range(3)] + [failed(3, "bad shape")]
                + [failed(4 + i, f"odd {i}") for i in range(3)])
    with pytest.raises(NoVariantError) as e:
        select(profiles, Constraints(latency_ms=20.0))
    said = str(e.value)
    assert said.startswith("none of 7 variants could be loaded and run: 3 x 'out of memory'; ")
    assert "and 2 other reasons" in said and "/s/" not in said
