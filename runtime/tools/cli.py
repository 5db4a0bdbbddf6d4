"""`edgerun demo` and `edgerun report`: the tools' commands."""

from __future__ import annotations

import argparse
from pathlib import Path

from runtime.cli_types import Subparsers


def cmd_demo(args: argparse.Namespace) -> int:
    """Broker, coordinator and daemon on the bundled model with a simulated hot device."""
    from runtime.tools.demo import run

    return run(duration_s=args.duration, device=args.device, scenario=args.scenario,
               speed=args.speed, start_hour=args.start_hour, rate=args.rate)


def cmd_report(args: argparse.Namespace) -> int:
    """Render one device's timeline (temperature and trips, rung, rate, latency, energy,
    battery) to PNG and optionally HTML, from the coordinator or the device's own state
    (docs/report.md). Needs matplotlib: pip install 'edgerun[report]'."""
    from runtime.tools.day_report import command

    return command(args)


def add_demo(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    """`edgerun demo`."""
    de = sub.add_parser("demo", help="everything on one machine, with a live view",
                        description=cmd_demo.__doc__,
                        parents=[common])
    # every default said in --help: a new user decides from it how long and how hot to run
    de.add_argument("--duration", type=float, default=0.0,
                    help="seconds to run, then stop (default: %(default)g, until Ctrl-C)")
    de.add_argument("--device", default="rpi5",
                    help="simulated device profile (default: %(default)s)")
    de.add_argument("--scenario", default="cabinet",
                    choices=("cool", "warm", "hot", "sun", "cabinet"),
                    help="the simulated weather and enclosure (default: %(default)s)")
    de.add_argument("--speed", type=float, default=480.0,
                    help="simulated seconds per second (default: %(default)g)")
    de.add_argument("--start-hour", type=float, default=10.0,
                    help="simulated time of day at the start (default: %(default)g)")
    de.add_argument("--rate", type=float, default=100.0,
                    help="conveyor frames per second (default: %(default)g)")
    de.set_defaults(func=cmd_demo)


def add_report(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    """`edgerun report DEVICE`."""
    rp = sub.add_parser("report", help="one device's day as PNG (and HTML): temperature, "
                        "rung, rate, latency, energy, battery", description=cmd_report.__doc__,
                        parents=[common])
    rp.add_argument("device", nargs="?", help="device id (default with --local: this box's)")
    rp.add_argument("--local", action="store_true", help="from this box's own state directory "
                    "(health-history.jsonl) instead of the coordinator")
    rp.add_argument("--state-dir", type=Path, help="(--local) the daemon's state_dir "
                    "(default: from --config)")
    rp.add_argument("--config", type=Path, help="the coordinator's config (API address and "
                    "token), or with --local the device's config (state_dir, device id)")
    rp.add_argument("--api", help="coordinator API base URL (default: from --config, else "
                    "http://127.0.0.1:8787)")
    rp.add_argument("--token-file", type=Path, help="the coordinator's API token file")
    rp.add_argument("--since", default="24h", help="start: 24h, 90m, 2d, epoch seconds or "
                    "ISO time (default 24h)")
    rp.add_argument("--until", help="end (default now), same forms as --since")
    rp.add_argument("--out", type=Path, help="PNG file (default DEVICE-report.png)")
    rp.add_argument("--html", type=Path, help="also write an HTML page (PNG embedded, a row "
                    "per hour)")
    rp.add_argument("--utc", action="store_true", help="times in UTC (default: local time)")
    rp.set_defaults(func=cmd_report)
