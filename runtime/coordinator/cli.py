"""`edgerun coordinator` and `edgerun fleet`: the coordinator and the commands that talk to it."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from runtime.cli_types import Subparsers
from runtime.config.schema import ConfigError, ConfigInvalid


def cmd_coordinator(args: argparse.Namespace) -> int:
    """Run the coordinator: store fleet results and health, ack, serve the API, send commands."""
    import signal
    import time

    from runtime import config as config_mod
    from runtime.coordinator.api import serve
    from runtime.coordinator.service import Coordinator

    cfg = config_mod.load(args.config).coordinator
    if not cfg.broker.host:
        raise ConfigInvalid(f"{args.config}: coordinator.broker.host is not set")
    from runtime.coordinator.api import ensure_token, token_path
    from runtime.coordinator.dialect import is_url
    from runtime.coordinator.store_open import StoreError, StoreRefused, emptied
    from runtime.coordinator.webhooks import SecretError

    # a store refused for what it holds exits as a refused config does (EX_CONFIG: the unit
    # stops, runtime/cli.py); one that may come right (disk full, server starting) is retried
    if not is_url(cfg.store) and (why := emptied(Path(cfg.store).expanduser(),
                                                 token_path(cfg))):
        raise ConfigInvalid(why)
    try:
        coordinator = Coordinator(cfg)
    except StoreRefused as e:  # names coordinator.store and the file; nothing was started
        raise ConfigInvalid(str(e)) from e
    except StoreError as e:
        raise ConfigError(str(e)) from e
    except SecretError as e:
        raise ConfigError(f"coordinator.webhook_secret_file: {e}") from e
    except ValueError as e:  # an unreadable signing key
        raise ConfigError(f"coordinator.signing_key: {e}") from e
    try:
        token = ensure_token(token_path(cfg))
    except OSError as e:  # unreadable, or readable by others (PermissionError)
        raise ConfigError(f"coordinator.api_token_file: {e}") from e
    _check_listen(cfg.http_host, cfg.http_port)
    coordinator.start()
    try:
        server = serve(coordinator, cfg.http_host, cfg.http_port, token=token)
    except OSError as e:  # taken since the check above
        coordinator.stop()
        raise ConfigError(f"coordinator.http_port: cannot listen on {cfg.http_host}:"
                          f"{cfg.http_port}: {e.strerror or e}") from e
    logging.getLogger("edgerun").info("coordinator API on http://%s:%d/api/v1/fleet, "
                                      "dashboard on / and Prometheus /metrics (token: %s)",
                                      *server.server_address[:2], token_path(cfg))
    # The handler only sets a flag: Event.set() in a handler can deadlock against the main
    # thread's own Event.wait (both take the same lock).
    stop: list = [False]  # the signal that asked the stop, once one did
    hup = [False]
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _: stop.__setitem__(0, signum))
    # SIGHUP's default action ends the process: a `kill -HUP` (or a reload habit) took the
    # fleet's coordinator down. It has no reload; say so and carry on.
    signal.signal(signal.SIGHUP, lambda *_: hup.__setitem__(0, True))
    while not stop[0]:
        time.sleep(0.1)
        if hup[0]:
            hup[0] = False
            logging.getLogger("edgerun").warning(
                "SIGHUP: the coordinator does not reload its config; still running with the "
                "one it started with (restart it to apply changes)")
    # Said, so a clean stop reads differently from a kill -9 or a crash in the log.
    log = logging.getLogger("edgerun")
    log.info("coordinator stopping (%s): closing the API, then the store and the broker "
             "session", signal.Signals(stop[0]).name)
    server.shutdown()
    coordinator.stop()
    log.info("coordinator stopped")
    return 0


def _check_listen(host: str, port: int) -> None:
    """ConfigError unless the API's address is free, checked before the coordinator logs in
    to the broker: a second coordinator started on a busy port (the service already running)
    took over the running one's MQTT session, then died with a traceback."""
    import socket

    if not port:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does
            s.bind(infos[0][4])
    except OSError as e:
        raise ConfigError(f"coordinator.http_port: cannot listen on {host}:{port}: "
                          f"{e.strerror or e} (is another coordinator running?); nothing was "
                          "started") from e


def cmd_fleet(args: argparse.Namespace) -> int:
    """Fleet views and commands through a coordinator's API."""
    if args.fleet_command == "enroll":
        return cmd_enroll(args)
    if args.fleet_command == "revoke":
        return cmd_revoke(args)
    if args.fleet_command == "acl":
        from runtime.coordinator.enroll import refresh_acl

        try:
            print(refresh_acl(args.broker_dir))
        except (ValueError, OSError) as e:
            print(f"edgerun fleet acl: {e}", file=sys.stderr)
            return 2
        return 0
    from runtime.coordinator.api_client import fleet_command

    return fleet_command(args)


def cmd_revoke(args: argparse.Namespace) -> int:
    """Remove a broker user (its password and ACL lines) from the broker directory."""
    from runtime.coordinator.enroll import RELOAD_HINT
    from runtime.wire.brokerauth import BrokerAuth, device_username

    name = args.name if args.role != "device" else device_username(args.fleet, args.name)
    if not BrokerAuth(args.broker_dir).remove(name):
        print(f"edgerun fleet revoke: no broker user {name!r} in {args.broker_dir}",
              file=sys.stderr)
        return 1
    print(f"revoked broker user {name!r}; next: {RELOAD_HINT} (Mosquitto then disconnects it)")
    return 0


def cmd_enroll(args: argparse.Namespace) -> int:
    """Make a device's (or coordinator's) broker credential, keys and config section."""
    from runtime.coordinator.enroll import (
        RELOAD_HINT,
        enroll_client,
        enroll_coordinator,
        enroll_device,
    )
    from runtime.wire.brokerauth import BrokerAuth

    # a mistyped --broker-dir began a new broker directory that no broker reads: the
    # credential printed never logged in, and nothing said why
    begun = not BrokerAuth(args.broker_dir).registered()
    try:
        if args.role == "client":
            done = enroll_client(args.name, args.broker_dir, args.out, tuple(args.read),
                                 tuple(args.write))
        elif args.role == "coordinator":
            done = enroll_coordinator(args.name, args.fleet, args.broker_dir, args.out,
                                      args.host, args.port, args.install_dir, args.device_keys)
        else:
            if not args.device_keys:
                print("edgerun fleet enroll: --device-keys DIR (the coordinator's "
                      "coordinator.device_keys directory) is required for a device",
                      file=sys.stderr)
                return 2
            done = enroll_device(args.fleet, args.name, args.broker_dir, args.out,
                                 args.device_keys, args.host, args.port, args.install_dir,
                                 args.command_key, tuple(args.read), args.homeassistant)
    except (ValueError, OSError) as e:
        print(f"edgerun fleet enroll: {e}", file=sys.stderr)
        return 2
    print(f"enrolled broker user {done.username!r}")
    if begun:
        print(f"edgerun fleet enroll: {args.broker_dir} held no enrolled identity: a new "
              "broker directory was begun there. The broker reads it only where its "
              f"mosquitto.conf says `password_file {args.broker_dir}/passwd` and `acl_file "
              f"{args.broker_dir}/acl`: where --broker-dir is mistyped, enroll again in "
              "the broker's directory", file=sys.stderr)
    for what, path in done.files.items():
        print(f"  {what:<10} {path}")
    print(f"\n{done.config}\nnext: {RELOAD_HINT}; copy the files in {args.out} to the "
          + args.role + " (keep the secrets there 0600)")
    return 0


def _fleet_options(p: argparse.ArgumentParser, default: object) -> None:
    """The fleet views' options; `default` None on `fleet` itself, SUPPRESS on its actions
    (see add_fleet)."""
    def d(value: object) -> object:
        return value if default is None else default

    p.add_argument("--api", default=d(None), help="coordinator API base URL (default: from "
                   "--config, else http://127.0.0.1:8787)")
    p.add_argument("--token-file", type=Path, default=d(None), help="the coordinator's API "
                   "token file (default: from --config, else $EDGERUN_API_TOKEN_FILE, else "
                   "~/.local/state/edgerun/api-token)")
    p.add_argument("--config", type=Path, default=d(None), help="the coordinator's config: "
                   "API address and token file")
    p.add_argument("--json", action="store_true", default=d(False), help="print the raw JSON")


def add_coordinator(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    """`edgerun coordinator --config C`."""
    co = sub.add_parser("coordinator", help="run the fleet coordinator",
                        description=cmd_coordinator.__doc__,
                        parents=[common])
    co.add_argument("--config", type=Path, required=True)
    co.set_defaults(func=cmd_coordinator)


def add_fleet(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    """`edgerun fleet ACTION`: the API's views and commands, enrolment, revocation."""
    fl = sub.add_parser("fleet", help="fleet views and commands (via the coordinator API)",
                        description=cmd_fleet.__doc__,
                        parents=[common])
    _fleet_options(fl, None)
    fleet_opts = argparse.ArgumentParser(add_help=False)  # the same, after the action
    _fleet_options(fleet_opts, argparse.SUPPRESS)
    fsub = fl.add_subparsers(dest="fleet_command", required=True, metavar="ACTION")
    fsub.add_parser("ls", help="every device with status and alerts",
                    parents=[common, fleet_opts])
    fs = fsub.add_parser("show", help="one device in detail",
                         parents=[common, fleet_opts])
    fs.add_argument("device")
    fc = fsub.add_parser("send", help="send a signed command and print the reply",
                         parents=[common, fleet_opts])
    fc.add_argument("device")
    fc.add_argument("cmd", help="ping, rebirth, reprofile, set_latency_target ms=20, "
                    "set_accuracy_floor value=0.9, set_rate fps=5, choose_model name=N")
    fc.add_argument("kv", nargs="*", metavar="ARG=VALUE")
    fc.add_argument("--wait", type=float, default=10.0, help="seconds to wait for the reply")
    fd = fsub.add_parser("deploy", help="roll a model bundle out to a group (canary first)",
                         parents=[common, fleet_opts])
    fd.add_argument("bundle", help="a bundle file (uploaded) or NAME@VERSION already held")
    fd.add_argument("--to", required=True, help="a device group, or `all`")
    fd.add_argument("--canary", default="10%", help="share of the group that gets it first "
                    "(0%% or 100%%: all at once)")
    fd.add_argument("--wait", type=float, default=0.0, help="follow the rollout this many "
                    "seconds (exit 1 when it halts; through a coordinator restart it keeps "
                    "following, and exits 2 when the coordinator still does not answer at "
                    "the end)")
    fg = fsub.add_parser("group", help="put devices in a group", parents=[common, fleet_opts])
    fg.add_argument("group")
    fg.add_argument("devices", nargs="+")
    fo = fsub.add_parser("rollouts", help="rollouts and their devices' states",
                         parents=[common, fleet_opts])
    fo.add_argument("id", nargs="?")
    from runtime.coordinator.api_client import add_bundles_parser

    add_bundles_parser(fsub, [common, fleet_opts])
    fe = fsub.add_parser("enroll", help="make a device's broker credential, keys and config",
                         description=cmd_enroll.__doc__,
                         parents=[common])
    fe.add_argument("name", help="device id (or coordinator name with --role coordinator)")
    fe.add_argument("--fleet", default="default")
    fe.add_argument("--role", choices=("device", "coordinator", "client"), default="device",
                    help="client: only the --read/--write topics (e.g. a camera's trigger)")
    fe.add_argument("--broker-dir", type=Path, required=True,
                    help="directory of the broker's passwd/acl files (mosquitto.conf: "
                    "password_file DIR/passwd, acl_file DIR/acl)")
    fe.add_argument("--out", type=Path, required=True,
                    help="where to write the credential, keys and config section")
    fe.add_argument("--device-keys", type=Path,
                    help="the coordinator's device_keys directory (gets <device>.pub)")
    fe.add_argument("--host", default="127.0.0.1", help="broker host for the config section")
    fe.add_argument("--port", type=int, default=1883, help="broker port for the config section")
    fe.add_argument("--install-dir", type=Path,
                    help="where the files will live on the target (default: --out)")
    fe.add_argument("--command-key", type=Path,
                    help="the coordinator's command-signing public key (trusted_keys)")
    fe.add_argument("--read", action="append", default=[], metavar="TOPIC",
                    help="extra topic the device may receive (an MQTT trigger topic)")
    fe.add_argument("--homeassistant", nargs="?", const="homeassistant", default="",
                    metavar="PREFIX", help="(device) allow publishing Home Assistant discovery "
                    "configs under PREFIX (default homeassistant; docs/homeassistant.md)")
    fe.add_argument("--write", action="append", default=[], metavar="TOPIC",
                    help="(--role client) topic it may publish")
    fr = fsub.add_parser("revoke", help="remove a device's (or coordinator's) broker user",
                         description=cmd_revoke.__doc__,
                         parents=[common])
    fr.add_argument("name", help="device id (or coordinator name with --role coordinator)")
    fr.add_argument("--fleet", default="default")
    fr.add_argument("--role", choices=("device", "coordinator", "client"), default="device")
    fr.add_argument("--broker-dir", type=Path, required=True)
    fa = fsub.add_parser("acl", help="regenerate the broker ACL from the enrolled identities "
                         "when an older version wrote it", parents=[common])
    fa.add_argument("--broker-dir", type=Path, required=True)
    fl.set_defaults(func=cmd_fleet)
