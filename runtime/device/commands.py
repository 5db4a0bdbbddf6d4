"""The daemon's answer to each verified command (the publisher already replied "accepted"):
one handler per command name, in a table (`HANDLERS`).

A command not in the table (`ping`, `rebirth`: the publisher answers those itself) is only
recorded as applied. After any applied command the settings ones are kept across restarts and
reloads (runtime/device/operator_state.py), and a `command_applied` event says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from runtime.wire.commands import Command, loggable

log = logging.getLogger("edgerun.daemon")

# Commands after which a variant switch in backoff is tried again at once: the ones that may
# have mended what would not load (files measured or replaced). Any command did, so a stream of
# settings commands (a dashboard slider, a script) loaded the broken file, and said so, at each.
RETRY_COMMANDS = frozenset({"reprofile", "deploy", "choose_model"})


class CommandHost(Protocol):
    """What the handlers need of the daemon."""

    cfg: Any  # runtime.config.Config
    ota: Any  # runtime.device.ota.DeviceOta
    operator: Any  # runtime.device.operator_state.OperatorState
    cstate: Any  # power.control.ControlState

    @property
    def manifest(self) -> Any:
        """The [model] section's model now served."""
        ...

    def set_constraints(self, c: Any, why: str = "new constraints",
                        governor: Any = None) -> None:
        """Rebuild the ladders for new constraints (ValueError: none fits)."""

    def reprofile_now(self, why: str) -> None:
        """Measure the [model] again now, whenever the last re-profile was."""

    def model_used(self) -> bool:
        """Whether any source runs the [model] section's model."""
        ...

    def retry_switches_now(self) -> None:
        """Switches in backoff are tried again at once."""

    def load_in_background(self, path: Path, fresh: bool, why: str,
                           wait: bool = False) -> None:
        """Profile `path` in the background and install it."""

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
    if not d.model_used():
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
    target = (d.ota.configured or d.manifest.root).parent / cmd.args["name"]
    if not (target / "manifest.json").is_file():
        d.event("command_failed", "warning", command=cmd.name,
                error=f"{target}: no model directory with a manifest")
        return False
    d.load_in_background(target, False, f"model {cmd.args['name']} chosen", wait=True)
    return True


HANDLERS: dict[str, Callable[[CommandHost, Command], bool]] = {
    "set_latency_target": _constraint("latency_ms", "ms"),
    "set_accuracy_floor": _constraint("accuracy_floor", "value"),
    "set_rate": set_rate,
    "reprofile": reprofile,
    "deploy": deploy,
    "choose_model": choose_model,
}


def handle(d: CommandHost, cmd: Command) -> None:
    """Apply a verified command; raises (ValueError) when it cannot be applied."""
    log.info("command %s %s", cmd.name, loggable(cmd.args))
    if cmd.name in RETRY_COMMANDS:  # a failing switch is tried again at once
        d.retry_switches_now()
    handler = HANDLERS.get(cmd.name)
    if handler is not None and not handler(d, cmd):
        return
    d.operator.record(cmd.name, cmd.args)  # settings: kept across restarts and reloads
    d.event("command_applied", "info", command=cmd.name,
            args=loggable(cmd.args), id=cmd.id)


__all__ = ["HANDLERS", "RETRY_COMMANDS", "CommandHost", "handle"]
