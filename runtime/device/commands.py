"""The daemon's answer to each verified command (the publisher already replied "accepted"):
one handler per command name, in a table (`HANDLERS`); and to SIGHUP (`reload`). A handler
acts on what is served (runtime/device/serving.py) and the model versions (runtime/device/
ota.py), never on the daemon.

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
from typing import TYPE_CHECKING, Any

from runtime.config import ConfigError, load
from runtime.wire.commands import Command, CommandRefused, check_args, loggable

if TYPE_CHECKING:
    from runtime.device.ota import DeviceOta
    from runtime.device.serving import Serving

log = logging.getLogger("edgerun.daemon")

# Commands after which a variant switch in backoff is tried again at once: the ones that may
# have mended what would not load (files measured or replaced). Any command did, so a stream of
# settings commands (a dashboard slider, a script) loaded the broken file, and said so, at each.
RETRY_COMMANDS = frozenset({"reprofile", "deploy", "choose_model"})
RESTART_SECTIONS = ("device", "model", "source", "sources", "telemetry", "simulator", "daemon",
                    "backends", "profiler", "results", "local_api", "homeassistant", "sleep",
                    "models")  # what a reload cannot apply: their changes need a restart


Handler = Callable[["Serving", "DeviceOta", Command], bool]


def _constraint(field: str, arg: str) -> Handler:
    def apply(s: Serving, ota: DeviceOta, cmd: Command) -> bool:
        s.set_constraints(replace(s.cfg.constraints, **{field: cmd.args[arg]}))
        return True

    apply.__doc__ = f"`[constraints] {field}` from the command's `{arg}`."
    return apply


def set_rate(s: Serving, ota: DeviceOta, cmd: Command) -> bool:
    """The operator's rate cap (0 = none); kept across restarts."""
    s.operator.set_rate(cmd.args["fps"], s.cstate.energy)
    return True


def reprofile(s: Serving, ota: DeviceOta, cmd: Command) -> bool:
    """Measure every variant again, now."""
    s.reprofile_now("operator command")
    return True


def _swaps_model(s: Serving, cmd: Command) -> None:
    """deploy and choose_model swap the [model] section's model: refused when no source
    uses it (it would change nothing)."""
    if not s.plan.model_used():
        raise ValueError(f"{cmd.name} swaps the [model] section's model, and no source uses "
                         "it: every [[sources]] entry names its own model, which cannot be "
                         "swapped over the air yet (change the config and restart)")


def deploy(s: Serving, ota: DeviceOta, cmd: Command) -> bool:
    """Download, verify and profile a bundle; the main loop swaps it in (runtime/device/ota.py)."""
    _swaps_model(s, cmd)
    ota.deploy(cmd)
    return True


def choose_model(s: Serving, ota: DeviceOta, cmd: Command) -> bool:
    """A version in the model store (profiled, swapped, on probation), or else a model
    directory next to the configured one; False (not applied) when there is none."""
    _swaps_model(s, cmd)
    if ota.choose(cmd):
        return True
    target = (ota.configured or s.box.model.manifest.root).parent / cmd.args["name"]
    if not (target / "manifest.json").is_file():
        s.event("command_failed", "warning", command=cmd.name,
                error=f"{target}: no model directory with a manifest")
        return False
    s.load_in_background(target, False, f"model {cmd.args['name']} chosen", wait=True)
    return True


def set_latency_target(s: Serving, ota: DeviceOta, cmd: Command) -> bool:
    """The latency target in force from the command's `ms` (Constraints.with_target):
    `[constraints] end_to_end_ms` when the device judges frames end to end, else
    `latency_ms` (changing the inference bound there would change nothing the operator
    sees)."""
    s.set_constraints(s.cfg.constraints.with_target(cmd.args["ms"]))
    return True


HANDLERS: dict[str, Handler] = {
    "set_latency_target": set_latency_target,
    "set_accuracy_floor": _constraint("accuracy_floor", "value"),
    "set_rate": set_rate,
    "reprofile": reprofile,
    "deploy": deploy,
    "choose_model": choose_model,
}


def handle(s: Serving, ota: DeviceOta, cmd: Command) -> None:
    """Apply a verified command; raises (ValueError) when it cannot be applied."""
    # the one gate (runtime/wire/commands.check_args), again here: no handler sees a command
    # whose arguments it did not pass, whoever made the Command
    try:
        cmd = replace(cmd, args=check_args(cmd.name, cmd.args))
    except CommandRefused as e:
        raise ValueError(str(e)) from None
    log.info("command %s %s", cmd.name, loggable(cmd.args))
    if cmd.name in RETRY_COMMANDS:  # a failing switch is tried again at once
        s.switch.retry_now()
    handler = HANDLERS.get(cmd.name)
    if handler is not None and not handler(s, ota, cmd):
        return
    s.operator.record(cmd.name, cmd.args)  # settings: kept across restarts and reloads
    s.event("command_applied", "info", command=cmd.name,
            args=loggable(cmd.args), id=cmd.id)


def drain(s: Serving, ota: DeviceOta, waiting: queue.Queue[Command]) -> None:
    """Apply every command waiting (the main loop's turn); one that fails is logged and
    reported (`command_failed`): a command must never take the daemon down."""
    while True:
        try:
            cmd = waiting.get_nowait()
        except queue.Empty:
            return
        try:
            handle(s, ota, cmd)
        except Exception as e:
            log.error("command %s failed: %s", cmd.name, e)
            s.event("command_failed", "warning", command=cmd.name, error=str(e)[:300])


def reload(s: Serving, path: Path | None, print_results: bool) -> None:
    """SIGHUP: re-read the config at `path` and apply constraints and governor (the operator's
    settings on top; `print_results`: `serve --print` outlives reloads, as settings do). Any
    failure, of any kind, is logged and reported (`config_reload_failed`) and the old config
    stays. Without a config file (`path` None) there is nothing to reload."""
    if path is None:
        log.warning("SIGHUP without --config: nothing to reload")
        return
    old = s.cfg
    s.switch.retry_now()  # a new config: a failing switch is tried again at once
    try:
        new = load(path)
        overridden = _overridden(new.constraints, s.operator.settings)
        new = replace(new, constraints=s.operator.constraints(new.constraints))
        if print_results:
            new = replace(new, results=replace(new.results, print=True))
        restart = [k for k in RESTART_SECTIONS if getattr(new, k) != getattr(old, k)]
        s.set_constraints(new.constraints, "config reloaded", new.governor)
    except Exception as e:  # ConfigError, NoVariantError (as ValueError), or anything else
        if s.cfg is not old:  # failed half-way through applying: back to the old one
            s.restore(old)
        expected = isinstance(e, ConfigError | ValueError)
        why = str(e) if expected else f"{type(e).__name__}: {e}"
        log.error("config reload refused, still running with the previous config: %s", why,
                  exc_info=not expected)  # an unexpected one is a bug: keep its traceback
        s.event("config_reload_failed", "warning", path=str(path), error=why[:500])
        return
    # an operator's setting outlives the file's value (docs/ota.md): an edit it hides would
    # read as applied while the old target stays in force
    hidden = "".join(
        f"; constraints.{k} = {_num(v['file'])} in the file is overridden by the operator's "
        f"{_SETTING_COMMAND[k]} {v['in_force']:g} (kept in {s.operator.settings_file}; send "
        f"{_SETTING_COMMAND[k]} to change it)" for k, v in overridden.items())
    log.info("config reloaded (constraints and governor applied)%s%s",
             f"; changes to {', '.join(restart)} need a restart" if restart else "", hidden)
    s.event("config_reloaded", "info", needs_restart=restart,
            **({"overridden": overridden} if overridden else {}))


def _num(v: float | None) -> str:
    return "unset" if v is None else f"{v:g}"


_SETTING_COMMAND = {"latency_ms": "set_latency_target", "accuracy_floor": "set_accuracy_floor"}


def _overridden(file_c: Any, settings: dict[str, float]) -> dict[str, dict[str, float | None]]:
    """The operator's settings that differ from the file's constraints `file_c`, by setting:
    {"file": the file's value, "in_force": the setting's}. `latency_ms` is the target in force
    (`end_to_end_ms` where the file judges frames end to end), as set_latency_target sets it."""
    out: dict[str, dict[str, float | None]] = {}
    for key, value in settings.items():
        mine = file_c.in_force()[0] if key == "latency_ms" else getattr(file_c, key)
        if mine != value:
            out[key] = {"file": mine, "in_force": value}
    return out


__all__ = ["HANDLERS", "RESTART_SECTIONS", "RETRY_COMMANDS", "drain", "handle", "reload"]
