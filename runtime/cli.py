"""The `edgerun` command line.

Each package's own `cli` module defines its commands and registers them (`add_*(sub,
common)`), as a Frigate detector plugin or a Home Assistant integration carries its own
setup; this file builds the top parser from the table below and runs the chosen command.
Importing it loads neither numpy nor cv2 (tests/test_layering.py): `serve` must hold SIGHUP
before anything slow is imported.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from runtime import __version__, cli_models, cli_profile, journal
from runtime.config.schema import ConfigError, ConfigInvalid
from runtime.coordinator import cli as coordinator_cli
from runtime.device import cli as device_cli
from runtime.tools import cli as tools_cli
from runtime.wire import cli as wire_cli

# Every command's registration, in the order `edgerun -h` lists them.
COMMANDS = (
    cli_profile.add_profile,
    device_cli.add_check,
    device_cli.add_serve,
    tools_cli.add_demo,
    cli_models.add_models,
    coordinator_cli.add_coordinator,
    coordinator_cli.add_fleet,
    tools_cli.add_report,
    wire_cli.add_schemas,
    wire_cli.add_keys,
)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every command."""
    p = argparse.ArgumentParser(prog="edgerun", description="Edge inference runtime.")
    p.add_argument("--version", action="version", version=f"edgerun {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    # Global options are accepted after the subcommand too (`edgerun serve --config X -v`,
    # `edgerun fleet ls --json`): every subparser repeats them with a SUPPRESSed default, so
    # an option given at any level sets the value and one not given leaves the outer default.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub, common)
    return p


# The services systemd restarts on failure: a config file they refuse exits with EX_CONFIG
# (78), which their units name in RestartPreventExitStatus, so a typo stops the unit (failed,
# the line in the journal) instead of a restart every 5 s for ever; every other refusal at
# start (a disk full, a port taken, a file not there yet) exits 2 and is retried.
SERVICES = (device_cli.cmd_serve, coordinator_cli.cmd_coordinator)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `edgerun` console script."""
    args = build_parser().parse_args(argv)
    if args.func is device_cli.cmd_serve:
        device_cli.hold_sighup()  # before the imports below: they load numpy and onnx
    elif args.func is coordinator_cli.cmd_coordinator:
        # its handler exists once the API serves (store opened, broker logged in to): a
        # SIGHUP before that ended it (the default action). It does not reload; a Python
        # handler (not SIG_IGN) so that no child inherits it
        import signal

        signal.signal(signal.SIGHUP, lambda *_: None)
    from runtime.choice.selector import NoVariantError
    from runtime.engine.onnx_model import ModelError

    if journal.setup(logging.DEBUG if args.verbose else logging.INFO):
        # An uncaught exception's traceback is a crash: filed at CRIT, every line of it.
        sys.excepthook = lambda t, v, tb: logging.getLogger("edgerun").critical(
            "uncaught exception, exiting", exc_info=(t, v, tb))
    try:
        return args.func(args)
    except (ConfigError, ModelError, NoVariantError) as e:
        print(journal.error_line(f"edgerun: {e}"), file=sys.stderr)
        if isinstance(e, ConfigInvalid) and args.func in SERVICES:
            return os.EX_CONFIG
        return 2


if __name__ == "__main__":
    sys.exit(main())
