"""`edgerun schemas` and `edgerun keys`: the wire contract's commands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from runtime import journal
from runtime.cli_types import Subparsers


def cmd_schemas(args: argparse.Namespace) -> int:
    """Print the MQTT payload JSON Schemas (v1), keyed by message kind."""
    from runtime.wire.payloads import SCHEMAS

    print(json.dumps(SCHEMAS, indent=2))
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """Make an Ed25519 key pair for signing commands (private key mode 0600). An existing key
    file is never replaced without --force: the devices trusting it would refuse every
    command signed by the new one."""
    from runtime.wire.commands import generate_keypair

    existing = [str(f) for f in (args.private, args.public) if f.exists() or f.is_symlink()]
    if existing and not args.force:
        verb = "exists" if len(existing) == 1 else "exist"
        print(journal.error_line(
            f"edgerun keys: {' and '.join(existing)} already {verb}; refusing to overwrite "
            "(devices that trust the old key would refuse commands signed by a new one). "
            "Pass --force to replace it."), file=sys.stderr)
        return 2
    try:
        kid = generate_keypair(args.private, args.public, overwrite=args.force)
    except FileExistsError as e:  # appeared since the check above
        print(journal.error_line(f"edgerun keys: {e.filename} already exists; refusing to "
                                 "overwrite it (pass --force to replace it)"), file=sys.stderr)
        return 2
    print(f"key {kid}: private {args.private} (keep on the coordinator), "
          f"public {args.public} (list in telemetry.trusted_keys on devices)")
    return 0


def add_schemas(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    """`edgerun schemas`."""
    sc = sub.add_parser("schemas", help="print the MQTT payload JSON Schemas",
                        description=cmd_schemas.__doc__,
                        parents=[common])
    sc.set_defaults(func=cmd_schemas)


def add_keys(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    """`edgerun keys --private P --public Q`."""
    ky = sub.add_parser("keys", help="make an Ed25519 command-signing key pair",
                        description=cmd_keys.__doc__,
                        parents=[common])
    ky.add_argument("--private", type=Path, required=True)
    ky.add_argument("--public", type=Path, required=True)
    ky.add_argument("--force", action="store_true",
                    help="replace existing key files (devices trusting the old key will "
                    "refuse commands signed by the new one)")
    ky.set_defaults(func=cmd_keys)
