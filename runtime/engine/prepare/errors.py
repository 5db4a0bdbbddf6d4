"""What a preparation step raises: StepError naming the step, Skipped for a step this
model cannot take.
"""

from __future__ import annotations

from runtime.engine.onnx_model import ModelError


class StepError(ModelError):
    """One preparation step failed; `step` names it."""

    def __init__(self, step: str, message: str):
        super().__init__(f"{step}: {message}")
        self.step, self.message = step, message


def as_step(step: str, e: BaseException) -> StepError:
    """`e` as a StepError of `step` (kept as is when it already names its step), with the
    first line of its message: an operator reads one line, not a traceback."""
    if isinstance(e, StepError):
        return e
    first = str(e).splitlines()[0][:300] if str(e).strip() else type(e).__name__
    return StepError(step, first)


class Skipped(StepError):
    """A step this model cannot take (not an error of the model): listed in the manifest's
    `failed` with `"skipped": true` and the reason."""
