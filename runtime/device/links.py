"""The daemon's links to the world, one object (`Links`): the outbox, the one durable home of
results, health and events on the device (each goes in stamped with the clock's state,
runtime/wire/clock.py); local results; the local API; the PLC servers ([opcua], [modbus]);
MQTT with Home Assistant discovery; the Sparkplug B edge node; the health history `edgerun
report` reads offline.

Opened in the daemon's start-up order, before the minutes of profiling, so a bad key or
certificate file fails first (ConfigError naming it); started once the pipeline runs; taken
down in runtime/device/shutdown.py's order. An optional integration's module is imported only
when its section is enabled (prometheus_client ~8 MB resident, protobuf and the Sparkplug
schema ~3 MB, asyncua more).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.config import Config, ConfigError
from runtime.device.status import birth, ha_info
from runtime.frames.results_local import LocalResults
from runtime.telemetry.homeassistant import Discovery
from runtime.telemetry.outbox import Outbox
from runtime.telemetry.publisher import Publisher, device_id
from runtime.wire import clock as wire_clock
from runtime.wire.health_history import HealthHistory

log = logging.getLogger("edgerun.daemon")


class Links:
    """The links of one daemon (module doc). `event(type, severity, **fields)`: the daemon's
    sink, which every event goes through (`record` is what it does)."""

    def __init__(self, cfg: Config, state_dir: Path, clock: wire_clock.Clock,
                 event: Callable[..., None]):
        self.cfg, self.state_dir, self.clock, self.event = cfg, state_dir, clock, event
        self.outbox: Outbox | None = None
        self.device_id = ""  # the telemetry client id
        self.local: LocalResults | None = None  # [results]: print, JSONL, snapshots
        self.local_api: Any = None  # runtime.device.local_api.LocalApi ([local_api]: opt-in)
        self.plc: Any = None  # runtime.telemetry.plc.PlcServers ([opcua], [modbus]; docs/plc.md)
        self.publisher: Publisher | None = None
        self.sparkplug: Any = None  # runtime.telemetry.sparkplug.node.SparkplugNode
        # for `edgerun report` when offline; written whole pages every history_flush_s
        self.history = HealthHistory(state_dir, flush_s=cfg.storage.history_flush_s)

    # -- events and results ---------------------------------------------------------------

    def record(self, type_: str, severity: str = "info", **fields: Any) -> None:
        """Put an event for the operator in the outbox, stamped with the clock's state."""
        status, r = self.clock.now()
        ev = {"v": 1, "t": r.wall, "type": type_, "severity": severity, **fields,
              "clk": wire_clock.stamp(status, r)}
        try:
            self.outbox.put("event", ev)
        except Exception as e:  # the outbox itself failing is logged, never raised here
            log.error("could not queue event %s: %s", type_, e)

    def stamped(self, results: list[dict]) -> list[int]:
        """Store results, each stamped with the clock's state at its capture
        (runtime/wire/clock.py: the coordinator places unsynced ones once the clock is)."""
        status, r = self.clock.now()
        wire_clock.stamp_each(results, wire_clock.stamp(status, r), r.wall)
        return self.outbox.append_many(results)

    def event_of(self, ev: dict) -> None:
        """An event a part made whole (the outbox's, the pipeline's, local results')."""
        self.event(ev.pop("type"), ev.pop("severity", "warning"), **ev)

    def sink(self) -> Callable[[list[dict]], list[int]]:
        """Where the pipeline stores its results: the outbox, through the PLC servers' tap
        when they run (the last verdicts)."""
        return self.plc.tap(self.stamped) if self.plc else self.stamped

    def send_health(self, h: dict[str, Any], trips: dict[str, float]) -> None:
        """A health message out: the outbox, Sparkplug (births and NDATA are made from it),
        the offline history."""
        self.outbox.put("health", h)
        if self.sparkplug:
            self.sparkplug.feed(h)
        self.history.append(h, trips)

    # -- start-up, in the daemon's order ---------------------------------------------------

    def open_outbox(self) -> None:
        """The outbox, and the events that waited for it (its own start-up's)."""
        self.outbox = Outbox(self.cfg.telemetry.outbox, on_event=self.event_of)
        while (ev := self.outbox.take_startup_event()) is not None:
            # the start-up event may carry its severity (a disk full at start: held.py's)
            self.event(ev.pop("type"), ev.pop("severity", "critical"), **ev)

    def open_local_api(self, latest_health: Callable[[], Any],
                       alive: Callable[[], bool]) -> None:
        """The telemetry id, and the local API when configured: up during profiling, 503
        until the pipeline runs (`alive`)."""
        cfg = self.cfg
        self.device_id = device_id(cfg.telemetry)
        if cfg.local_api.port:
            from runtime.device.local_api import start_local_api

            self.local_api = start_local_api(cfg.local_api, latest_health, alive,
                                             self.device_id)

    def open_plc(self) -> Any:
        """The PLC servers, certificates read now; their edges for the sources' triggers
        (None: neither is enabled). Raises ValueError naming a file asyncua refuses,
        ImportError when the extra is not installed."""
        if not (self.cfg.opcua.enabled or self.cfg.modbus.enabled):
            return None
        from runtime.telemetry.plc import open_plc

        self.plc = open_plc(self.cfg)
        return self.plc.edges

    def open_mqtt(self, state: Callable[[], Any], precheck: Callable[..., Any],
                  commands: Any) -> None:
        """The publisher (none without `[telemetry.broker] host`) and Sparkplug: births and
        Home Assistant's configs are made from the latest snapshot (`state()`), `precheck`
        answers a command before it is accepted (runtime.device.ota.DeviceOta.precheck),
        verified commands go on `commands` (a queue the main loop drains). Raises
        ConfigError naming an unreadable key file."""
        cfg = self.cfg
        if not cfg.telemetry.broker.host:
            return
        try:
            ha = Discovery(cfg.homeassistant, cfg.telemetry.fleet, self.device_id,
                           self.state_dir, lambda: ha_info(state()),
                           cfg.telemetry.result_per_message)
            self.publisher = Publisher(cfg.telemetry, self.outbox, lambda: birth(state()),
                                       state_dir=self.state_dir, homeassistant=ha,
                                       session_expiry_s=(cfg.sleep.session_expiry_s
                                                         if cfg.sleep.enabled else 0),
                                       precheck=precheck, command_queue=commands,
                                       clock=self.clock)
        except ValueError as e:  # an unreadable trusted key or device key file
            raise ConfigError(str(e)) from e
        if cfg.sparkplug.enabled:
            from runtime.telemetry.sparkplug.node import sparkplug_node

            self.sparkplug = sparkplug_node(
                cfg.sparkplug, cfg.telemetry, self.device_id, self.outbox, self.state_dir,
                self.event, [s.name or "main" for s in cfg.sources or (cfg.source,) if s.trigger])

    def open_results(self) -> None:
        """Local results ([results]), fed each group the pipeline stores."""
        if self.cfg.results.enabled:
            self.local = LocalResults(self.cfg.results, self.event_of)
            self.local.start()

    def start(self, latest_health: Callable[[], Any]) -> None:
        """Sparkplug, the PLC servers (reading `latest_health`), MQTT; without a broker,
        results stay in the outbox and what needs one is said not to run."""
        if self.sparkplug:
            self.sparkplug.start()
        if self.plc:
            try:
                self.plc.start(latest_health)
            except ValueError as e:  # the port taken, a certificate asyncua refuses
                raise ConfigError(str(e)) from e
        if self.publisher:
            self.publisher.start()
            return
        log.info("no telemetry.broker.host: results are kept in the outbox only")
        cfg = self.cfg
        if (cfg.homeassistant.enabled or cfg.telemetry.result_per_message
                or cfg.sparkplug.enabled):
            log.warning("homeassistant.enabled / telemetry.result_per_message / "
                        "sparkplug.enabled need a broker "
                        "(telemetry.broker.host); nothing is published")
