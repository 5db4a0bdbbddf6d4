"""The daemon's answer to each verified command (the publisher already replied "accepted"):
one handler per command name, in a table (`HANDLERS`); and to SIGHUP (`reload`).

A command not in the table (`ping`, `rebirth`: the publisher answers those itself) is only
recorded as applied. After any applied command the settings ones are kept across restarts and
reloads (runtime/device/operator_state.py), and a `command_applied` event says so.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from runtime.config import ConfigError, load
from runtime.wire.commands import Command, CommandRefused, check_args, loggable

log = logging.getLogger("edgerun.daemon")

# Commands after which a variant switch in backoff is tried again at once: the ones that may
# have mended what would not load (files measured or replaced). Any command did, so a stream of
# settings commands (a dashboard slider, a script) loaded the broken file, and said so, at each.
RETRY_COMMANDS = frozenset({"reprofile", "deploy", "choose_model"})
RESTART_SECTIONS = ("device", "model", "source", "sources", "telemetry", "simulator", "daemon",
                    "backends", "profiler", "results", "local_api", "homeassistant", "sleep",
                    "models")  # what a reload cannot apply: their changes need a restart


class CommandHost(Protocol):
    """What the handlers need of the daemon."""

    cfg: Any  # runtime.config.Config
    ota: Any  # runtime.device.ota.DeviceOta
    operator: Any  # runtime.device.operator_state.OperatorState
    cstate: Any  # power.control.ControlState
    box: Any  # runtime.device.model_ladder.Box: its `model`, the [model] section's, now served
    plan: Any  # runtime.device.source_plan.SourcePlan: `model_used()`, does a source run it
    switch: Any  # runtime.device.rung_switch.RungSwitch: `retry_now()` after a command

    def set_constraints(self, c: Any, why: str = "new constraints",
                        governor: Any = None) -> None:
        """Rebuild the ladders for new constraints (ValueError: none fits)."""

    def reprofile_now(self, why: str) -> None:
        """Measure the [model] again now, whenever the last re-profile was."""

    def load_in_background(self, path: Path, fresh: bool, why: str,
                           wait: bool = False) -> None:
        """Profile `path` in the background and install it."""

    def restore_config(self, old: Any) -> None:
        """Back to config `old` after a reload failed half-way through applying it."""

    def event(self, type_: str, severity: str = "info", **fields: Any) -> None:
        """Record an event for the operator."""


def _constraint(field: str, arg: str) -> Callable[[CommandHost, Command], bool]:
    def apply(d: CommandHost, cmd: Command) -> bool:
        d.set_constraints(replace(d.cfg.constraints, **{field: cmd.args[arg]}))
        return True

    apply.__doc__ = f"`[constraints] {field}` from the command's `{arg}`."
    return apply


def set_rate(d: CommandHost, cmd: Command) -> bool:
    """The operator's rate cap (0 = none); kept across restarts."""
    d.operator.set_rate(cmd.args["fps"], d.cstate.energy)
    return True


def reprofile(d: CommandHost, cmd: Command) -> bool:
    """Measure every variant again, now."""
    d.reprofile_now("operator command")
    return True


def _swaps_model(d: CommandHost, cmd: Command) -> None:
    """deploy and choose_model swap the [model] section's model: refused when no source
    uses it (it would change nothing)."""
    if not d.plan.model_used():
        raise ValueError(f"{cmd.name} swaps the [model] section's model, and no source uses "
                         "it: every [[sources]] entry names its own model, which cannot be "
                         "swapped over the air yet (change the config and restart)")


def deploy(d: CommandHost, cmd: Command) -> bool:
    """Download, verify and profile a bundle; the main loop swaps it in (runtime/device/ota.py)."""
    _swaps_model(d, cmd)
    d.ota.deploy(cmd)
    return True


def choose_model(d: CommandHost, cmd: Command) -> bool:
    """A version in the model store (profiled, swapped, on probation), or else a model
    directory next to the configured one; False (not applied) when there is none."""
    _swaps_model(d, cmd)
    if d.ota.choose(cmd):
        return True
    target = (d.ota.configured or d.box.model.manifest.root).parent / cmd.args["name"]
    if not (target / "manifest.json").is_file():
        d.event("command_failed", "warning", command=cmd.name,
                error=f"{target}: no model directory with a manifest")
        return False
    d.load_in_background(target, False, f"model {cmd.args['name']} chosen", wait=True)
    return True


def set_latency_target(d: CommandHost, cmd: Command) -> bool:
    """The latency target in force from the command's `ms` (Constraints.with_target):
    `[constraints] end_to_end_ms` when the device judges frames end to end, else
    `latency_ms` (changing the inference bound there would change nothing the operator
    sees)."""
    d.set_constraints(d.cfg.constraints.with_target(cmd.args["ms"]))
    return True


HANDLERS: dict[str, Callable[[CommandHost, Command], bool]] = {
    "set_latency_target": set_latency_target,
    "set_accuracy_floor": _constraint("accuracy_floor", "value"),
    "set_rate": set_rate,
    "reprofile": reprofile,
    "deploy": deploy,
    "choose_model": choose_model,
}


def handle(d: CommandHost, cmd: Command) -> None:
    """Apply a verified command; raises (ValueError) when it cannot be applied."""
    # the one gate (runtime/wire/commands.check_args), again here: no handler sees a command
    # whose arguments it did not pass, whoever made the Command
    try:
        cmd = replace(cmd, args=check_args(cmd.name, cmd.args))
    except CommandRefused as e:
        raise ValueError(str(e)) from None
    log.info("command %s %s", cmd.name, loggable(cmd.args))
    if cmd.name in RETRY_COMMANDS:  # a failing switch is tried again at once
        d.switch.retry_now()
    handler = HANDLERS.get(cmd.name)
    if handler is not None and not handler(d, cmd):
        return
    d.operator.record(cmd.name, cmd.args)  # settings: kept across restarts and reloads
    d.event("command_applied", "info", command=cmd.name,
            args=loggable(cmd.args), id=cmd.id)


def drain(d: CommandHost, waiting: queue.Queue[Command]) -> None:
    """Apply every command waiting (the main loop's turn); one that fails is logged and
    reported (`command_failed`): a command must never take the daemon down."""
    while True:
        try:
            cmd = waiting.get_nowait()
        except queue.Empty:
            return
        try:
            handle(d, cmd)
        except Exception as e:
            log.error("command %s failed: %s", cmd.name, e)
            d.event("command_failed", "warning", command=cmd.name, error=str(e)[:300])


def reload(d: CommandHost, path: Path, print_results: bool) -> None:
    """SIGHUP: re-read the config at `path` and apply constraints and governor (the operator's
    settings on top; `print_results`: `serve --print` outlives reloads, as settings do). Any
    failure, of any kind, is logged and reported (`config_reload_failed`) and the old config
    stays."""
    old = d.cfg
    d.switch.retry_now()  # a new config: a failing switch is tried again at once
    try:
        new = load(path)
        new = replace(new, constraints=d.operator.constraints(new.constraints))
        if print_results:
            new = replace(new, results=replace(new.results, print=True))
        restart = [k for k in RESTART_SECTIONS if getattr(new, k) != getattr(old, k)]
        d.set_constraints(new.constraints, "config reloaded", new.governor)
    except Exception as e:  # ConfigError, NoVariantError (as ValueError), or anything else
        if d.cfg is not old:  # failed half-way through applying: back to the old one
            d.restore_config(old)
        expected = isinstance(e, ConfigError | ValueError)
        why = str(e) if expected else f"{type(e).__name__}: {e}"
        log.error("config reload refused, still running with the previous config: %s", why,
                  exc_info=not expected)  # an unexpected one is a bug: keep its traceback
        d.event("config_reload_failed", "warning", path=str(path), error=why[:500])
        return
    log.info("config reloaded (constraints and governor applied)%s",
             f"; changes to {', '.join(restart)} need a restart" if restart else "")
    d.event("config_reloaded", "info", needs_restart=restart)


__all__ = ["HANDLERS", "RESTART_SECTIONS", "RETRY_COMMANDS", "CommandHost", "drain", "handle",
           "reload"]
