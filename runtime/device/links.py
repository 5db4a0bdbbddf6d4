"""The daemon's links to the world beside the outbox, each made from its config section and
the few collaborators it needs: MQTT (the publisher, with Home Assistant discovery), the
Sparkplug B edge node and the PLC servers ([opcua], [modbus]). Made at start-up, before the
minutes of profiling, so a bad key or certificate file fails first (ConfigError naming it).

An optional integration's module is imported only when its section is enabled: protobuf and
the Sparkplug schema cost ~3 MB resident, asyncua more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.config import Config, ConfigError
from runtime.device.state import DeviceState
from runtime.device.status import birth, ha_info
from runtime.telemetry.homeassistant import Discovery
from runtime.telemetry.publisher import Publisher

log = logging.getLogger("edgerun.daemon")


def open_plc(cfg: Config) -> Any:
    """The PLC servers ([opcua], [modbus]; docs/plc.md), certificates read now; None when
    neither is enabled. Raises ValueError naming a file asyncua refuses, ImportError when
    the extra is not installed."""
    if not (cfg.opcua.enabled or cfg.modbus.enabled):
        return None
    from runtime.telemetry.plc import open_plc as open_servers

    return open_servers(cfg)


def open_publisher(cfg: Config, outbox: Any, state_dir: Path, device_id: str,
                   state: Callable[[], DeviceState | None], precheck: Callable[..., Any],
                   commands: Any, clock: Any) -> Publisher | None:
    """The MQTT publisher (None: no `[telemetry.broker] host`): it drains `outbox`, births
    and Home Assistant's configs are made from the latest snapshot (`state()`), `precheck`
    answers a command before it is accepted (runtime.device.ota.DeviceOta.precheck), verified
    commands go on `commands` (a queue the main loop drains). Raises ConfigError naming an
    unreadable key file."""
    if not cfg.telemetry.broker.host:
        return None
    try:
        ha = Discovery(cfg.homeassistant, cfg.telemetry.fleet, device_id, state_dir,
                       lambda: ha_info(state()), cfg.telemetry.result_per_message)
        return Publisher(cfg.telemetry, outbox, lambda: birth(state()), state_dir=state_dir,
                         homeassistant=ha, session_expiry_s=(cfg.sleep.session_expiry_s
                                                             if cfg.sleep.enabled else 0),
                         precheck=precheck, command_queue=commands, clock=clock)
    except ValueError as e:  # an unreadable trusted key or device key file
        raise ConfigError(str(e)) from e


def open_sparkplug(cfg: Config, device_id: str, outbox: Any, state_dir: Path,
                   event: Callable[..., None]) -> Any:
    """The Sparkplug B edge node ([sparkplug], docs/sparkplug.md; None: off or no broker),
    fed the health snapshots; its triggers are the sources that name one."""
    if not (cfg.sparkplug.enabled and cfg.telemetry.broker.host):
        return None
    from runtime.telemetry.sparkplug.node import sparkplug_node

    return sparkplug_node(cfg.sparkplug, cfg.telemetry, device_id, outbox, state_dir, event,
                          [s.name or "main" for s in cfg.sources or (cfg.source,) if s.trigger])


def say_unpublished(cfg: Config) -> None:
    """Without a broker: results stay in the outbox, and what needs one is said not to run."""
    log.info("no telemetry.broker.host: results are kept in the outbox only")
    if (cfg.homeassistant.enabled or cfg.telemetry.result_per_message
            or cfg.sparkplug.enabled):
        log.warning("homeassistant.enabled / telemetry.result_per_message / "
                    "sparkplug.enabled need a broker "
                    "(telemetry.broker.host); nothing is published")
