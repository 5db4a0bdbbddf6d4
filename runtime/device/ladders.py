"""The ladders (main loop only): each model's rungs and the box's ladder built from their
profiles under the constraints in force, the control settings for them, the rung each model
goes to after a rebuild, and new constraints or a restored config applied. `constraints`
translates the config's [constraints] into the selector's for one model."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from power.control_settings import control_config
from runtime.choice.selector import Constraints, NoVariantError
from runtime.frames.multisource import planned_rate

if TYPE_CHECKING:
    from runtime.config import Config
    from runtime.device.host import PartsHost
    from runtime.device.served_model import ServedModel

log = logging.getLogger("edgerun.daemon")  # one logger for all the daemon's parts


def constraints(d: PartsHost, key: str = "") -> Constraints:
    """The selector's constraints for a model ("" = the [model]'s): the config's
    [constraints] translated, with the model's latency target and, judged end to end, what
    a frame costs around inference."""
    c = d.cfg.constraints
    # with an end-to-end target, inference alone must fit in it: the ladder's lower
    # rungs keep that bound (runtime/choice/selector.py judges the frame end to end,
    # by the box's energy per frame, on what serving has measured so far)
    return replace(c, latency_ms=c.end_to_end_ms or d.plan.target(key)[0],
                   # accelerators ranked at the rate frames are offered, not back to
                   # back (runtime/choice/at_rate.py)
                   rate_hz=d.cfg.governor.rate_hz,
                   frame=d.box.model.frame_costs(d.pipeline, d.box_energy,
                                                 d.device.power.idle_w,
                                                 d.cfg.governor.rate_hz)
                   if c.end_to_end_ms and not key else None)


def check_tiles(d: PartsHost) -> None:
    """A source whose frames cost another number of tiles than planned (a camera's size
    is known only from its frames): re-plan the targets and the box's ladder."""
    why = d.plan.learn_tiles(d.pipeline.lanes)
    if not why:
        return
    log.info("%s: latency targets and the ladders re-planned", why)
    held = d.box.held_down()
    try:
        build(d)
    except NoVariantError as e:
        log.error("re-planning for the tiles failed (%s); keeping the ladders", e)
        return
    after_rebuild(d, why, held)


def build(d: PartsHost) -> None:
    """Each model's rungs from its profiles (scaled to the simulated device when
    simulating, kept current from the running pipeline otherwise), the box's ladder with
    several models (runtime.device.model_ladder), and the control settings for them."""
    d.box.build(lambda key: constraints(d, key), d.device.power if d.sim else None,
                d.energy.live)
    g = d.cfg.governor
    d.ccfg = control_config(
        d.device, g, d.thermal if not d.thermal_disabled else None,
        # several sources: rung powers at their combined rate, so budgets are the box's
        planned_rate(d.plan.streams() if d.cfg.sources else (), g.rate_hz)
        or d.box.control_rungs()[-1].max_rate_hz()
        * (d.cfg.simulator.offered_share if d.sim else 1.0))


def after_rebuild(d: PartsHost, why: str, held: bool) -> None:
    """After the ladder was rebuilt: its top rung when nothing held the device down;
    otherwise the running variant's rung on the new ladder (the cheapest if it is gone):
    a re-profile starts *because* it got hot, and must not run the top rung for a tick
    at 95 °C. The control loop raises it when the budget allows. The same rule for each
    source's own model."""
    for m in d.box.models:
        # what runs: the [model]'s swapped-in session, a source model's pending one too
        a = d.pipeline.active if m is d.box.model else d.pipeline.target_of(m.key)
        top = len(m.rungs) - 1
        i = next((k for k, r in enumerate(m.rungs) if a and r.variant_id == a.variant_id),
                 0) if held else top
        m.current = min(m.current, top)
        move_model(d, m, i, why)
    d.box.build_joint()
    # the indices of the old ladder mean nothing on the new one: no actuation to judge a
    # step from, no excursion to come back from
    d.cstate = replace(d.cstate, hold=replace(d.cstate.hold, rung=d.box.control_current(),
                                              dwell_s=None),
                       actuation=None, excursion=None)


def move_model(d: PartsHost, m: ServedModel, rung: int, why: str) -> None:
    """Switch one model to a rung of its ladder (an event); the [model]'s also updates
    systemd's status and the birth message."""
    if d.switch.move(m, rung, why, d.pipeline) and m is d.box.model:
        d.rebirth()
        d.notify.status(d.status_line())


def set_constraints(d: PartsHost, c: Any, why: str, governor: Any = None) -> None:
    """Rebuild the ladder for new constraints (and governor settings) and go to its top
    (or stay down, see after_rebuild); on NoVariantError everything stays as it was."""
    old = d.cfg
    held = d.box.held_down()
    d.cfg = replace(d.cfg, constraints=c, governor=governor or d.cfg.governor)
    try:
        build(d)
    except NoVariantError as e:
        d.cfg = old
        build(d)
        raise ValueError(str(e)) from e
    d.pipeline.set_slo(*c.in_force())
    after_rebuild(d, why, held)


def restore_config(d: PartsHost, old: Config) -> None:
    """Back to `old` after a reload failed half-way through applying it."""
    d.cfg = old
    try:
        build(d)
        d.pipeline.set_slo(*old.constraints.in_force())
    except Exception:
        log.exception("could not rebuild the ladder of the previous config")
