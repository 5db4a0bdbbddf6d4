"""`edgerun fleet enroll`: a device's (or coordinator's) broker identity and keys, in one step.

For a device D of fleet F it
  1. enrols broker user `F/D` with a random password in the broker directory (Mosquitto's
     `passwd` and `acl` files, see runtime/wire/brokerauth.py),
  2. makes the device's Ed25519 key pair (replies to commands are signed with it): the private
     key stays in the device's output directory, the public key goes to the coordinator's
     `device_keys` directory as `<device>.pub`,
  3. writes the device's `[telemetry]` config section (`telemetry.toml`) naming those files.
Mosquitto reads the changed files on SIGHUP (`systemctl reload mosquitto`); the command prints
that step rather than signalling a broker it may not own.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from runtime.wire import commands
from runtime.wire.brokerauth import BrokerAuth, Identity, device_username, write_secret
from runtime.wire.ha_discovery import config_topics

RELOAD_HINT = ("reload the broker so it reads the new password/ACL files: "
               "`sudo systemctl reload mosquitto` (or `kill -HUP <mosquitto pid>`)")


@dataclass(frozen=True)
class Enrolled:
    """What enrolment wrote, for the operator (every path absolute)."""

    username: str
    files: dict[str, str]  # role of the file -> path
    config: str  # the TOML section written to files["config"]


def _toml(value: object) -> str:
    # TOML basic strings share JSON's escapes for everything a path or name can hold
    return json.dumps(value)


def enroll_device(fleet: str, device: str, broker_dir: str | Path, out_dir: str | Path,
                  device_keys: str | Path, host: str = "127.0.0.1", port: int = 1883,
                  install_dir: str | Path | None = None, command_key: str | Path | None = None,
                  read: tuple[str, ...] = (), homeassistant: str = "") -> Enrolled:
    """Enrol device `device` of `fleet` (see module docstring). `install_dir` is where the
    device's files will live on the device (default: `out_dir`); `command_key` is the
    coordinator's command-signing public key, copied and listed in `trusted_keys`; `read`
    are extra topic filters the device may receive (an MQTT trigger source's topic);
    `homeassistant` is a discovery prefix the device may publish its Home Assistant discovery
    configs under (docs/homeassistant.md), empty for none."""
    username = device_username(fleet, device)  # validates both names first
    out = Path(out_dir).expanduser().resolve()
    keys_dir = Path(device_keys).expanduser().resolve()
    where = Path(install_dir).expanduser() if install_dir else out
    out.mkdir(parents=True, exist_ok=True)
    keys_dir.mkdir(parents=True, exist_ok=True)
    write = config_topics(homeassistant, fleet, device) if homeassistant else ()
    password = BrokerAuth(broker_dir).enrol(Identity(username, "device", read=read, write=write))
    write_secret(out / "broker.password", password)
    commands.generate_keypair(out / "device.key", out / "device.pub")
    shutil.copyfile(out / "device.pub", keys_dir / f"{device}.pub")
    trusted = []
    if command_key:
        shutil.copyfile(Path(command_key).expanduser(), out / "command.pub")
        commands.load_public_keys([str(out / "command.pub")])  # refuse a bad key now
        trusted.append(str(where / "command.pub"))
    config = (f"[telemetry]\nfleet = {_toml(fleet)}\ndevice = {_toml(device)}\n"
              f"device_key = {_toml(str(where / 'device.key'))}\n"
              f"trusted_keys = {json.dumps(trusted)}\n\n"
              f"[telemetry.broker]\nhost = {_toml(host)}\nport = {int(port)}\n"
              f"username = {_toml(username)}\n"
              f"password_file = {_toml(str(where / 'broker.password'))}\n")
    (out / "telemetry.toml").write_text(config)
    return Enrolled(username, {
        "config": str(out / "telemetry.toml"), "password": str(out / "broker.password"),
        "device_key": str(out / "device.key"), "device_pub": str(keys_dir / f"{device}.pub"),
        "passwd": str(BrokerAuth(broker_dir).passwd), "acl": str(BrokerAuth(broker_dir).acl)},
        config)


def enroll_coordinator(name: str, fleet: str, broker_dir: str | Path, out_dir: str | Path,
                       host: str = "127.0.0.1", port: int = 1883,
                       install_dir: str | Path | None = None,
                       device_keys: str | Path | None = None) -> Enrolled:
    """Enrol a coordinator identity `name` for `fleet` (ack and command every device of it,
    read all of its traffic) and write its `[coordinator]` section."""
    out = Path(out_dir).expanduser().resolve()
    where = Path(install_dir).expanduser() if install_dir else out
    out.mkdir(parents=True, exist_ok=True)
    password = BrokerAuth(broker_dir).enrol(Identity(name, "coordinator", fleets=(fleet,)))
    write_secret(out / "broker.password", password)
    keys = f"device_keys = {_toml(str(Path(device_keys).expanduser().resolve()))}\n" \
        if device_keys else ""
    config = (f"[coordinator]\nfleet = {_toml(fleet)}\n{keys}\n"
              f"[coordinator.broker]\nhost = {_toml(host)}\nport = {int(port)}\n"
              f"username = {_toml(name)}\n"
              f"password_file = {_toml(str(where / 'broker.password'))}\n")
    (out / "coordinator.toml").write_text(config)
    return Enrolled(name, {"config": str(out / "coordinator.toml"),
                           "password": str(out / "broker.password"),
                           "passwd": str(BrokerAuth(broker_dir).passwd),
                           "acl": str(BrokerAuth(broker_dir).acl)}, config)


def enroll_client(name: str, broker_dir: str | Path, out_dir: str | Path,
                  read: tuple[str, ...] = (), write: tuple[str, ...] = ()) -> Enrolled:
    """Enrol another client (a camera publishing MQTT triggers, a dashboard) with exactly the
    topics given; writes its password file."""
    out = Path(out_dir).expanduser().resolve()
    password = BrokerAuth(broker_dir).enrol(Identity(name, "client", read=read, write=write))
    write_secret(out / "broker.password", password)
    return Enrolled(name, {"password": str(out / "broker.password"),
                           "passwd": str(BrokerAuth(broker_dir).passwd),
                           "acl": str(BrokerAuth(broker_dir).acl)},
                    f"# {name}: read {list(read)}, write {list(write)}\n")


def refresh_acl(broker_dir: str | Path) -> str:
    """`edgerun fleet acl --broker-dir D`: regenerate the ACL of a broker directory from its
    identities when it differs (an older version's file lacks topics added since); what was
    done, for the operator (run it after upgrading, or from the broker's unit:
    `ExecStartPre=`)."""
    auth = BrokerAuth(broker_dir)
    if not auth.registered():
        raise ValueError(f"{auth.dir}: no identities.json (not a broker directory made by "
                         "`edgerun fleet enroll`); nothing to regenerate")
    if auth.refresh_acl():
        return f"rewrote {auth.acl} from the enrolled identities; next: {RELOAD_HINT}"
    return f"{auth.acl} is up to date"
