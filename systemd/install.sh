#!/bin/sh
# Install edgerun as a service on Debian 12 / Raspberry Pi OS (docs/install.md): a venv under
# /opt/edgerun, the units pointing at it, the edgerun user, /etc/edgerun (a new config names
# the device profile the machine's device tree or DMI points at; --profile NAME to choose).
# Safe to re-run.
# Options: see `systemd/install.sh --help` (e.g. --enable, --extras demo, --prefix DIR).
set -eu
cd "$(dirname "$0")/.."
exec python3 -m runtime.tools.install "$@"
