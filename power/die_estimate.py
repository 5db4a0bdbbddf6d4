"""A state estimate of the die temperature: the plant model's prediction (the two-node RC of
power/plant.py, driven by the power the control step knows it commanded) fused with the
noisy sensor reading by a small Kalman filter. Pure; table-tested in
tests/power/test_die_estimate.py; power/control.py acts on it.

Why: a 1 °C-noisy sensor read at 1 Hz, filtered by a median of five, still wanders by about
half a degree; where the die rides its trip for hours (rpi5 in the afternoon sun) each
excursion of the median over the trip was a step down, and a governor that may release only
a hysteresis under the trip never undid it. The model knows what the power does to
the die; only what it does not know (the ambient, the model's own error, a load it does not
see) has to come from the readings, and that changes slowly, so it can be averaged over many.

The state:

- `lag_c`: the die over the case, P x r_die_case lagged by the die's own time constant
  (seconds): deterministic, from the power alone (the case's heat capacity is ~30x the
  die's, so the die follows the case without feeding back on it);
- `case_c` and `amb_c`, the case and an *effective* ambient (the ambient plus whatever the
  model gets wrong: a resistance or a power a little off is absorbed there), filtered:
  case' = amb + q (case - amb) + (lag / r_die_case) r_case_amb (1 - q), q = e^(-dt/tau_case);
  the ambient a random walk. The reading measures case + lag.

Safety of the filter itself:

- **Innovation gate**: a reading more than `gate` sigmas from the prediction is not fused
  (a single wild or 1 °C-unlucky reading moves nothing).
- **Bias detection**: an exponentially weighted mean of the (gated-clipped) innovations; when
  it leaves its no-bias band (3 sigmas of that mean) the case's variance is widened to it, so
  a real rise the model did not predict (an unseen load, a door opening) is taken within a
  few readings, and a reading that moves for good (a sensor stuck at another value) is
  followed within about ten; `follow_after` (3) gated readings in a row on the same side
  restart the case from the reading at once, as the median of five would follow after three.
  Two wild readings in a row are still gated.
- **Noise**: the sensor's sigma is estimated from the readings themselves (the median
  absolute difference of successive model-corrected readings, Gaussian-scaled), never below
  `min_sigma_c`: no setting to get wrong, and a clean sensor is followed closely.
- A missing reading only predicts: the core's hold still decides when it fails safe.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class DieModel:
    """The device's two-node thermal model (power/device.py ThermalModel's figures)."""

    r_die_case: float  # K/W
    die_tau_s: float  # r_die_case x c_die
    r_case_amb: float  # K/W
    case_tau_s: float  # r_case_amb x c_case


@dataclass(frozen=True)
class EstimatorConfig:
    """How the filter weighs the model against the readings (module doc)."""

    q_case: float = 1e-5  # °C² per s: the case's model error
    q_amb: float = 1e-4  # °C² per s: how fast the effective ambient may wander
    gate: float = 3.0  # sigmas: a reading further from the prediction is not fused
    bias_alpha: float = 0.1  # weight of one innovation in the bias mean (~10 readings)
    bias_band: float = 4.0  # sigmas of that mean: beyond, the readings have moved
    min_sigma_c: float = 0.02  # the noise floor (millidegree files, model error)
    noise_window: int = 60  # successive differences the noise estimate is the median of
    # readings at most this far apart feed the noise estimate: further apart, the case's own
    # move (0.5 °C/min is fast) would pass for noise. Not 2 s, the old bound: a governor
    # ticking every 5 s (the solar node) never learnt its sensor was clean, trusted the model
    # as if it read 1 °C of noise and lagged a rise the model did not know by ~0.3 °C
    noise_max_dt_s: float = 10.0
    restart_after_s: float = 600.0  # a gap this long: start again from the reading
    follow_after: int = 3  # gated readings in a row on one side: start again from them


@dataclass(frozen=True)
class DieEstimate:
    """The filter's state (None before the first reading)."""

    t: float | None = None
    lag_c: float = 0.0
    case_c: float = 0.0
    amb_c: float = 0.0
    p_cc: float = 0.0  # covariance of (case, amb)
    p_ca: float = 0.0
    p_aa: float = 0.0
    bias: float = 0.0  # the weighted mean innovation
    last_z: float | None = None  # the last model-corrected reading (for the noise estimate)
    diffs: tuple[float, ...] = ()  # recent |differences| of successive corrected readings
    outliers: int = 0  # gated readings in a row: > 0 above the prediction, < 0 below

    @property
    def temp_c(self) -> float | None:
        """The estimated die temperature (None before the first reading)."""
        return None if self.t is None else self.case_c + self.lag_c

    def sigma_c(self, cfg: EstimatorConfig) -> float:
        """The sensor noise estimated from the readings (°C, at least cfg.min_sigma_c)."""
        if len(self.diffs) < 5:
            return max(cfg.min_sigma_c, 1.0)  # no evidence yet: trust the model more
        return max(cfg.min_sigma_c, statistics.median(self.diffs) / (0.6745 * math.sqrt(2)))

    def sd_c(self) -> float:
        """The estimate's own standard deviation (°C)."""
        return math.sqrt(max(self.p_cc, 0.0))


def _start(t: float, power_w: float, reading: float, m: DieModel) -> DieEstimate:
    """From one reading, taken at rest: the die over the case by the power, the case at
    steady state over the (unknown, widely uncertain) ambient."""
    lag = power_w * m.r_die_case
    case = reading - lag
    return DieEstimate(t=t, lag_c=lag, case_c=case, amb_c=case - power_w * m.r_case_amb,
                       p_cc=1.0, p_ca=0.0, p_aa=100.0, last_z=case)


def update(est: DieEstimate, t: float, power_w: float, reading: float | None, m: DieModel,
           cfg: EstimatorConfig | None = None) -> DieEstimate:
    """The estimate at device time `t`, after `power_w` (what the box drew since the last
    update) and `reading` (None: unreadable; the model alone carries it)."""
    cfg = cfg or EstimatorConfig()
    if est.t is None or t - est.t > cfg.restart_after_s or t < est.t:
        return _start(t, power_w, reading, m) if reading is not None else DieEstimate()
    dt = t - est.t
    # predict: the die's lag (exact for constant power), then the case towards the ambient
    # plus the heat the lag passes on, averaged over the step
    steady = power_w * m.r_die_case
    kd = math.exp(-dt / m.die_tau_s) if m.die_tau_s > 0 else 0.0
    lag = steady + (est.lag_c - steady) * kd
    mean_lag = steady + ((est.lag_c - steady) * m.die_tau_s / dt * (1 - kd) if dt > 0 else
                         est.lag_c - steady)
    q = math.exp(-dt / m.case_tau_s)
    heat = mean_lag / m.r_die_case * m.r_case_amb * (1 - q) if m.r_die_case > 0 else \
        power_w * m.r_case_amb * (1 - q)
    case = q * est.case_c + (1 - q) * est.amb_c + heat
    # P' = F P F' + Q, F = [[q, 1 - q], [0, 1]]
    p_cc = (q * q * est.p_cc + 2 * q * (1 - q) * est.p_ca + (1 - q) ** 2 * est.p_aa
            + cfg.q_case * dt)
    p_ca = q * est.p_ca + (1 - q) * est.p_aa
    p_aa = est.p_aa + cfg.q_amb * dt
    est = replace(est, t=t, lag_c=lag, case_c=case, p_cc=p_cc, p_ca=p_ca, p_aa=p_aa)
    if reading is None:
        return replace(est, last_z=None)
    z = reading - lag
    diffs = est.diffs
    if est.last_z is not None and dt <= cfg.noise_max_dt_s:
        diffs = (*diffs, abs(z - est.last_z))[-cfg.noise_window:]
    est = replace(est, last_z=z, diffs=diffs)
    r = est.sigma_c(cfg) ** 2
    nu = z - est.case_c
    s = est.p_cc + r
    clip = cfg.gate * math.sqrt(s)
    bias = (1 - cfg.bias_alpha) * est.bias + cfg.bias_alpha * max(-clip, min(clip, nu))
    band = cfg.bias_band * math.sqrt(s * cfg.bias_alpha / (2 - cfg.bias_alpha))
    if abs(bias) > band:  # the readings have moved away from the model: widen, follow
        est = replace(est, p_cc=max(est.p_cc, bias * bias + est.p_cc), p_aa=max(
            est.p_aa, bias * bias))
        s = est.p_cc + r
    est = replace(est, bias=bias)
    if nu * nu > cfg.gate ** 2 * s:
        # an outlier: not fused, unless it is the `follow_after`-th in a row on the same
        # side: then the readings have moved (as the median of five would say after three)
        run = est.outliers + 1 if nu > 0 and est.outliers >= 0 else (
            est.outliers - 1 if nu < 0 and est.outliers <= 0 else (1 if nu > 0 else -1))
        if abs(run) < cfg.follow_after:
            return replace(est, outliers=run)
        return replace(est, case_c=z, p_cc=r, p_ca=0.0, p_aa=max(est.p_aa, nu * nu),
                       bias=0.0, outliers=0)
    est = replace(est, outliers=0)
    k_c, k_a = est.p_cc / s, est.p_ca / s
    return replace(est, case_c=est.case_c + k_c * nu, amb_c=est.amb_c + k_a * nu,
                   p_cc=(1 - k_c) * est.p_cc, p_ca=(1 - k_c) * est.p_ca,
                   p_aa=est.p_aa - k_a * est.p_ca)
